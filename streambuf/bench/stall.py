"""Consumer stall: a simulated train step and heavy-tailed per-sample latency.

Per-sample latency is log-normal (median 8 ms, sigma 1: a long tail of slow reads),
64 KiB samples, batch 32, a 40 ms train step (a sleep: it releases the GIL as CUDA
launches do), 4 workers for both sides. Reported: the fraction of wall time the training
loop waits for data (after the first batch) and batches/s. streambuf runs the latency on
32 threads per worker, delivering samples as they are ready (``map(ordered=False)``), so
one slow read does not stall a batch. The strongest peer is the DataLoader depth with
the highest throughput.

    streambuf bench stall [--quick] [--out DIR]
"""

from __future__ import annotations

from typing import Any

from ._benchmark import Benchmark
from ._harness import MIB, measure_configs, run_config
from ._report import versus

RUNNER = "streambuf.bench.workloads:run_loader"


def configs(mode: str) -> list[dict[str, Any]]:
    tiny, quick = mode == "tiny", mode == "quick"
    base: dict[str, Any] = {
        "runner": RUNNER,
        "shape": [16384],
        "latency_s": 0.008,
        "lognormal_sigma": 1.0,
        "batch_size": 32,
        "batches": 6 if tiny else (60 if quick else 120),
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


def _measure(mode: str) -> dict[str, Any]:
    rows = measure_configs(
        configs(mode),
        lambda c: run_config(c, isolate=mode != "tiny"),
        repeats=3 if mode == "full" else 1,
        label="stall",
        keys=["wait_fraction", "batches_per_s", "peak_in_flight_bytes"],
    )
    return {"rows": rows}


def _how(sb: dict[str, Any], peer: dict[str, Any]) -> str:
    return (
        f"consumer waits {100 * sb['wait_fraction']:.1f}% (streambuf) vs "
        f"{100 * peer['wait_fraction']:.1f}% ({peer['name']}); {sb['config']['workers']} workers"
    )


BENCHMARK = Benchmark(
    name="stall",
    measure=_measure,
    title=lambda r: (
        f"stall ({r['mode']}): log-normal latency (median 8 ms, sigma 1), batch 32, 40 ms step"
    ),
    columns=("run", "consumer wait %", "batches/s"),
    table=lambda r: [(x["name"], 100 * x["wait_fraction"], x["batches_per_s"]) for x in r["rows"]],
    headline=lambda r: [
        versus(
            r["rows"],
            "batches_per_s",
            workload="stall (log-normal latency, 40 ms train step)",
            metric="batches/s",
            how=_how,
        )
    ],
)
run = BENCHMARK.run
