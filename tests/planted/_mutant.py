"""What a planted bug is (``Mutant``) and the one way every list builds them
(``planted``). A leaf: imports nothing of the project's tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """Replace ``old`` (occurring exactly once in ``path``) with ``new``; ``tests`` (pytest
    node ids or files) must then fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


def planted(group: str, *, default_file: str = "") -> Callable[..., Mutant]:
    """A builder ``m(name, path, old, new, *tests)`` for one group's list: the name gets
    the ``group: `` prefix; a test given as ``::name`` (or a bare test name) is taken
    from ``default_file``."""

    def m(name: str, path: str, old: str, new: str, *tests: str) -> Mutant:
        if not tests:
            raise ValueError(f"planted bug {name!r} names no test")
        full = tuple(
            t
            if (t.startswith("tests/") or not default_file)
            else f"{default_file}::{t.lstrip(':')}"
            for t in tests
        )
        return Mutant(f"{group}: {name}" if group else name, path, old, new, full)

    return m
