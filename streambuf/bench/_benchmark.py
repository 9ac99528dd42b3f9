"""``Benchmark``: what one benchmark declares (how it measures, its table, headline rows and
plot), and the one ``run`` that checks, prints and writes every report the same way.

A benchmark module holds ``BENCHMARK = Benchmark(...)`` and ``run = BENCHMARK.run``.
``run(quick=, out=, tiny=, **options)`` calls ``measure(mode, **options)`` (mode "tiny",
"quick" or "full"), whose dict becomes the report: ``{"benchmark": name, "environment":
..., "mode": mode, **measured, "headline": [...], "table": "...", "total_s": ...}``.
Where the report has ``rows`` (one per loader configuration, each with its ``runs``),
``check_runs`` proves every run delivered what it should before anything is printed.
Then the tables are printed, the report written to ``out/<file or name>.json`` and the
plot to ``out/<name>.png``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._harness import environment, mode_of
from ._report import Headline, Ladder, Table, check_runs, write_json

__all__ = ["Benchmark", "Report"]

Report = dict[str, Any]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark, declared (see the module docstring); each callable reads the report."""

    name: str
    measure: Callable[..., Report]  # (mode, **options) -> the report's own fields
    title: Callable[[Report], str]  # the line above the table
    columns: Sequence[str]
    table: Callable[[Report], Iterable[Sequence[Any]]]  # the table's rows
    headline: Callable[[Report], Iterable[Headline | None]] | None = None  # None rows dropped
    plot: Callable[[Report], Ladder | None] | None = None
    more: Callable[[Report], Iterable[Table]] | None = None  # tables printed after the first
    file: str | None = None  # the JSON's name, if not ``name``

    def run(
        self, *, quick: bool = False, out: str | None = None, tiny: bool = False, **options: Any
    ) -> Report:
        """Measure, check, print the tables, write the JSON (and plot) under ``out``."""
        t0 = time.perf_counter()
        mode = mode_of(quick=quick, tiny=tiny)
        measured = self.measure(mode, **options)
        if "rows" in measured:
            check_runs(measured["rows"])
        report: Report = {"benchmark": self.name, "environment": environment(), "mode": mode}
        report.update(measured)
        if self.headline is not None:
            heads = [h.as_dict() for h in self.headline(report) if h is not None]
            report["headline"] = heads
        report.setdefault("headline", [])
        tables = [Table(self.title(report), self.columns, self.table(report))]
        tables += self.more(report) if self.more is not None else []
        report["table"] = "\n\n".join(t.show() for t in tables)
        for key, why in (report.get("notes") or {}).items():
            print(f"{key}: {why}", flush=True)
        report["total_s"] = time.perf_counter() - t0
        write_json(out, self.file or self.name, report)
        ladder = self.plot(report) if self.plot is not None else None
        if ladder is not None:
            ladder.draw(out, self.name)
        print(f"{self.name} took {report['total_s']:.0f} s", flush=True)
        return report
