"""``MapRun``: the threads, byte accounting and state behind ``ParallelMapper`` and
``Prefetcher`` (one run = one iteration of a node, from one ``reset`` to the next).

``threads`` threads pull from the source node (one at a time: a lock serialises it), apply
``map_fn`` outside that lock (the concurrency: I/O and GIL-releasing decode) and put the
results into byte- and count-bounded buffers (``streambuf.buffer``) that ``next()`` takes
from.

Byte accounting (docs/design.md invariants 1, 2 and 4, over everything a run holds):

* **Reserve before build.** Before pulling its next item a thread reserves room for it
  (its estimate: the largest result so far, or before the first its thread's share of
  ``max_bytes``), so items being pulled and mapped count like queued ones.
* **Never over the bound.** A result that fits its reservation takes its place; a larger
  one gives the reservation back and waits, in its thread and outside the count, for
  room at its real size (admitted alone into an empty buffer when it is larger than the
  bound, counted in ``oversize``). So queued + reserved bytes never exceed the bound,
  oversize alone excepted. (The package's ``LaneRunner`` puts such a result over the
  bound; hence this runner.)
* **One pool.** ``max_items`` and ``max_bytes`` bound the run as a whole.
  ``in_order=True``: an ``OrderedWindow`` (``streambuf.nodes._window``: reservations in
  pull order and a hand-off of the next item, so in-order delivery from one pool cannot
  deadlock); ``in_order=False``: a pooled ``ShardedBuffer`` (``order="first_ready"``),
  arrival order. Whichever thread is free pulls the next item.

State (torchdata's rule: it describes exactly the items ``next()`` returned): each pull
captures ``source.state_dict()`` with the item, under the source lock, as ``(index,
state after it)``. The run's state is the source state after the longest delivered
prefix of indices, plus the indices delivered beyond it (relative to it)::

    {"source": <source state>, "delivered_ahead": [i, ...]}

A run resumed from it resets the source to ``"source"`` and drops the items at
``"delivered_ahead"`` when it pulls them (never mapped, never delivered again).

Errors: an exception in the source, ``map_fn`` or ``sizeof`` reaches ``next()`` as the
same object, with a note naming the node, the thread and the item; held items are
dropped. Shutdown: ``close()`` aborts the buffers (drops what they hold, wakes every
blocked thread) and joins the threads within ``join_timeout_s``; after ``close()`` the
threads never touch the source again (each pull checks, under the source lock). A thread
stuck in ``map_fn`` is a daemon, logged; it ends at its next reserve or put.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from .._threads import join_all
from .._units import check_size
from ..buffer import ShardedBuffer
from ..errors import BufferClosed, add_note
from ..stats import BufferStats
from ._window import OrderedWindow

__all__ = ["AHEAD_KEY", "SOURCE_KEY", "MapRun"]

SOURCE_KEY = "source"
AHEAD_KEY = "delivered_ahead"

# (result, source index, source state after it, bytes): the size rides along, measured once
Rec = tuple[Any, int, Any, int]
_rec_size = operator.itemgetter(3)


class _Pool:
    """As-ready delivery (the alternative to ``OrderedWindow``): one pooled
    ``ShardedBuffer`` (arrival order), a lane per thread."""

    def __init__(self, *, threads: int, max_items: int, max_bytes: int) -> None:
        self.buf: ShardedBuffer[Rec] = ShardedBuffer(
            lanes=threads,
            max_items=max_items,
            max_bytes=max_bytes,
            order="first_ready",
            sizeof=_rec_size,
        )

    def put(self, t: int, rec: Rec, est: int) -> None:
        if rec[3] <= est:
            self.buf.put(t, rec, reserved=est)
        else:  # larger than its room: wait for room at its real size
            self.buf.cancel(t, est)
            self.buf.put(t, rec)


class MapRun:
    """One iteration of a node; see the module docstring.

    Ownership: the run owns its threads and buffers; the source and ``src_lock`` belong to
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
        self._join_timeout_s = join_timeout_s
        self._src_lock = src_lock
        self._window = (
            OrderedWindow(threads=threads, max_items=max_items, max_bytes=max_bytes)
            if in_order
            else None
        )
        self._pool = (
            None if in_order else _Pool(threads=threads, max_items=max_items, max_bytes=max_bytes)
        )
        self._share = max(1, max_bytes // threads)  # the first estimate of each thread
        self._largest = -1  # bytes of the largest result so far (any thread)
        self._lock = threading.Lock()  # guards the delivered-state tracking below
        self._pulled = 0  # source items pulled (their indices); under src_lock
        self._issued = 0  # sequence numbers handed out (skipped items get none)
        self._ended = False  # the source is exhausted, or a thread failed
        self._closed = False
        self._prefix = 0  # every index < _prefix was delivered (or skipped)
        self._prefix_state = start_state  # the source's state after index _prefix - 1
        self._ahead: dict[int, Any] = {}  # delivered indices >= _prefix -> state after each
        self._skip = set(skip)  # delivered before the checkpoint, not pulled again yet
        self._threads = [
            threading.Thread(
                target=self._work, args=(t,), name=f"streambuf-{name}-{t}", daemon=True
            )
            for t in range(threads)
        ]
        for th in self._threads:
            th.start()

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

    def _work(self, t: int) -> None:
        reserve: Callable[[int], None]
        cancel: Callable[[int], None]
        finish: Callable[[], None]
        put: Callable[[int, Rec, int], None]
        if self._window is not None:
            w = self._window
            reserve, cancel, finish = w.reserve, w.cancel, w.finish

            def put(seq: int, rec: Rec, est: int) -> None:
                w.put(seq, rec, rec[3], est)
        else:
            pool = self._pool
            assert pool is not None
            reserve, cancel = partial(pool.buf.reserve, t), partial(pool.buf.cancel, t)
            finish = partial(pool.buf.finish, t)

            def put(seq: int, rec: Rec, est: int) -> None:
                pool.put(t, rec, est)

        fn, sizeof = self._fn, self._sizeof
        doing = "pulling from its source"
        try:
            while True:
                est = self._largest if self._largest >= 0 else self._share
                reserve(est)
                try:
                    doing = "pulling from its source"
                    got = self._pull()
                    if got is None:
                        cancel(est)
                        return
                    seq, idx, item, state = got
                    doing = f"mapping item #{seq}"
                    out = item if fn is None else fn(item)
                    size = check_size(sizeof(out))
                except BaseException:
                    cancel(est)
                    raise
                if size > self._largest:  # before put, which may wait: others learn now
                    self._largest = size
                put(seq, (out, idx, state, size), est)
                del got, item, out  # a thread blocked in reserve must not pin the last result
        except BufferClosed:
            pass  # closed by reset/shutdown, or another thread failed
        except BaseException as exc:
            if isinstance(exc, StopIteration):  # from map_fn: it must not end the stream
                cause, exc = exc, RuntimeError(f"map_fn raised StopIteration ({exc!r})")
                exc.__cause__ = cause
            add_note(
                exc,
                f"streambuf: raised in node {self.name!r} on thread "
                f"{threading.current_thread().name!r} while {doing}",
            )
            self._fail(exc)
        finally:
            finish()

    def _abort(self, exc: BaseException) -> None:
        if self._window is not None:
            self._window.abort(exc)
        if self._pool is not None:
            self._pool.buf.abort(exc)

    def _fail(self, exc: BaseException) -> None:
        self._ended = True  # no thread pulls again
        self._abort(exc)  # the first error wins: next() raises it

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
            if self._window is not None:
                out, idx, state, _ = self._window.get()
            else:
                assert self._pool is not None
                out, idx, state, _ = self._pool.buf.get()
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
        if self._window is not None:
            return self._window.stats()
        assert self._pool is not None
        return self._pool.buf.stats()

    # -- lifecycle --------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the threads, drop what the buffers hold, join (bounded). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._abort(BufferClosed(f"node {self.name!r} was reset or shut down"))
        join_all(
            self._threads, timeout_s=self._join_timeout_s, stops_when="at its next reserve or put"
        )
