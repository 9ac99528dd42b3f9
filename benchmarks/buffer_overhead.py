"""Items/s through BoundedBuffer vs queue.Queue, one producer thread and one consumer.

Measured in one run, interleaved (Queue, Buffer, Queue, Buffer, ...), medians quoted, so
that machine noise hits both sides alike. Writes JSON.

    python -m benchmarks.buffer_overhead [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from streambuf import BoundedBuffer

_STOP = object()


def _run_queue(items: list[Any], depth: int) -> float:
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)

    def produce() -> None:
        for x in items:
            q.put(x)
        q.put(_STOP)

    th = threading.Thread(target=produce, daemon=True)
    t0 = time.perf_counter()
    th.start()
    n = 0
    while q.get() is not _STOP:
        n += 1
    dt = time.perf_counter() - t0
    th.join(10)
    return n / dt


def _run_buffer(items: list[Any], depth: int) -> float:
    buf: BoundedBuffer[Any] = BoundedBuffer(max_items=depth, max_bytes="1GiB")

    def produce() -> None:
        for x in items:
            buf.put(x)
        buf.close()

    th = threading.Thread(target=produce, daemon=True)
    t0 = time.perf_counter()
    th.start()
    n = 0
    for _ in buf:
        n += 1
    dt = time.perf_counter() - t0
    th.join(10)
    return n / dt


def run(
    *, quick: bool = False, out: str | None = None, repeats: int | None = None
) -> dict[str, Any]:
    n_small = 20_000 if quick else 200_000
    n_tensor = 5_000 if quick else 50_000
    repeats = repeats or (3 if quick else 5)
    cases = {
        "ints": [int(i) for i in range(n_small)],
        "tensors_4KiB": [torch.empty(1024) for _ in range(64)] * (n_tensor // 64),
    }
    results: dict[str, Any] = {}
    for name, items in cases.items():
        q_rates, b_rates = [], []
        for _ in range(repeats):
            q_rates.append(_run_queue(items, 64))
            b_rates.append(_run_buffer(items, 64))
        q_med, b_med = statistics.median(q_rates), statistics.median(b_rates)
        results[name] = {
            "items": len(items),
            "queue_items_per_s": q_rates,
            "buffer_items_per_s": b_rates,
            "queue_median": q_med,
            "buffer_median": b_med,
            "ratio": b_med / q_med,
        }
    report = {
        "benchmark": "buffer_overhead",
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "repeats": repeats,
        "results": results,
    }
    print(f"{'case':<14}{'queue.Queue/s':>16}{'BoundedBuffer/s':>18}{'ratio':>8}")
    for name, r in results.items():
        print(
            f"{name:<14}{r['queue_median']:>16,.0f}{r['buffer_median']:>18,.0f}{r['ratio']:>8.2f}"
        )
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "buffer_overhead.json"
        path.write_text(json.dumps(report, indent=2))
        print(f"wrote {path}")
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results")
    a = p.parse_args(argv)
    run(quick=a.quick, out=a.out)


if __name__ == "__main__":
    main()
