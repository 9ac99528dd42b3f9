"""Memory growth of DataLoader(prefetch_factor=k) against streambuf's byte budget.

1 MiB samples, batch 32 (32 MiB batches), 2 workers, a slow consumer (150 ms a batch)
so that queues fill up. Each run is a child process; growth per DESIGN.md: the run's
peak system used memory (AnonPages + Shmem) minus the peak of the same run with 4-byte
samples. Rule for streambuf: growth <= 1.25 x max_bytes + 100 MiB.

    python -m streambuf bench memory [--quick] [--out DIR]
"""

from __future__ import annotations

from typing import Any

from benchmarks._harness import (
    MIB,
    bench_main,
    environment,
    interleaved,
    median,
    plot_ladder,
    print_table,
    with_growth,
    write_json,
)
from streambuf.memwatch import budget_rule_bytes


def configs(*, quick: bool, tiny: bool = False) -> list[dict[str, Any]]:
    base = {
        "sample_bytes": (64 << 10) if tiny else MIB,
        "batch_size": 32,
        "batches": 8 if tiny else (16 if quick else 24),
        "workers": 2,
        "consumer_s": 0.0,
        "step_s": 0.02 if tiny else 0.15,
    }
    pfs = [8] if tiny else ([2, 8] if quick else [1, 2, 4, 8])
    out = [dict(base, kind="dataloader", prefetch_factor=k, name=f"DataLoader pf={k}") for k in pfs]
    for mb in [16] if tiny else ([128] if quick else [64, 128, 256]):
        out.append(
            dict(
                base,
                kind="streambuf",
                threads=4,
                max_batches=8,
                max_bytes=mb * MIB,
                name=f"streambuf {mb} MiB",
            )
        )
    return out


def run(*, quick: bool = False, out: str | None = None, tiny: bool = False) -> dict[str, Any]:
    cfgs = configs(quick=quick, tiny=tiny)
    repeats = 1 if (quick or tiny) else 2
    results = interleaved(cfgs, with_growth, repeats=repeats, label="memory")
    rows = []
    for cfg, runs in zip(cfgs, results):
        row = {
            "name": cfg["name"],
            "config": cfg,
            "runs": runs,
            "batches_per_s": median(runs, "batches_per_s"),
            "growth_mib": median(runs, "growth_bytes") / MIB,
            "peak_in_flight_mib": median(runs, "peak_in_flight_bytes") / MIB,
        }
        if cfg["kind"] == "streambuf":
            row["rule_mib"] = budget_rule_bytes(cfg["max_bytes"]) / MIB
        rows.append(row)
    best_dl = max(r["batches_per_s"] for r in rows if r["config"]["kind"] == "dataloader")
    table = [
        (
            r["name"],
            r["batches_per_s"],
            r["batches_per_s"] / best_dl,
            r["growth_mib"],
            r.get("rule_mib", float("nan")),
            r["peak_in_flight_mib"],
        )
        for r in rows
    ]
    print(
        f"\nmemory: {cfgs[0]['sample_bytes'] >> 10} KiB samples, batch 32, 2 workers, slow consumer"
    )
    text = print_table(
        ["run", "batches/s", "x best DataLoader", "growth MiB", "rule MiB", "peak in flight MiB"],
        table,
    )
    report = {"benchmark": "memory", "environment": environment(), "rows": rows, "table": text}
    write_json(out, "memory", report)
    dl = [r for r in rows if r["config"]["kind"] == "dataloader"]
    plot_ladder(
        out,
        "memory",
        title="32 MiB batches, slow consumer: memory growth",
        dl_depths=[r["config"]["prefetch_factor"] for r in dl],
        dl_throughput=[r["batches_per_s"] for r in dl],
        dl_memory_mib=[r["growth_mib"] for r in dl],
        sb_points=[
            (r["name"], r["batches_per_s"], r["growth_mib"])
            for r in rows
            if r["config"]["kind"] == "streambuf"
        ],
    )
    return report


def main(argv: list[str] | None = None) -> None:
    bench_main(run, __doc__, argv)


if __name__ == "__main__":
    main()
