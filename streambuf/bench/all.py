"""Every benchmark in one go, then the headline table: one row per workload, streambuf's
figure beside the strongest peer's from the same run, and the ratio (below 1: streambuf
loses, and the table says so).

Runs latency, nodes, mixed, memory, stall, network, cache, video, buffer and bursty, and gpu
where a CUDA device is usable. A benchmark that fails is reported and the others still run
(the command then exits non-zero). Writes each benchmark's JSON and ``headline.json`` /
``headline.md`` under ``--out``.

    streambuf bench all [--quick] [--out DIR]
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from . import load
from ._benchmark import Benchmark
from ._report import HEADLINE_COLUMNS, headline_cells

ORDER = (
    "latency",
    "nodes",
    "mixed",
    "memory",
    "stall",
    "network",
    "cache",
    "video",
    "buffer",
    "bursty",
    "gpu",
)


def _measure(mode: str, names: tuple[str, ...], into: str | None) -> dict[str, Any]:
    import torch

    reports: dict[str, Any] = {}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for name in names:
        if name == "gpu" and not torch.cuda.is_available():
            skipped[name] = "no CUDA device here (run `streambuf bench gpu` on a GPU machine)"
            continue
        t0 = time.perf_counter()
        try:
            reports[name] = load(name).run(quick=mode == "quick", out=into, tiny=mode == "tiny")
        except Exception as exc:  # report it, run the others
            traceback.print_exc()
            errors[name] = f"{type(exc).__name__}: {exc}"
        seconds[name] = time.perf_counter() - t0
    return {
        "headline": [h for r in reports.values() for h in r.get("headline", [])],
        "skipped": skipped,
        "errors": errors,
        "seconds": seconds,
        "notes": {
            **{k: f"skipped: {why}" for k, why in skipped.items()},
            **{k: f"FAILED: {why}" for k, why in errors.items()},
        },
    }


BENCHMARK = Benchmark(
    name="all",
    file="headline",
    measure=_measure,
    title=lambda r: (
        f"## Headline ({r['mode']}): streambuf against the strongest peer in the same run\n"
    ),
    columns=HEADLINE_COLUMNS,
    table=lambda r: [headline_cells(h) for h in r["headline"]],
)


def run(
    *,
    quick: bool = False,
    out: str | None = None,
    tiny: bool = False,
    names: tuple[str, ...] = ORDER,
) -> dict[str, Any]:
    """Run ``names``; the headline table, also written to ``out/headline.md``."""
    report = BENCHMARK.run(quick=quick, out=out, tiny=tiny, names=names, into=out)
    if out:
        (Path(out) / "headline.md").write_text(report["table"] + "\n")
    return report
