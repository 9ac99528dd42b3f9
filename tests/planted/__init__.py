"""Every planted bug of ``make mutants``, in one place: one list per part of the package,
each built with ``tests.planted._mutant.planted`` (one style), gathered by ``all_mutants``
in a fixed order. The runner is ``tests/mutants.py``; nothing here imports it."""

from __future__ import annotations

from tests.planted._mutant import Mutant

__all__ = ["Mutant", "all_mutants"]

GROUPS = (
    "core",
    "reliability",
    "options",
    "cache",
    "wds",
    "tests2",
    "tests2b",
    "arch",
    "cost",
    "autotune",
    "checkpoints",
    "report",
    "tokens",
    "video2",
    "datasets",
    "defaults",
)


def all_mutants() -> list[Mutant]:
    """Every group's list, in ``GROUPS`` order; names are unique."""
    import importlib

    out: list[Mutant] = []
    for group in GROUPS:
        out.extend(importlib.import_module(f"tests.planted.{group}").MUTANTS)
    names = [m.name for m in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"planted bugs with the same name: {dupes}")
    return out
