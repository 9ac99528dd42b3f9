"""Does ``threads="auto"`` lose to ``threads=1`` where the map only computes?

The CPU-bound rows of ``streambuf bench mixed`` alone (2 ms of pure Python a sample, no
wait, 4 workers, batch 32): ``threads=1``, ``threads="auto"`` and ``threads="auto",
adaptive=False``, repeated more often than the full benchmark does (its 3 repeats are
too few for a difference of a few percent on saturated CPUs), interleaved and rotated,
each run in a fresh process. Prints each row's runs, the count ``"auto"`` settled on
(threads over the 4 workers) and the ratio to ``threads=1`` of each round's pair.

    python benchmarks/cpu_bound_auto.py              # 5 rounds, ~3 min on 2 cores
    python benchmarks/cpu_bound_auto.py --rounds 9
    python benchmarks/cpu_bound_auto.py --tiny       # seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from streambuf.bench import mixed
from streambuf.bench._harness import interleaved, run_config
from streambuf.bench.workloads import calibrate_spin


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny mode's rows, one round")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else "full"
    rounds = 1 if args.tiny else args.rounds
    cfgs = [
        c for c in mixed.configs(mode, calibrate_spin(mixed.CPU_S)) if c.get("section") == "cpu"
    ]
    runs = interleaved(
        cfgs, lambda c: run_config(c, isolate=not args.tiny), repeats=rounds, label="cpu-bound"
    )
    one = [r["batches_per_s"] for r in runs[0]]  # the first row is threads=1
    rows = []
    print(f"{'run':<48} {'median':>7}  runs (batches/s); counts; x threads=1 per round")
    for cfg, got in zip(cfgs, runs):
        rates = [r["batches_per_s"] for r in got]
        counts = [(r.get("threads_chosen") or [None])[0] for r in got]
        ratios = [a / b for a, b in zip(rates, one)]
        rows.append(
            {
                "run": cfg["name"],
                "batches_per_s": statistics.median(rates),
                "runs": rates,
                "counts": counts,
                "x_one": statistics.median(ratios),
            }
        )
        print(
            f"{cfg['name']:<48} {statistics.median(rates):>7.1f}  "
            f"{[round(x, 1) for x in rates]}; {counts}; {[round(x, 2) for x in ratios]}"
        )
    return rows


if __name__ == "__main__":
    main()
