"""``MapRun``: the byte accounting and state behind ``ParallelMapper`` and
``Prefetcher`` (one run = one iteration of a node, from one ``reset`` to the next).

``threads`` threads pull from the source node (one at a time: a lock serialises it), apply
``map_fn`` outside that lock (the concurrency: I/O and GIL-releasing decode) and commit
the results into one ``Window`` (``streambuf.window``) that ``next()`` takes from. The
threads are the package's one lane runner (``streambuf._lanes``), a lane per thread:

* **Reserve before build.** Before pulling its next item a thread reserves room for it
  (its estimate: the largest result so far, or before the first its share of
  ``max_bytes``), so items being pulled and mapped count like queued ones.
* **One pool.** ``max_items`` and ``max_bytes`` bound the run as a whole; a result
  larger than its reservation waits, in its thread and outside the count, for room at
  its real size (admitted alone into an empty window when larger than the bound,
  counted in ``oversize``). ``in_order=True``: ``order="sequence"`` (a pull takes its
  number after its room, so in-order delivery from one pool cannot deadlock);
  ``in_order=False``: ``"first_ready"``. Whichever thread is free pulls the next item.

State (torchdata's rule: it describes exactly the items ``next()`` returned): each pull
captures ``source.state_dict()`` with the item, under the source lock, as ``(index,
state after it)``. The run's state is the source state after the longest delivered
prefix of indices, plus the indices delivered beyond it (relative to it)::

    {"source": <source state>, "delivered_ahead": [i, ...]}

A run resumed from it resets the source to ``"source"`` and drops the items at
``"delivered_ahead"`` when it pulls them (never mapped, never delivered again).

Errors: an exception in the source, ``map_fn`` or ``sizeof`` reaches ``next()`` as the
same object, with a note naming the node, the thread and the item; held items are
dropped. Shutdown: ``close()`` closes the window (drops what it holds, wakes every
blocked thread) and joins the threads within ``join_timeout_s``; after ``close()`` the
threads never touch the source again (each pull checks, under the source lock). A thread
stuck in ``map_fn`` is a daemon, logged; it ends at its next reserve or commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from .._lanes import LaneRunner
from .._units import check_size
from ..errors import BufferClosed, stop_as_error
from ..stats import BufferStats
from ..window import Window

__all__ = ["AHEAD_KEY", "SOURCE_KEY", "MapRun"]

SOURCE_KEY = "source"
AHEAD_KEY = "delivered_ahead"

# (result, source index, source state after it, bytes): the size rides along, measured once
Made = tuple[Any, int, Any, int]


def _rec_size(rec: Made) -> int:
    return rec[3]


class _Steps:
    """One thread's iterator: each ``next`` pulls and maps one item (a plain call, not a
    generator, so a thread blocked in ``reserve`` pins nothing it made)."""

    __slots__ = ("_run", "_t")

    def __init__(self, run: MapRun, t: int) -> None:
        self._run, self._t = run, t

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> tuple[int, Made]:
        return self._run._step(self._t)


class MapRun:
    """One iteration of a node; see the module docstring.

    Ownership: the run owns its threads and window; the source and ``src_lock`` belong to
    the node, which resets the source (holding ``src_lock``) before it makes a run.

    Args:
        source: the source node, already reset; ``start_state`` is its state now.
        fn: applied to each item on a thread; None passes items through.
        skip: indices (from the source's position now) already delivered: dropped.
    """

    def __init__(
        self,
        source: Any,
        fn: Callable[[Any], Any] | None,
        *,
        threads: int,
        in_order: bool,
        max_items: int,
        max_bytes: int,
        sizeof: Callable[[Any], int],
        name: str,
        join_timeout_s: float,
        src_lock: threading.Lock,
        start_state: Any,
        skip: list[int],
    ) -> None:
        self._source = source
        self._fn = fn
        self._sizeof = sizeof
        self.name = name
        self._src_lock = src_lock
        self._window: Window[Made] = Window(
            lanes=threads,
            order="sequence" if in_order else "first_ready",
            max_items=max_items,
            max_bytes=max_bytes,
        )
        self._doing = ["pulling from its source"] * threads  # per thread, for error notes
        self._lock = threading.Lock()  # guards the delivered-state tracking below
        self._pulled = 0  # source items pulled (their indices); under src_lock
        self._issued = 0  # sequence numbers handed out (skipped items get none)
        self._ended = False  # the source is exhausted, or a thread failed
        self._closed = False
        self._prefix = 0  # every index < _prefix was delivered (or skipped)
        self._prefix_state = start_state  # the source's state after index _prefix - 1
        self._ahead: dict[int, Any] = {}  # delivered indices >= _prefix -> state after each
        self._skip = set(skip)  # delivered before the checkpoint, not pulled again yet
        self._runner: LaneRunner[Made] = LaneRunner(
            [partial(_Steps, self, t) for t in range(threads)],
            window=self._window,
            numbered=True,
            sizeof=_rec_size,
            name=name,
            kind="node",
            join_timeout_s=join_timeout_s,
            on_close=self._stop,
            stops_when="at its next reserve or commit",
            describe=lambda t: f"while {self._doing[t]}",
        )
        self._runner.start()

    # -- threads ----------------------------------------------------------------------
    def _pull(self) -> tuple[int, int, Any, Any] | None:
        """(sequence number, index, item, source state after it), or None at the end."""
        with self._src_lock:
            while True:
                if self._closed or self._ended:
                    return None
                try:
                    item = next(self._source)
                except StopIteration:
                    self._ended = True
                    return None
                except BaseException:
                    self._ended = True  # no thread pulls again
                    raise
                state = self._source.state_dict()
                idx = self._pulled
                self._pulled += 1
                with self._lock:
                    if idx in self._skip:
                        self._skip.discard(idx)
                        self._mark(idx, state)
                        continue
                    seq = self._issued
                    self._issued += 1
                return seq, idx, item, state

    def _step(self, t: int) -> tuple[int, Made]:
        """Thread ``t``'s next ``(seq, (result, index, state, bytes))``."""
        self._doing[t] = "pulling from its source"
        got = self._pull()
        if got is None:
            raise StopIteration
        seq, idx, item, state = got
        self._doing[t] = f"mapping item #{seq}"
        try:
            out = item if self._fn is None else self._fn(item)
        except StopIteration as stop:  # from map_fn: it must not end the stream
            self._ended = True
            raise stop_as_error(stop, "map_fn") from stop
        except BaseException:
            self._ended = True  # no thread pulls again
            raise
        return seq, (out, idx, state, check_size(self._sizeof(out)))

    def _stop(self) -> None:
        with self._src_lock:
            self._ended = True

    # -- consumer ---------------------------------------------------------------------
    def _mark(self, idx: int, state: Any) -> None:
        """Index ``idx`` is delivered (or skipped); advance the prefix. Holds _lock."""
        self._ahead[idx] = state
        while self._prefix in self._ahead:
            self._prefix_state = self._ahead.pop(self._prefix)
            self._prefix += 1

    def next(self) -> Any:
        """The next result; ``StopIteration`` at the end (or once closed).

        Raises:
            the exception of a failed thread (the same object, with a note).
        """
        if self._closed:
            raise StopIteration
        try:
            out, idx, state, _ = self._window.get()
        except BufferClosed:
            raise StopIteration from None
        with self._lock:
            self._mark(idx, state)
        return out

    def get_state(self) -> dict[str, Any]:
        """What ``next()`` has returned, as the source's state plus indices beyond it."""
        with self._lock:
            base = self._prefix
            ahead = sorted(i - base for i in (*self._ahead, *self._skip))
            return {SOURCE_KEY: self._prefix_state, AHEAD_KEY: ahead}

    def stats(self) -> BufferStats:
        return self._window.stats()

    # -- lifecycle --------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the threads, drop what the window holds, join (bounded). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._runner.close()
