"""The mission's ladder: latency-bound samples, DataLoader prefetch_factor vs streambuf.

Per-sample latency 10 ms (sleep: stands in for I/O or decode that releases the GIL),
64 KiB samples, batch 32, 4 workers. DataLoader over a map-style Dataset at
prefetch_factor 1, 2, 4, 8, 16, against a streambuf pipeline
``Pipeline(range(n)).map(load, threads=8).batch(32)`` through ``Loader`` with the same
4 workers and a byte budget of half what DataLoader(prefetch_factor=2) holds in flight.
Also: the DataLoader's theoretical ceiling ``workers / (latency x batch)`` and the
measured zero-latency transport ceilings. Every run is a child process; memory growth
per DESIGN.md (peak minus the same run with 4-byte samples). Interleaved repeats, medians.

    python -m streambuf bench latency [--quick] [--out DIR]
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

LATENCY_S = 0.010
BATCH = 32
WORKERS = 4
SAMPLE_BYTES = 64 << 10


def configs(*, quick: bool, tiny: bool = False) -> list[dict[str, Any]]:
    base = {
        "sample_bytes": SAMPLE_BYTES,
        "latency_s": LATENCY_S,
        "batch_size": BATCH,
        "batches": 12 if tiny else (40 if quick else 80),
        "workers": 2 if tiny else WORKERS,
    }
    pfs = [2] if tiny else [1, 2, 4, 8, 16]
    out = [dict(base, kind="dataloader", prefetch_factor=k, name=f"DataLoader pf={k}") for k in pfs]
    # the bytes DataLoader(prefetch_factor=2) holds in flight; streambuf gets half
    in_flight_pf2 = 2 * base["workers"] * BATCH * SAMPLE_BYTES
    out.append(
        dict(
            base,
            kind="streambuf",
            threads=8,
            max_batches=2 * base["workers"],
            max_bytes=in_flight_pf2 // 2,
            name="streambuf threads=8",
        )
    )
    if not tiny:
        out.append(
            dict(base, kind="dataloader", prefetch_factor=8, latency_s=0.0, name="DataLoader 0 ms")
        )
        out.append(
            dict(
                base,
                kind="streambuf",
                threads=8,
                max_batches=2 * base["workers"],
                max_bytes=in_flight_pf2 // 2,
                latency_s=0.0,
                name="streambuf 0 ms",
            )
        )
    return out


def run(*, quick: bool = False, out: str | None = None, tiny: bool = False) -> dict[str, Any]:
    cfgs = configs(quick=quick, tiny=tiny)
    repeats = 1 if (quick or tiny) else 3
    results = interleaved(cfgs, with_growth, repeats=repeats, label="latency")
    rows = []
    for cfg, runs in zip(cfgs, results):
        rows.append(
            {
                "name": cfg["name"],
                "config": cfg,
                "runs": runs,
                "batches_per_s": median(runs, "batches_per_s"),
                "growth_mib": median(runs, "growth_bytes") / MIB,
            }
        )
    by = {r["name"]: r for r in rows}
    ref = by["DataLoader pf=2"]["batches_per_s"]
    ceiling = cfgs[0]["workers"] / (LATENCY_S * BATCH)
    table = [
        (
            r["name"],
            r["batches_per_s"],
            r["batches_per_s"] / ref,
            r["growth_mib"],
        )
        for r in rows
    ]
    table.append(("DataLoader theoretical ceiling", ceiling, ceiling / ref, float("nan")))
    print(
        f"\nlatency ladder: {LATENCY_S * 1e3:.0f} ms/sample, batch {BATCH}, "
        f"{cfgs[0]['workers']} workers, {SAMPLE_BYTES >> 10} KiB samples"
    )
    text = print_table(["run", "batches/s", "x DataLoader pf=2", "growth MiB"], table)
    sb = by["streambuf threads=8"]
    report = {
        "benchmark": "latency",
        "environment": environment(),
        "latency_s": LATENCY_S,
        "batch_size": BATCH,
        "sample_bytes": SAMPLE_BYTES,
        "repeats": repeats,
        "dataloader_ceiling_batches_per_s": ceiling,
        "rows": rows,
        "speedup_vs_pf2": sb["batches_per_s"] / ref,
        "growth_vs_pf2": {
            "streambuf_mib": sb["growth_mib"],
            "dataloader_pf2_mib": by["DataLoader pf=2"]["growth_mib"],
        },
        "table": text,
    }
    write_json(out, "latency", report)
    dl = [r for r in rows if r["config"]["kind"] == "dataloader" and r["config"]["latency_s"] > 0]
    plot_ladder(
        out,
        "latency",
        title="10 ms/sample, batch 32: DataLoader prefetch_factor vs streambuf",
        dl_depths=[r["config"]["prefetch_factor"] for r in dl],
        dl_throughput=[r["batches_per_s"] for r in dl],
        dl_memory_mib=[r["growth_mib"] for r in dl],
        sb_points=[("streambuf", sb["batches_per_s"], sb["growth_mib"])],
    )
    return report


def main(argv: list[str] | None = None) -> None:
    bench_main(run, __doc__, argv)


if __name__ == "__main__":
    main()
