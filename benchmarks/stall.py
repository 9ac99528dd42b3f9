"""Consumer stall: a simulated train step and heavy-tailed per-sample latency.

Per-sample latency is log-normal (median 8 ms, sigma 1: a long tail of slow reads),
batch 32, a 40 ms train step, 4 workers for both sides. Reported: the fraction of wall
time the training loop waits for data (after the first batch). streambuf runs the
latency on 32 threads per worker, delivering samples as they are ready
(``map(ordered=False)``), so one slow read does not stall a batch.

    python -m streambuf bench stall [--quick] [--out DIR]
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
    run_child,
    write_json,
)


def configs(*, quick: bool, tiny: bool = False) -> list[dict[str, Any]]:
    base = {
        "sample_bytes": 64 << 10,
        "latency_s": 0.008,
        "lognormal_sigma": 1.0,
        "batch_size": 32,
        "batches": 10 if tiny else (60 if quick else 120),
        "workers": 2 if tiny else 4,
        "step_s": 0.04,
    }
    pfs = [2] if tiny else [2, 4, 8]
    out = [dict(base, kind="dataloader", prefetch_factor=k, name=f"DataLoader pf={k}") for k in pfs]
    out.append(
        dict(
            base,
            kind="streambuf",
            threads=32,
            ordered=False,
            max_batches=2 * base["workers"],
            max_bytes=64 * MIB,
            name="streambuf threads=32",
        )
    )
    return out


def run(*, quick: bool = False, out: str | None = None, tiny: bool = False) -> dict[str, Any]:
    cfgs = configs(quick=quick, tiny=tiny)
    repeats = 1 if (quick or tiny) else 3
    results = interleaved(cfgs, run_child, repeats=repeats, label="stall")
    rows = [
        {
            "name": cfg["name"],
            "config": cfg,
            "runs": runs,
            "wait_fraction": median(runs, "wait_fraction"),
            "batches_per_s": median(runs, "batches_per_s"),
        }
        for cfg, runs in zip(cfgs, results)
    ]
    print("\nstall: log-normal latency (median 8 ms, sigma 1), batch 32, 40 ms step")
    text = print_table(
        ["run", "consumer wait %", "batches/s"],
        [(r["name"], 100 * r["wait_fraction"], r["batches_per_s"]) for r in rows],
    )
    report = {"benchmark": "stall", "environment": environment(), "rows": rows, "table": text}
    write_json(out, "stall", report)
    return report


def main(argv: list[str] | None = None) -> None:
    bench_main(run, __doc__, argv)


if __name__ == "__main__":
    main()
