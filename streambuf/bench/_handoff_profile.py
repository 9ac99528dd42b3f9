"""Where the time goes when samples cost nothing: streambuf's per-sample path in one
process against a plain fetch + ``default_collate`` loop (what a DataLoader worker runs).

64 KiB float32 samples, batch 32, no I/O: every microsecond is overhead. Rows: the plain
loop; ``Pipeline.map(fn).batch(32)`` without threads; with 1 and 8 map threads; each
with a fresh tensor per sample and with one cached tensor (no allocation). Then a
cProfile of the 8-thread case, sorted by own time. A profiling tool behind the
``latency 64KiB 0 ms`` headline row (not one of the ``streambuf bench`` comparisons);
run it on a quiet machine:

    python -m streambuf.bench._handoff_profile [--batches 300]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import default_collate

import streambuf as sb

ELEMS = 64 * 1024 // 4
CACHED = torch.zeros(ELEMS)

Make = Callable[[int], torch.Tensor]


def fresh(i: int) -> torch.Tensor:
    return torch.zeros(ELEMS)


def cached(i: int) -> torch.Tensor:
    return CACHED


def _us(run: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) / n * 1e6


def _plain(fn: Make, n: int) -> Callable[[], Any]:
    return lambda: [default_collate([fn(i) for i in range(32)]) for _ in range(n // 32)]


def _piped(fn: Make, n: int, threads: int | None) -> Callable[[], Any]:
    pipe = sb.Pipeline(range(n))
    pipe = pipe.map(fn) if threads is None else pipe.map(fn, threads=threads)
    batched = pipe.batch(32)
    return lambda: sum(1 for _ in batched)


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=300)
    n = ap.parse_args(argv).batches * 32
    rows: dict[str, Callable[[Make], Callable[[], Any]]] = {
        "plain fetch + default_collate": lambda fn: _plain(fn, n),
        "streambuf map, no threads": lambda fn: _piped(fn, n, None),
        "streambuf map(threads=1)": lambda fn: _piped(fn, n, 1),
        "streambuf map(threads=8)": lambda fn: _piped(fn, n, 8),
    }
    out = {name: (_us(make(fresh), n), _us(make(cached), n)) for name, make in rows.items()}
    print("| path | fresh tensor us/sample | cached tensor us/sample |\n|---|---|---|")
    for name, (a, b) in out.items():
        print(f"| {name} | {a:.1f} | {b:.1f} |")
    prof = cProfile.Profile()
    prof.enable()
    _piped(fresh, n, 8)()
    prof.disable()
    print("\ncProfile, streambuf map(threads=8), fresh tensors, by own time:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(10)
    return out


if __name__ == "__main__":
    main()
