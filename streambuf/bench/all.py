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
from ._harness import mode_of
from ._report import finish, headline_table

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


def run(
    *,
    quick: bool = False,
    out: str | None = None,
    tiny: bool = False,
    names: tuple[str, ...] = ORDER,
) -> dict[str, Any]:
    import torch

    mode = mode_of(quick=quick, tiny=tiny)
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
            reports[name] = load(name).run(quick=quick, out=out, tiny=tiny)
        except Exception as exc:  # report it, run the others
            traceback.print_exc()
            errors[name] = f"{type(exc).__name__}: {exc}"
        seconds[name] = time.perf_counter() - t0
    heads = [h for r in reports.values() for h in r.get("headline", [])]
    print(f"\n## Headline ({mode}): streambuf against the strongest peer in the same run\n")
    text = headline_table(heads)
    for name, why in {**skipped, **errors}.items():
        print(f"{name}: {'skipped' if name in skipped else 'FAILED'}: {why}")
    report = finish(
        "all",
        out,
        file="headline",
        mode=mode,
        headline=heads,
        skipped=skipped,
        errors=errors,
        seconds=seconds,
        table=text,
    )
    if out:
        (Path(out) / "headline.md").write_text(text + "\n")
    return report
