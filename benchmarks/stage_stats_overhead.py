"""What the always-on per-stage accounting costs: the zero-latency rows of ``streambuf
bench latency`` (samples that cost nothing: where the accounting shows most) with stage
stats on and off, run as interleaved pairs in fresh child processes, many times.

The latency bench runs each row 3 times; on a noisy 2-core machine its repeats of one
row spread by +-30%, ten times the effect to show. Here each pair (on, off) runs back to
back, and the quoted figure is the median of the per-pair ratios on/off, beside the
ratio of medians.

    python benchmarks/stage_stats_overhead.py              # 9 pairs per workload, ~3 min
    python benchmarks/stage_stats_overhead.py --pairs 2    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from streambuf.bench import latency
from streambuf.bench._harness import run_config


def rows(mode: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Per workload: (stats on, stats off) configurations of the latency bench."""
    got: dict[str, dict[str, dict[str, Any]]] = {}
    for cfg in latency.configs(mode):
        name = cfg["name"]
        if name.endswith("0 ms: streambuf"):
            got.setdefault(cfg["workload"], {})["on"] = cfg
        elif name.endswith("0 ms: streambuf, stage stats off"):
            got.setdefault(cfg["workload"], {})["off"] = cfg
    return {wl: (d["on"], d["off"]) for wl, d in got.items() if "on" in d and "off" in d}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=9, help="interleaved (on, off) pairs")
    p.add_argument("--mode", default="full", choices=["full", "quick", "tiny"])
    args = p.parse_args(argv)
    out: dict[str, Any] = {}
    print(f"stage stats on vs off, {args.pairs} interleaved pairs per workload (batches/s)")
    print("| workload | on (median) | off (median) | ratio of medians | median of pair ratios |")
    print("|---|---|---|---|---|")
    for wl, (on, off) in rows(args.mode).items():
        a, b = [], []
        for i in range(args.pairs):
            first, second = (on, off) if i % 2 == 0 else (off, on)  # alternate who goes first
            r1, r2 = run_config(first)["batches_per_s"], run_config(second)["batches_per_s"]
            a.append(r1 if first is on else r2)
            b.append(r2 if first is on else r1)
        pair = statistics.median(x / y for x, y in zip(a, b))
        mid = statistics.median(a) / statistics.median(b)
        out[wl] = {"on": a, "off": b, "ratio_of_medians": mid, "median_pair_ratio": pair}
        print(
            f"| {wl} | {statistics.median(a):.0f} | {statistics.median(b):.0f} | "
            f"{mid:.3f} | {pair:.3f} |"
        )
    return out


if __name__ == "__main__":
    main()
