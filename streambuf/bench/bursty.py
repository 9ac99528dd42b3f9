"""Adaptive depth against fixed depths, on a stream with bursts of slow samples.

Samples alternate in phases: fast (no latency) and slow (20 ms each), 256 KiB samples,
batch 32 (8 MiB batches), 2 workers x 8 threads, a 30 ms train step. In slow phases the
producers fall behind the step; only batches buffered during fast phases carry the
consumer through. Compared in one run, interleaved: streambuf with a fixed small depth,
a fixed large depth, and the adaptive depth (starting small, growing while the consumer
waits). Reported: consumer wait %, memory growth (docs/design.md) and peak bytes in flight.

This is an ablation of streambuf's own tuner, not a comparison with a peer (the peers'
depth cannot change at run time: the fixed depths are what they can do), so it has no
headline row.

    streambuf bench bursty [--quick] [--out DIR]
"""

from __future__ import annotations

from typing import Any

from ._benchmark import Benchmark
from ._harness import MIB, measure_configs, with_growth

RUNNER = "streambuf.bench.workloads:run_loader"


def configs(mode: str) -> list[dict[str, Any]]:
    tiny, quick = mode == "tiny", mode == "quick"
    phase_batches = 2 if tiny else 16
    base = {
        "runner": RUNNER,
        "kind": "streambuf",
        "shape": [4096 if tiny else 65536],  # 16 KiB or 256 KiB float32
        "latency_s": 0.0,
        "slow_latency_s": 0.02,
        "phase_samples": phase_batches * 32,
        "batch_size": 32,
        "batches": phase_batches * (3 if tiny else (8 if quick else 12)),
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


def _measure(mode: str) -> dict[str, Any]:
    rows = measure_configs(
        configs(mode),
        lambda c: with_growth(c, isolate=mode != "tiny"),
        repeats=2 if mode == "full" else 1,
        label="bursty",
        keys=["wait_fraction", "growth_bytes", "peak_batch_bytes_held", "final_depth"],
    )
    for r in rows:
        r["growth_mib"] = r["growth_bytes"] / MIB
        r["peak_held_mib"] = r["peak_batch_bytes_held"] / MIB
    return {"rows": rows}


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    large = report["rows"][1]["peak_held_mib"]
    return [
        (
            r["name"],
            100 * r["wait_fraction"],
            r["growth_mib"],
            r["peak_held_mib"],
            r["peak_held_mib"] / max(1e-9, large),
            int(r["final_depth"]),
        )
        for r in report["rows"]
    ]


BENCHMARK = Benchmark(  # an ablation of the tuner: no peer, no headline (see the docstring)
    name="bursty",
    measure=_measure,
    title=lambda r: (
        f"bursty ({r['mode']}): phases of fast / 20 ms samples, 30 ms step, 2 workers x 8 threads"
    ),
    columns=(
        "run",
        "consumer wait %",
        "growth MiB",
        "peak batches held MiB",
        "x large peak",
        "final depth",
    ),
    table=_table,
)
run = BENCHMARK.run
