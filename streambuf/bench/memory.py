"""Memory growth of ``DataLoader(prefetch_factor=k)`` against streambuf's byte budget.

1 MiB samples, batch 32 (32 MiB batches), 2 workers, a slow consumer (150 ms a batch)
so that every queue fills up. Each run is a child process; growth per docs/design.md
("Measuring memory"): the run's peak system used memory (``AnonPages + Shmem``, sampled
every 20 ms) minus the peak of the same run with 1-element samples. The rule streambuf
must keep: growth <= 1.25 x max_bytes + 100 MiB. The strongest peer is the DataLoader
row with the least growth (with a slow consumer every depth gives the same throughput,
so a user would pick the shallowest).

    streambuf bench memory [--quick] [--out DIR]
"""

from __future__ import annotations

from typing import Any

from ._benchmark import Benchmark
from ._harness import MIB, measure_configs, with_growth
from ._report import Headline, Ladder, versus
from .memwatch import budget_rule_bytes

RUNNER = "streambuf.bench.workloads:run_loader"


def configs(mode: str) -> list[dict[str, Any]]:
    tiny, quick = mode == "tiny", mode == "quick"
    sample_bytes = (64 << 10) if tiny else MIB
    base = {
        "runner": RUNNER,
        "shape": [sample_bytes // 4],
        "batch_size": 32,
        "batches": 6 if tiny else (16 if quick else 24),
        "workers": 2,
        "step_s": 0.02 if tiny else 0.15,
    }
    pfs = [8] if tiny else ([1, 2, 8] if quick else [1, 2, 4, 8])
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


def _measure(mode: str) -> dict[str, Any]:
    rows = measure_configs(
        configs(mode),
        lambda c: with_growth(c, isolate=mode != "tiny"),
        repeats=2 if mode == "full" else 1,
        label="memory",
        keys=["batches_per_s", "growth_bytes", "peak_in_flight_bytes"],
    )
    for r in rows:
        r["growth_mib"] = r["growth_bytes"] / MIB
        if r["kind"] == "streambuf":
            r["rule_mib"] = budget_rule_bytes(r["config"]["max_bytes"]) / MIB
    return {"rows": rows}


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = report["rows"]
    best_dl = max(r["batches_per_s"] for r in rows if r["kind"] == "dataloader")
    return [
        (
            r["name"],
            r["batches_per_s"],
            r["batches_per_s"] / best_dl,
            r["growth_mib"],
            r.get("rule_mib", float("nan")),
            r["peak_in_flight_bytes"] / MIB,
        )
        for r in rows
    ]


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    sbs = [r for r in report["rows"] if r["kind"] == "streambuf"]
    sb = next((r for r in sbs if r["name"].endswith(" 128 MiB")), sbs[0])
    return [
        versus(
            report["rows"],
            "growth_mib",
            workload="memory (32 MiB batches, slow consumer)",
            metric="growth MiB",
            better="lower",
            mine=lambda r: r is sb,
            how=lambda sb, peer: (
                f"{sb['name']} at {sb['batches_per_s']:.2f} batches/s vs "
                f"{peer['name']} at {peer['batches_per_s']:.2f}; growth = peak AnonPages+Shmem "
                "minus the tiny-sample run"
            ),
        )
    ]


BENCHMARK = Benchmark(
    name="memory",
    measure=_measure,
    title=lambda r: (
        f"memory ({r['mode']}): {r['rows'][0]['config']['shape'][0] * 4 >> 10} KiB "
        "samples, batch 32, 2 workers, slow consumer"
    ),
    columns=("run", "batches/s", "x best DataLoader", "growth MiB", "rule MiB", "peak credits MiB"),
    table=_table,
    headline=_headline,
    plot=lambda r: Ladder(
        "32 MiB batches, slow consumer: memory growth", r["rows"], memory="growth_bytes"
    ),
)
run = BENCHMARK.run
