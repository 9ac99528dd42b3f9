"""A small integer shared between the main process and DataLoader workers.

Backed by a ``multiprocessing`` shared value, so a change in the main process is seen by
workers created by fork *and* spawn, persistent ones included (attributes set on the main
process's dataset after workers start never reach them; this does). Shared memory can
only be handed to a child while it is being created; pickled at any other time (e.g.
``copy.deepcopy``) the object degrades to a private int, which is what such a copy needs.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext
from typing import Any

__all__ = ["SharedInt"]


def _spawning() -> bool:
    from multiprocessing import context

    return context.get_spawning_popen() is not None


class SharedInt:
    """An int readable and writable from every process that inherited it."""

    def __init__(self, value: int = 0, *, ctx: BaseContext | None = None) -> None:
        self._ctx = ctx
        self._raw: Any = (ctx or multiprocessing).RawValue("q", value)
        self._local: int | None = None

    @property
    def value(self) -> int:
        return int(self._raw.value) if self._raw is not None else int(self._local or 0)

    @value.setter
    def value(self, v: int) -> None:
        if self._raw is not None:
            self._raw.value = int(v)
        else:
            self._local = int(v)

    def __getstate__(self) -> dict[str, Any]:
        if self._raw is not None and _spawning():
            return {"raw": self._raw, "local": None}
        return {"raw": None, "local": self.value}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._ctx = None
        self._raw = state["raw"]
        self._local = state["local"]
