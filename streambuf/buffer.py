"""Byte- and count-bounded FIFO buffers: ``BoundedBuffer`` and ``ShardedBuffer``.

Invariants (DESIGN.md 1, 2, 4), kept under one lock and checked by property tests:

* **Byte bound.** Bytes held by a budget domain <= its byte limit, except that one item
  larger than the limit is admitted alone into an *empty* domain (never a deadlock) and
  counted in ``stats().oversize``. A domain is the whole buffer for ``BoundedBuffer`` and
  for ``ShardedBuffer(order="first_ready")`` (a shared pool), and one lane's slice of the
  budget for ``ShardedBuffer(order="round_robin")``.
* **Count bound.** Items held by a domain <= its item limit (so the total <= max_items).
* **FIFO.** Per lane, items leave in the order they were put. Producers blocked on one
  domain are admitted first come, first served, so a big item cannot be starved.
* **Deadlock freedom.** Round-robin delivery waits for one particular lane; a shared pool
  could then be filled by the other lanes and the awaited lane could never put. So
  round-robin budgets are *sharded*: each lane owns ``max_items // lanes`` slots and
  ``max_bytes // lanes`` bytes (remainders to the first lanes), and only ``set_limits``
  moves budget between lanes. First-ready delivery takes any ready item, so it may pool.

Ownership: an item belongs to the buffer from a successful ``put`` until ``get`` returns
it; the buffer never copies or inspects it beyond calling ``sizeof`` once, on the
producer's thread, before taking the lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Generic, Literal, TypeVar

from ._units import parse_bytes, parse_count
from .errors import BufferClosed
from .sizing import nbytes

__all__ = ["BoundedBuffer", "BufferStats", "ShardedBuffer"]

T = TypeVar("T")
Order = Literal["round_robin", "first_ready"]


@dataclass(frozen=True)
class BufferStats:
    """A frozen snapshot of a buffer (or of one lane, in ``lanes``).

    Attributes:
        items, bytes: held now.
        max_items, max_bytes: the limits in force now (a lane's slice, for a lane).
        peak_items, peak_bytes: the most ever held at once.
        oversize: items admitted alone because they were larger than ``max_bytes``.
        puts, gets: items put and taken so far.
        put_wait_s: total seconds producers spent blocked in ``put``.
        get_wait_s: total seconds consumers spent blocked in ``get``.
        empty_gets: ``get`` calls that found nothing ready and had to wait (the
            depth tuner's signal: the consumer is starved).
        lanes: one snapshot per lane (``ShardedBuffer`` only; empty otherwise).
    """

    items: int
    bytes: int
    max_items: int
    max_bytes: int
    peak_items: int
    peak_bytes: int
    oversize: int
    puts: int
    gets: int
    put_wait_s: float
    get_wait_s: float
    empty_gets: int
    lanes: tuple[BufferStats, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Flat dict for loggers (lanes as a list of dicts)."""
        return asdict(self)


class _Lane:
    __slots__ = (
        "bytes",
        "done",
        "empty_gets",
        "get_wait_s",
        "gets",
        "max_bytes",
        "max_items",
        "oversize",
        "peak_bytes",
        "peak_items",
        "put_wait_s",
        "puts",
        "q",
        "waiters",
    )

    def __init__(self) -> None:
        self.q: deque[tuple[Any, int]] = deque()
        self.bytes = 0
        self.done = False
        self.max_items = 0
        self.max_bytes = 0
        self.peak_items = self.peak_bytes = self.oversize = 0
        self.puts = self.gets = self.empty_gets = 0
        self.put_wait_s = self.get_wait_s = 0.0
        self.waiters: deque[threading.Condition] = deque()

    def snapshot(self) -> BufferStats:
        return BufferStats(
            items=len(self.q),
            bytes=self.bytes,
            max_items=self.max_items,
            max_bytes=self.max_bytes,
            peak_items=self.peak_items,
            peak_bytes=self.peak_bytes,
            oversize=self.oversize,
            puts=self.puts,
            gets=self.gets,
            put_wait_s=self.put_wait_s,
            get_wait_s=self.get_wait_s,
            empty_gets=self.empty_gets,
        )


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class _Engine(Generic[T]):
    """Shared implementation: one lock, per-lane FIFOs, pooled or sharded budgets."""

    def __init__(
        self,
        *,
        lanes: int,
        max_items: int,
        max_bytes: int | str,
        pooled: bool,
        sizeof: Callable[[Any], int],
    ) -> None:
        self._nlanes = parse_count(lanes, name="lanes")
        self._max_items = parse_count(max_items, name="max_items")
        self._max_bytes = parse_bytes(max_bytes)
        self._pooled = pooled
        if not pooled and self._max_items < self._nlanes:
            raise ValueError(
                f"max_items={max_items} must be >= lanes={lanes} with order='round_robin': "
                "each lane owns at least one slot, which is what makes in-order delivery "
                "deadlock-free; raise max_items or use order='first_ready'"
            )
        self._sizeof = sizeof
        self._lock = threading.Lock()
        # Getters share one condition; each blocked put waits on its own condition in a
        # FIFO, so a get wakes exactly the producer that may now proceed (no herd).
        self._not_empty = threading.Condition(self._lock)
        self._lanes = [_Lane() for _ in range(self._nlanes)]
        self._pool_waiters: deque[threading.Condition] = deque()
        self._items = 0
        self._bytes = 0
        self._peak_items = self._peak_bytes = self._oversize = 0
        self._puts = self._gets = self._empty_gets = 0
        self._put_wait_s = self._get_wait_s = 0.0
        self._put_waiting = 0
        self._get_waiting = 0
        self._closed = False
        self._error: BaseException | None = None
        self._arrivals: deque[int] = deque()  # lane of each held item, arrival order
        self._rotation = list(range(self._nlanes))
        self._cursor = 0
        self._observer: Callable[[_Engine[Any]], None] | None = None  # tests only
        self._apply_limits()

    # -- limits ---------------------------------------------------------------------
    def _apply_limits(self) -> None:
        if self._pooled:
            for lane in self._lanes:
                lane.max_items, lane.max_bytes = self._max_items, self._max_bytes
        else:
            items = _split(self._max_items, self._nlanes)
            nbytes_ = _split(self._max_bytes, self._nlanes)
            for lane, i, b in zip(self._lanes, items, nbytes_):
                lane.max_items, lane.max_bytes = i, max(1, b)

    def set_limits(
        self, *, max_items: int | None = None, max_bytes: int | str | None = None
    ) -> None:
        """Change the bounds at run time.

        Growing admits waiting producers at once; shrinking never drops an item, it only
        holds further puts until the buffer has drained below the new bounds.
        """
        new_items = (
            self._max_items if max_items is None else parse_count(max_items, name="max_items")
        )
        new_bytes = self._max_bytes if max_bytes is None else parse_bytes(max_bytes)
        if not self._pooled and new_items < self._nlanes:
            raise ValueError(f"max_items={new_items} must be >= lanes={self._nlanes}")
        with self._lock:
            self._max_items, self._max_bytes = new_items, new_bytes
            self._apply_limits()
            self._wake_all_puts()

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    # -- put ------------------------------------------------------------------------
    def _fits(self, lane: _Lane, size: int) -> bool:
        if self._pooled:
            if self._items == 0:
                return True
            return self._items < self._max_items and self._bytes + size <= self._max_bytes
        n = len(lane.q)
        if n == 0:
            return True
        return n < lane.max_items and lane.bytes + size <= lane.max_bytes

    def _put(self, index: int, item: Any, timeout_s: float | None) -> None:
        size = int(self._sizeof(item))
        lane = self._lanes[index]
        with self._lock:
            if self._closed:
                raise BufferClosed("put() on a closed buffer")
            if lane.done:
                raise BufferClosed(f"put() on lane {index}, which was already finished")
            waiters = self._pool_waiters if self._pooled else lane.waiters
            if waiters or not self._fits(lane, size):
                self._wait_for_room(lane, waiters, size, timeout_s)
            self._admit(index, lane, item, size)

    def _await_slot(self, index: int, timeout_s: float | None = None) -> None:
        """Block until lane ``index`` has room for one more item of size 0 (a free slot
        and bytes below its limit). Producers call it *before* making an item, so the
        item being made counts against the lane: items alive <= the lane's bound + 1."""
        lane = self._lanes[index]
        with self._lock:
            if self._closed:
                raise BufferClosed("buffer closed")
            waiters = self._pool_waiters if self._pooled else lane.waiters
            if waiters or not self._fits(lane, 0) or len(lane.q) >= lane.max_items:
                self._wait_for_room(lane, waiters, 0, timeout_s, slot=True)

    def _wait_for_room(
        self,
        lane: _Lane,
        waiters: deque[threading.Condition],
        size: int,
        timeout_s: float | None,
        *,
        slot: bool = False,
    ) -> None:
        token = threading.Condition(self._lock)
        waiters.append(token)
        self._put_waiting += 1
        t0 = time.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        try:
            while True:
                if self._closed:
                    raise BufferClosed("buffer closed while put() was waiting")
                if waiters[0] is token and self._fits(lane, size):
                    if not slot or len(lane.q) < lane.max_items:  # a slot: never "alone"
                        return
                if deadline is None:
                    token.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"put() found no room within {timeout_s} s")
                    token.wait(left)
        finally:
            waiters.remove(token)
            self._put_waiting -= 1
            if waiters:
                waiters[0].notify()  # the next waiter may now be at the head
            waited = time.monotonic() - t0
            lane.put_wait_s += waited
            self._put_wait_s += waited

    def _admit(self, index: int, lane: _Lane, item: Any, size: int) -> None:
        limit = self._max_bytes if self._pooled else lane.max_bytes
        if size > limit:
            lane.oversize += 1
            self._oversize += 1
        lane.q.append((item, size))
        lane.bytes += size
        lane.puts += 1
        n = len(lane.q)
        if n > lane.peak_items:
            lane.peak_items = n
        if lane.bytes > lane.peak_bytes:
            lane.peak_bytes = lane.bytes
        self._items += 1
        self._bytes += size
        self._puts += 1
        if self._items > self._peak_items:
            self._peak_items = self._items
        if self._bytes > self._peak_bytes:
            self._peak_bytes = self._bytes
        if self._pooled and self._nlanes > 1:
            self._arrivals.append(index)
        if self._observer is not None:
            self._observer(self)
        if self._get_waiting:
            rot = self._rotation
            if self._pooled or not rot or rot[self._cursor % len(rot)] == index:
                self._not_empty.notify_all()  # round-robin: only the awaited lane matters

    def _wake_all_puts(self) -> None:
        for waiters in (self._pool_waiters, *(ln.waiters for ln in self._lanes)):
            for cond in waiters:
                cond.notify()

    def _finish(self, index: int) -> None:
        with self._lock:
            self._lanes[index].done = True
            self._not_empty.notify_all()

    # -- get ------------------------------------------------------------------------
    def _ready(self) -> int | None:
        """The lane to deliver from now, or None (nothing ready). Caller holds the lock."""
        if self._pooled:
            if self._nlanes == 1:
                return 0 if self._items else None
            return self._arrivals[0] if self._arrivals else None
        rot = self._rotation
        while rot:
            if self._cursor >= len(rot):
                self._cursor = 0
            index = rot[self._cursor]
            lane = self._lanes[index]
            if lane.q:
                return index
            if lane.done or self._closed:
                del rot[self._cursor]  # finished and drained: skip it from now on
                continue
            return None
        return None

    def _ended(self) -> bool:
        if self._pooled:
            return self._items == 0 and (self._closed or all(ln.done for ln in self._lanes))
        return not self._rotation

    def _get(self, timeout_s: float | None) -> T:
        with self._lock:
            index = self._ready()
            if index is None:
                index = self._wait_for_item(timeout_s)
            lane = self._lanes[index]
            item, size = lane.q.popleft()
            lane.bytes -= size
            lane.gets += 1
            self._items -= 1
            self._bytes -= size
            self._gets += 1
            if not self._pooled:
                self._cursor += 1
            elif self._nlanes > 1:
                self._arrivals.popleft()
            if self._observer is not None:
                self._observer(self)
            if self._put_waiting:
                waiters = self._pool_waiters if self._pooled else lane.waiters
                if waiters:
                    waiters[0].notify()
            return item

    def _wait_for_item(self, timeout_s: float | None) -> int:
        if self._error is not None:
            raise self._error
        if self._ended():
            raise BufferClosed("buffer closed and drained")
        self._empty_gets += 1
        waiting_on = None if self._pooled else self._rotation[self._cursor % len(self._rotation)]
        if waiting_on is not None:
            self._lanes[waiting_on].empty_gets += 1
        self._get_waiting += 1
        t0 = time.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        try:
            while True:
                if self._error is not None:
                    raise self._error
                index = self._ready()
                if index is not None:
                    return index
                if self._ended():
                    raise BufferClosed("buffer closed and drained")
                if deadline is None:
                    self._not_empty.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"get() found no item within {timeout_s} s")
                    self._not_empty.wait(left)
        finally:
            self._get_waiting -= 1
            waited = time.monotonic() - t0
            self._get_wait_s += waited
            if waiting_on is not None:
                self._lanes[waiting_on].get_wait_s += waited

    # -- lifecycle ------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting items and wake every waiter. Idempotent.

        Blocked and later puts raise ``BufferClosed``; gets drain what is held, then
        raise ``BufferClosed`` (iteration simply ends).
        """
        with self._lock:
            self._closed = True
            self._wake_all_puts()
            self._not_empty.notify_all()

    def abort(self, exc: BaseException) -> None:
        """Close, drop every held item, and make every current and later ``get`` raise ``exc``.

        Used to hand a producer's failure to the consumer without delay.
        """
        with self._lock:
            if self._error is None:
                self._error = exc
            self._closed = True
            for lane in self._lanes:
                lane.q.clear()
                lane.bytes = 0
            self._arrivals.clear()
            self._items = self._bytes = 0
            self._wake_all_puts()
            self._not_empty.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self._items

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[T]:
        """Yield items until the buffer is closed (or all lanes finished) and drained."""
        while True:
            try:
                yield self._get(None)
            except BufferClosed:
                return

    def stats(self) -> BufferStats:
        """A consistent snapshot of counters and limits (see ``BufferStats``)."""
        with self._lock:
            lanes = tuple(ln.snapshot() for ln in self._lanes) if self._nlanes > 1 else ()
            return BufferStats(
                items=self._items,
                bytes=self._bytes,
                max_items=self._max_items,
                max_bytes=self._max_bytes,
                peak_items=self._peak_items,
                peak_bytes=self._peak_bytes,
                oversize=self._oversize,
                puts=self._puts,
                gets=self._gets,
                put_wait_s=self._put_wait_s,
                get_wait_s=self._get_wait_s,
                empty_gets=self._empty_gets,
                lanes=lanes,
            )


class BoundedBuffer(_Engine[T]):
    """A thread-safe FIFO bounded by an item count and a byte budget.

    Args:
        max_items: at most this many items held (>= 1).
        max_bytes: at most this many bytes held (int or "512MiB"); one item larger than
            this is admitted alone into an empty buffer and counted in ``oversize``.
        sizeof: the size of an item in bytes; ``streambuf.nbytes`` by default.

    Example::

        with BoundedBuffer(max_items=8, max_bytes="64MiB") as buf:
            buf.put(b"x" * 1024)
            assert buf.get() == b"x" * 1024
    """

    def __init__(
        self,
        *,
        max_items: int,
        max_bytes: int | str,
        sizeof: Callable[[Any], int] = nbytes,
    ) -> None:
        super().__init__(
            lanes=1, max_items=max_items, max_bytes=max_bytes, pooled=True, sizeof=sizeof
        )

    def put(self, item: T, *, timeout_s: float | None = None) -> None:
        """Add ``item``, blocking while it would exceed a bound.

        Raises:
            BufferClosed: the buffer is (or gets) closed.
            TimeoutError: no room within ``timeout_s`` seconds.
        """
        self._put(0, item, timeout_s)

    def get(self, *, timeout_s: float | None = None) -> T:
        """Remove and return the oldest item, blocking while the buffer is empty.

        Raises:
            BufferClosed: the buffer is closed and drained.
            TimeoutError: nothing arrived within ``timeout_s`` seconds.
        """
        return self._get(timeout_s)


class ShardedBuffer(_Engine[T]):
    """One FIFO per lane (one shard stream or producer each), bounded in items and bytes.

    Args:
        lanes: number of lanes (>= 1).
        max_items, max_bytes: total bounds. Under ``"round_robin"`` they are split
            evenly into per-lane slices (so ``max_items >= lanes``); under
            ``"first_ready"`` the lanes share one pool.
        order: ``"round_robin"`` delivers lane 0, 1, ..., lanes-1, 0, ... skipping lanes
            that are finished and drained: a deterministic order that does not depend on
            timing. ``"first_ready"`` delivers items in the order they arrived, so a slow
            lane never blocks the others (no head-of-line blocking).
        sizeof: item size in bytes; ``streambuf.nbytes`` by default.

    Producers call ``put(lane, item)`` then ``finish(lane)``; iteration ends once every
    lane is finished and drained, or after ``close()`` and a drain.
    """

    def __init__(
        self,
        *,
        lanes: int,
        max_items: int,
        max_bytes: int | str,
        order: Order = "round_robin",
        sizeof: Callable[[Any], int] = nbytes,
    ) -> None:
        if order not in ("round_robin", "first_ready"):
            raise ValueError(f"order={order!r} must be 'round_robin' or 'first_ready'")
        self.order: Order = order
        super().__init__(
            lanes=lanes,
            max_items=max_items,
            max_bytes=max_bytes,
            pooled=order == "first_ready",
            sizeof=sizeof,
        )

    @property
    def lanes(self) -> int:
        return self._nlanes

    def put(self, lane: int, item: T, *, timeout_s: float | None = None) -> None:
        """Add ``item`` to ``lane``, blocking while the lane (or the pool) is full.

        Raises:
            BufferClosed: the buffer is closed, or ``lane`` was finished.
            TimeoutError: no room within ``timeout_s`` seconds.
            IndexError: no such lane.
        """
        if not 0 <= lane < self._nlanes:
            raise IndexError(f"lane={lane} out of range for lanes={self._nlanes}")
        self._put(lane, item, timeout_s)

    def finish(self, lane: int) -> None:
        """Mark ``lane`` as having no more items (its producer is done). Idempotent."""
        self._finish(lane)

    def get(self, *, timeout_s: float | None = None) -> T:
        """Next item in this buffer's order (see ``order``).

        Raises:
            BufferClosed: every lane is finished and drained, or closed and drained.
            TimeoutError: nothing ready within ``timeout_s`` seconds.
        """
        return self._get(timeout_s)
