"""Does ``threads="auto"`` hold when other processes take the CPUs, and do the defaults?

The seed workload (10 ms of sleep a sample, 3x224x224 float32, batch 32: the mission's
map-style ``BenchmarkDataset``) through, each in a fresh process:

* ``DataLoader(batch_size=32, num_workers=4, prefetch_factor=2)`` (the seed's loop);
* ``torchdata.nodes`` ``ParallelMapper`` with 32 threads (the strongest peer for
  latency-bound samples in one process);
* streambuf, 4 workers x 8 threads (the hand-set count to beat) and 4 workers x
  ``threads="auto"``;
* streambuf at its **defaults**: ``sb.Loader(sb.Pipeline.from_dataset(ds,
  threads="auto").batch(32))``, nothing else set;

and the 50 ms rows (64 KiB samples: torchdata.nodes 32 threads against streambuf
``"auto"`` within ``max_bytes`` = 64 MiB), at each *load*: nothing else running, then 1
and 2 processes spinning (``while True: pass``) beside the run: a training node's CPUs
are never idle. Loads and rows are interleaved and rotated, ``--repeats`` rounds;
medians quoted, with the ratios the targets name and the counts ``"auto"`` chose.

    python benchmarks/busy_defaults.py                 # 3 rounds, ~15 min on 2 cores
    python benchmarks/busy_defaults.py --loads 0 2 --repeats 1
    python benchmarks/busy_defaults.py --tiny          # seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from streambuf.bench._harness import run_config

RUNNER = "streambuf.bench.workloads:run_loader"
MIB = 1 << 20


def configs(tiny: bool) -> list[dict[str, Any]]:
    """The rows (one config each)."""
    shape = [3, 32, 32] if tiny else [3, 224, 224]
    batches = 6 if tiny else 40
    base = {
        "runner": RUNNER,
        "workload": "seed",
        "shape": shape,
        "latency_s": 0.010,
        "batch_size": 32,
        "batches": batches,
        "workers": 2 if tiny else 4,
        "pin_memory": True,
        "persistent_workers": True,
    }
    batch_bytes = 32 * 4 * math.prod(shape)
    fast = dict(base, batches=batches * (1 if tiny else 4))  # the threaded loaders: 4x
    sb = dict(
        fast,
        kind="streambuf",
        threads=8,
        max_batches=2 * base["workers"],
        max_bytes=math.ceil(4 / 3 * 2 * base["workers"] * batch_bytes),
    )
    rows = [
        dict(base, kind="dataloader", prefetch_factor=2, name="seed: DataLoader pf=2"),
        dict(fast, kind="torchdata", threads=32, prefetch_factor=2, name="seed: torchdata 32"),
        dict(sb, name="seed: streambuf 4x8"),
        dict(sb, threads="auto", name="seed: streambuf 4x auto"),
        dict(fast, kind="defaults", name="seed: streambuf defaults (from_dataset)"),
    ]
    if not tiny:
        slow = dict(fast, workload="64KiB 50 ms", shape=[16384], latency_s=0.050)
        rows += [
            dict(slow, kind="torchdata", threads=32, prefetch_factor=2, name="50 ms: torchdata 32"),
            dict(
                sb,
                **{k: slow[k] for k in ("workload", "shape", "latency_s")},
                threads="auto",
                max_bytes=64 * MIB,
                name="50 ms: streambuf 4x auto",
            ),
        ]
    return rows


class Spinners:
    """``n`` processes spinning on a CPU each, for the duration of a ``with`` block."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Spinners:
        self.procs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(self.n)
        ]
        time.sleep(0.5 if self.n else 0.0)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=10)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and b == b and a == a else "-"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tiny", action="store_true", help="a smoke run: seconds, no figures")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = ap.parse_args(argv)
    rows = configs(args.tiny)
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        loads = args.loads[r % len(args.loads) :] + args.loads[: r % len(args.loads)]
        for load in loads:
            with Spinners(load):
                for k in range(len(rows)):
                    cfg = rows[(k + r) % len(rows)]
                    got = run_config(cfg, isolate=not args.tiny)
                    runs.setdefault((load, cfg["name"]), []).append(got)
                    print(
                        f"round {r + 1} load {load} {cfg['name']}: "
                        f"{got['batches_per_s']:.1f} batches/s"
                        + (
                            f", threads {got['threads_chosen']}"
                            if got.get("threads_chosen")
                            else ""
                        ),
                        flush=True,
                    )

    def med(load: int, name: str, key: str = "batches_per_s") -> float:
        vals = [x[key] for x in runs.get((load, name), []) if isinstance(x.get(key), int | float)]
        return statistics.median(vals) if vals else float("nan")

    table = []
    print("\n| load | row | batches/s (median) | runs | auto chose |")
    print("|---|---|---|---|---|")
    for load in args.loads:
        for cfg in rows:
            name = cfg["name"]
            got = runs.get((load, name), [])
            chosen = [x.get("threads_chosen") for x in got if x.get("threads_chosen")]
            m = med(load, name)
            table.append({"load": load, "row": name, "median": m, "runs": got})
            print(
                f"| {load} | {name} | {m:.1f} | "
                + ", ".join(f"{x['batches_per_s']:.1f}" for x in got)
                + f" | {chosen or '-'} |"
            )
    print("\nratios (medians):")
    for load in args.loads:
        auto = med(load, "seed: streambuf 4x auto")
        fixed = med(load, "seed: streambuf 4x8")
        tdn = med(load, "seed: torchdata 32")
        dflt = med(load, "seed: streambuf defaults (from_dataset)")
        dl = med(load, "seed: DataLoader pf=2")
        print(
            f"  load {load}: auto / fixed 4x8 {_ratio(auto, fixed)}, auto / torchdata 32 "
            f"{_ratio(auto, tdn)}, defaults / DataLoader pf=2 {_ratio(dflt, dl)}, "
            f"defaults / fixed 4x8 {_ratio(dflt, fixed)}"
        )
        if not args.tiny:
            print(
                f"  load {load}: 50 ms auto / torchdata 32 "
                f"{_ratio(med(load, '50 ms: streambuf 4x auto'), med(load, '50 ms: torchdata 32'))}"
            )
    report = {"rows": table, "loads": args.loads, "repeats": args.repeats}
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
