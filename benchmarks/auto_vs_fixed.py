"""Does ``threads="auto"`` lose to a fixed thread count? Paired runs, many rounds.

Two sections of ``streambuf bench mixed`` alone, 4 workers, batch 32, repeated more often
than the full benchmark does (its 3 repeats are too few for a difference of a few percent
on saturated CPUs: one row's runs there spread 15%), interleaved and rotated, each run in
a fresh process:

* ``--section cpu`` (the default): 2 ms of pure Python a sample, no wait. ``threads=1``,
  ``threads="auto"`` and ``threads="auto", adaptive=False``; each round's runs against
  that round's ``threads=1`` (the count ``"auto"`` must not lose to: more threads only
  fight over the GIL).
* ``--section mixed``: 5 ms of waiting and 2 ms of Python a sample. Fixed counts
  (``--fixed``, threads a worker) and ``threads="auto"``; each round's runs against that
  round's run of the best fixed count (the highest median): the target of issue 26 is
  ``"auto"`` >= the best fixed count of the ladder.

Prints each row's runs, the count ``"auto"`` settled on (threads over the 4 workers) and
the per-round ratios.

    python benchmarks/auto_vs_fixed.py                          # cpu, 5 rounds, ~3 min
    python benchmarks/auto_vs_fixed.py --section mixed          # 2, 4, 8 and auto, ~5 min
    python benchmarks/auto_vs_fixed.py --section mixed --fixed 2 4 16 --rounds 9
    python benchmarks/auto_vs_fixed.py --section mixed --fixed 4 8 --longer 3  # 3x batches
    python benchmarks/auto_vs_fixed.py --tiny [--section mixed] # seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from streambuf.bench import mixed
from streambuf.bench._harness import interleaved, run_config
from streambuf.bench.workloads import calibrate_spin


def _rows(section: str, mode: str, fixed: list[int]) -> list[dict[str, Any]]:
    """The section's configs of ``bench mixed``; for ``mixed``: the fixed counts asked
    for (built from its streambuf row), then ``"auto"``."""
    cfgs = mixed.configs(mode, calibrate_spin(mixed.CPU_S))
    if section == "cpu":
        return [c for c in cfgs if c.get("section") == "cpu"]
    ours = [c for c in cfgs if c["kind"] == "streambuf" and not c.get("section")]
    auto = next(c for c in ours if c["threads"] == "auto" and not c.get("ablate"))
    one = next(c for c in ours if c["threads"] != "auto")
    w = one["workers"]
    counts = fixed if mode != "tiny" else [one["threads"]]
    return [dict(one, threads=k, name=f"streambuf {w}x{k} threads") for k in counts] + [auto]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--section", choices=("cpu", "mixed"), default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--fixed", type=int, nargs="+", default=[2, 4, 8], help="mixed: threads a worker"
    )
    parser.add_argument(
        "--longer",
        type=float,
        default=1.0,
        help="runs K times as many batches (auto's climb "
        "and re-checks are a fixed cost: a longer run shows what is left of it)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers (default: the benchmark's 4); 1 leaves the 2-core VM's "
        "CPUs half idle, as 4 workers leave a machine of 8 cores or more: the busy-CPU "
        "rule does not fire and the climb alone decides",
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny mode's rows, one round")
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else "full"
    rounds = 1 if args.tiny else args.rounds
    cfgs = [
        dict(c, batches=max(1, round(c["batches"] * args.longer)))
        for c in _rows(args.section, mode, args.fixed)
    ]
    if args.workers is not None:
        w = args.workers
        cfgs = [
            dict(c, workers=w, name=c["name"].replace(f"{c['workers']}x", f"{w}x", 1)) for c in cfgs
        ]
    runs = interleaved(
        cfgs,
        lambda c: run_config(c, isolate=not args.tiny),
        repeats=rounds,
        label=args.section,
    )
    rates = [[r["batches_per_s"] for r in got] for got in runs]
    if args.section == "cpu":
        ref, ref_name = 0, "threads=1"  # the first row
    else:  # the best fixed count by median
        ref = max(range(len(cfgs) - 1), key=lambda i: statistics.median(rates[i]))
        ref_name = f"the best fixed ({cfgs[ref]['name']})"
    rows = []
    print(f"{'run':<48} {'median':>7}  runs (batches/s); counts; x {ref_name} per round")
    for cfg, got, rate in zip(cfgs, runs, rates):
        counts = [(r.get("threads_chosen") or [None])[0] for r in got]
        ratios = [a / b for a, b in zip(rate, rates[ref])]
        rows.append(
            {
                "run": cfg["name"],
                "batches_per_s": statistics.median(rate),
                "runs": rate,
                "counts": counts,
                "x_ref": statistics.median(ratios),
                "ref": cfgs[ref]["name"],
            }
        )
        print(
            f"{cfg['name']:<48} {statistics.median(rate):>7.1f}  "
            f"{[round(x, 1) for x in rate]}; {counts}; {[round(x, 2) for x in ratios]}"
        )
    return rows


if __name__ == "__main__":
    main()
