"""Adaptive depth against fixed depths, on a stream with bursts of slow samples.

Samples alternate in phases: fast (no latency) and slow (20 ms each), 256 KiB samples,
batch 32 (8 MiB batches), 2 workers x 8 threads, a 30 ms train step. In slow phases the
producers fall behind the step; only batches buffered during fast phases carry the
consumer through. Compared in one run, interleaved: streambuf with a fixed small depth,
a fixed large depth, and the adaptive depth (starting small, growing while the consumer
waits). Reported: consumer wait %, memory growth (DESIGN.md) and peak bytes in flight.

    python -m streambuf bench bursty [--quick] [--out DIR]
"""

from __future__ import annotations

from typing import Any

from benchmarks._harness import (
    MIB,
    bench_main,
    environment,
    interleaved,
    median,
    print_table,
    with_growth,
    write_json,
)


def configs(*, quick: bool, tiny: bool = False) -> list[dict[str, Any]]:
    phase_batches = 3 if tiny else 16
    base = {
        "kind": "streambuf",
        "sample_bytes": 256 << 10,
        "latency_s": 0.0,
        "slow_latency_s": 0.02,
        "phase_samples": phase_batches * 32,
        "batch_size": 32,
        "batches": phase_batches * (4 if tiny else (8 if quick else 12)),
        "workers": 2,
        "threads": 8,
        "step_s": 0.03,
        "max_bytes": 1024 * MIB,
    }
    return [
        dict(base, adaptive=False, max_batches=2, name="fixed depth 2"),
        dict(base, adaptive=False, max_batches=32, name="fixed depth 32"),
        dict(base, adaptive=True, max_batches=32, name="adaptive (2..32)"),
    ]


def run(*, quick: bool = False, out: str | None = None, tiny: bool = False) -> dict[str, Any]:
    cfgs = configs(quick=quick, tiny=tiny)
    repeats = 1 if (quick or tiny) else 2
    results = interleaved(cfgs, with_growth, repeats=repeats, label="bursty")
    rows = [
        {
            "name": cfg["name"],
            "config": cfg,
            "runs": runs,
            "wait_fraction": median(runs, "wait_fraction"),
            "growth_mib": median(runs, "growth_bytes") / MIB,
            "peak_in_flight_mib": median(runs, "peak_batch_bytes_held") / MIB,
            "final_depth": runs[-1].get("final_depth"),
        }
        for cfg, runs in zip(cfgs, results)
    ]
    large = rows[1]
    print("\nbursty: phases of fast / 20 ms samples, 8 MiB batches, 30 ms step, 2 workers")
    text = print_table(
        [
            "run",
            "consumer wait %",
            "growth MiB",
            "peak batches held MiB",
            "x large peak",
            "final depth",
        ],
        [
            (
                r["name"],
                100 * r["wait_fraction"],
                r["growth_mib"],
                r["peak_in_flight_mib"],
                r["peak_in_flight_mib"] / max(1e-9, large["peak_in_flight_mib"]),
                r["final_depth"],
            )
            for r in rows
        ],
    )
    report = {"benchmark": "bursty", "environment": environment(), "rows": rows, "table": text}
    write_json(out, "bursty", report)
    return report


def main(argv: list[str] | None = None) -> None:
    bench_main(run, __doc__, argv)


if __name__ == "__main__":
    main()
