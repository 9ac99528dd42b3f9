"""``ParallelMapper``: a threaded map node whose in-flight and finished items count
against a byte bound (and the shared plumbing of streambuf's threaded nodes).

A drop-in for ``torchdata.nodes.ParallelMapper(method="thread")`` where
``max_concurrent`` (a count) becomes ``max_items`` plus ``max_bytes``. Threads, byte
accounting, order and state: ``streambuf.nodes._run``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

from .._lanes import ITEMS_PER_THREAD
from .._units import check_bool, check_seconds, check_thread_count, parse_bytes, parse_count
from ..sizing import nbytes
from ..stats import BufferStats
from ._run import AHEAD_KEY, SOURCE_KEY, MapRun

__all__ = ["ParallelMapper"]

T = TypeVar("T")


def _resume_of(state: Any, name: str) -> tuple[Any, list[int]]:
    if not isinstance(state, dict) or SOURCE_KEY not in state or AHEAD_KEY not in state:
        raise ValueError(
            f"{name}.reset() needs a state from this node's state_dict() (a dict with "
            f"{SOURCE_KEY!r} and {AHEAD_KEY!r}); got {type(state).__name__}"
        )
    return state[SOURCE_KEY], [int(i) for i in state[AHEAD_KEY]]


class _ThreadedNode(BaseNode[T]):
    """A ``BaseNode`` over one ``MapRun`` per iteration (see ``ParallelMapper``)."""

    def __init__(
        self,
        source: BaseNode[Any],
        fn: Callable[[Any], T] | None,
        *,
        threads: int,
        in_order: bool,
        max_items: int,
        max_bytes: int | str,
        sizeof: Callable[[Any], int],
        name: str,
        join_timeout_s: float,
    ) -> None:
        super().__init__()
        if not isinstance(source, BaseNode):
            raise TypeError(
                f"{name}: source={source!r} must be a torchdata.nodes.BaseNode; wrap an "
                "iterable in torchdata.nodes.IterableWrapper"
            )
        self.threads = check_thread_count(threads, name="threads")
        self.in_order = check_bool(in_order, name="in_order")
        self.max_items = parse_count(max_items, name="max_items")
        self.max_bytes = parse_bytes(max_bytes)
        if in_order and self.max_items < self.threads:
            raise ValueError(
                f"{name}: max_items={max_items} must be >= threads={threads} with "
                "in_order=True (each thread owns at least one slot); raise max_items or "
                "lower threads"
            )
        self.source = source
        self.name = name
        self.join_timeout_s = check_seconds(join_timeout_s, name="join_timeout_s")
        self._fn = fn
        if not callable(sizeof):
            raise TypeError(f"{name}: sizeof={sizeof!r} must be callable (item -> bytes)")
        self._sizeof = sizeof
        self._src_lock = threading.Lock()  # serialises the source, across runs
        self._run: MapRun | None = None
        self._stop: weakref.finalize | None = None  # closes _run: on reset, shutdown, GC
        self._failed: BaseException | None = None  # the error the iteration ended with

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Stop the current iteration's threads (bounded join), drop what they hold, and
        start again: from the beginning (``source.reset()``), or from ``initial_state``."""
        source_state, skip = (
            (None, []) if initial_state is None else _resume_of(initial_state, self.name)
        )
        super().reset(initial_state)
        self._close()
        self._failed = None
        if not self._src_lock.acquire(timeout=self.join_timeout_s):
            raise RuntimeError(
                f"{self.name}: a thread of the previous iteration is still inside the "
                "source's next(); cannot reset the source under it"
            )
        try:
            self.source.reset(source_state)
            start = self.source.state_dict()
        finally:
            self._src_lock.release()
        run = MapRun(
            self.source,
            self._fn,
            threads=self.threads,
            in_order=self.in_order,
            max_items=self.max_items,
            max_bytes=self.max_bytes,
            sizeof=self._sizeof,
            name=self.name,
            join_timeout_s=self.join_timeout_s,
            src_lock=self._src_lock,
            start_state=start,
            skip=skip,
        )
        self._run = run
        self._stop = weakref.finalize(self, run.close)

    def _close(self) -> None:
        if self._stop is not None:
            self._stop()  # runs run.close() once, and never again at GC

    def next(self) -> T:
        if self._run is None:  # unpickled: its iteration stayed in the other process
            self.reset()
        assert self._run is not None
        if self._failed is not None:
            raise self._failed  # again, until a reset: not a silent end
        try:
            out: T = self._run.next()
        except StopIteration:
            raise
        except BaseException as exc:
            # the iteration ended in an error: its threads stop now. The error's
            # traceback holds this frame and so this node, which the finalizer's
            # registry (holding the run) would then keep alive for good, threads and
            # all; closed, only a cycle is left, which a collection frees
            self._failed = exc
            self._close()
            raise
        return out

    def get_state(self) -> dict[str, Any]:
        """``{"source": <source state>, "delivered_ahead": [...]}``: exactly the items
        ``next()`` returned (see ``streambuf.nodes._run``)."""
        if self._run is None:
            self.reset()
        assert self._run is not None
        return self._run.get_state()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as configuration (threads and locks stay here): a copy starts from
        the beginning, or from a state given to ``reset``."""
        state = self.__dict__.copy()
        state.update(_src_lock=None, _run=None, _stop=None, _failed=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._src_lock = threading.Lock()

    def shutdown(self) -> None:
        """Stop the threads (bounded join) and shut the source down; ``next()`` then
        raises ``StopIteration`` until the next ``reset()``. Idempotent."""
        self._close()
        down = getattr(self.source, "shutdown", None)
        if down is not None:
            down()

    def stats(self) -> BufferStats:
        """The current iteration's buffers (``streambuf.BufferStats``): items and bytes
        held now (queued + reserved for items being made), peaks, oversize, waits.
        Zeros before the first ``reset()``."""
        if self._run is None:
            return BufferStats(0, 0, self.max_items, self.max_bytes, 0, 0, 0, 0, 0, 0.0, 0.0, 0)
        return self._run.stats()


class ParallelMapper(_ThreadedNode[T]):
    """Apply ``map_fn`` to every item of ``source`` on ``threads`` threads, bounded in
    items and bytes: a ``torchdata.nodes.BaseNode``.

    Args:
        source: the upstream node; pulled by one thread at a time.
        map_fn: runs on the threads (GIL-releasing I/O and decode scale).
        threads: worker threads (>= 1).
        max_items: items held at most, being made or finished (None: ``2 * threads``,
            torchdata's ``max_concurrent`` default).
        max_bytes: bytes held at most (int or "256MiB"), items being made counted at
            their reservation (the largest result so far); one result larger than the
            bound is admitted alone and counted in ``stats().oversize``.
        in_order: deliver in source order (each thread owns ``max_items/threads`` slots
            and ``max_bytes/threads`` bytes: deadlock-free) or as soon as ready (one
            shared pool).
        sizeof: bytes of one result; ``streambuf.nbytes`` by default.
        join_timeout_s: how long ``reset``/``shutdown`` wait for the threads, in total.

    State: the source's state as of the last item returned (plus, out of order, the
    items returned beyond it); what the threads ran ahead on is made again on resume.
    """

    def __init__(
        self,
        source: BaseNode[Any],
        map_fn: Callable[[Any], T],
        /,
        *,
        threads: int,
        max_items: int | None = None,
        max_bytes: int | str,
        in_order: bool = True,
        sizeof: Callable[[Any], int] = nbytes,
        join_timeout_s: float = 1.0,
    ) -> None:
        if not callable(map_fn):
            raise TypeError(f"map_fn={map_fn!r} must be callable")
        n = check_thread_count(threads, name="threads")
        super().__init__(
            source,
            map_fn,
            threads=n,
            in_order=in_order,
            max_items=ITEMS_PER_THREAD * n if max_items is None else max_items,
            max_bytes=max_bytes,
            sizeof=sizeof,
            name=f"ParallelMapper({getattr(map_fn, '__name__', type(map_fn).__name__)})",
            join_timeout_s=join_timeout_s,
        )
