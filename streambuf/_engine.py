"""The lock, lanes and bounds behind ``BoundedBuffer`` and ``ShardedBuffer``.

A *budget domain* is the whole buffer when pooled and one lane's slice when sharded.
What a domain holds is its queued items **plus its reservations**: a producer may
``reserve`` room for an item before it builds it (``put(..., reserved=n)`` then turns the
reservation into the item, ``cancel`` gives it back), so an item under construction
counts against the bounds exactly like a queued one. The bounds (docs/design.md 1, 2):

* held items (queued + reserved) <= the domain's item limit;
* held bytes (queued + reserved) <= the domain's byte limit, except that one item (or
  reservation) larger than the limit is admitted alone into an *empty* domain (never a
  deadlock) and counted in ``oversize``. An item larger than its reservation is still
  put (it exists); the producer's estimate is then too small, which the lane runner
  corrects (``streambuf._lanes``).

Producers blocked on one domain are admitted first come, first served, each sleeping on
its own ``_Waiter`` (a get wakes exactly the producer that may proceed; no herd). Blocked
consumers sleep on theirs too: a put into a shared pool wakes one of them (and takes it
off the list, so the next put wakes the next), and a wake already posted costs nothing,
so an item handed over while the other side is still waking up pays no notify.
"""

from __future__ import annotations

import threading
import time
from _thread import allocate_lock
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from ._units import _is_integer, check_nbytes, check_size, parse_bytes, parse_count
from .errors import BufferClosed
from .stats import BufferStats

T = TypeVar("T")


class _Waiter:
    """One blocked thread's wake-up call: a raw lock it sleeps on, and whether a wake is
    posted. Both are touched only under the engine's lock, so a wake is posted at most
    once per sleep (again is a no-op) and a timeout racing a wake loses nothing."""

    __slots__ = ("_gate", "woken")

    def __init__(self) -> None:
        self._gate = allocate_lock()
        self._gate.acquire()
        self.woken = False

    def wake(self) -> None:
        """Caller holds the engine lock."""
        if not self.woken:
            self.woken = True
            self._gate.release()

    def sleep(self, lock: Any, timeout: float | None) -> None:
        """Release ``lock`` (held), sleep until woken or ``timeout``, take ``lock`` back."""
        lock.release()
        try:
            if timeout is None:
                self._gate.acquire()
            else:
                self._gate.acquire(True, max(timeout, 0.0))
        finally:
            lock.acquire()
        if self.woken:  # re-arm; a wake that came after the timeout is taken here
            self._gate.acquire(False)
            self.woken = False


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
        "reserved",
        "reserved_bytes",
        "sizes",
        "waiters",
    )

    def __init__(self) -> None:
        self.q: deque[Any] = deque()  # the queued items, oldest first
        self.sizes: deque[int] = deque()  # their sizes, in step with q
        self.bytes = 0  # queued + reserved
        self.reserved = 0  # reservations not yet turned into items
        self.reserved_bytes = 0  # their bytes (a cancel or a put gives back at most this)
        self.done = False
        self.max_items = 0
        self.max_bytes = 0
        self.peak_items = self.peak_bytes = self.oversize = 0
        self.puts = self.gets = self.empty_gets = 0
        self.put_wait_s = self.get_wait_s = 0.0
        self.waiters: deque[_Waiter] = deque()

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


class Engine(Generic[T]):
    """Shared implementation: one lock, per-lane FIFOs, pooled or sharded budgets."""

    def __init__(
        self,
        *,
        lanes: int,
        max_items: int,
        max_bytes: int | str,
        pooled: bool,
        sizeof: Callable[[Any], int],
        start_lane: int = 0,
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
        self._lanes = [_Lane() for _ in range(self._nlanes)]
        self._pool_waiters: deque[_Waiter] = deque()
        self._get_waiters: deque[_Waiter] = deque()  # consumers asleep, none woken yet
        self._items = 0  # queued
        self._reserved = 0  # reservations, all lanes
        self._bytes = 0  # queued + reserved
        self._peak_items = self._peak_bytes = self._oversize = 0
        self._puts = self._gets = self._empty_gets = 0
        self._put_wait_s = self._get_wait_s = 0.0
        self._put_waiting = 0
        self._closed = False
        self._error: BaseException | None = None
        self._arrivals: deque[int] = deque()  # lane of each queued item, arrival order
        self._rotation = list(range(self._nlanes))
        if isinstance(start_lane, bool) or not _is_integer(start_lane):
            raise TypeError(f"start_lane={start_lane!r} must be an int lane index")
        self._cursor = int(start_lane) % self._nlanes  # (a negative one counts from the end)
        self._observer: Callable[[Engine[Any]], None] | None = None  # tests only
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

    def _lane_limit(self, index: int) -> int:
        """Lane ``index``'s share of the byte bound (its slice; pooled: an even share)."""
        if self._pooled:
            return max(1, self._max_bytes // self._nlanes)
        return self._lanes[index].max_bytes

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    # -- put ------------------------------------------------------------------------
    def _fits(self, lane: _Lane, size: int) -> bool:
        if self._pooled:
            n = self._items + self._reserved
            if n == 0:
                return True
            return n < self._max_items and self._bytes + size <= self._max_bytes
        n = len(lane.q) + lane.reserved
        if n == 0:
            return True
        return n < lane.max_items and lane.bytes + size <= lane.max_bytes

    def _check_open(self, index: int) -> _Lane:
        if self._closed:
            raise BufferClosed("put() on a closed buffer")
        lane = self._lanes[index]
        if lane.done:
            raise BufferClosed(f"put() on lane {index}, which was already finished")
        return lane

    def _put(
        self,
        index: int,
        item: Any,
        timeout_s: float | None,
        reserved: int | None,
        size: int | None = None,
    ) -> None:
        if size is None:
            size = check_size(self._sizeof(item))
        if reserved is not None:
            reserved = check_nbytes(reserved, name="reserved")
        with self._lock:
            lane = self._check_open(index)
            if reserved is not None:  # room was taken by reserve(): never waits
                self._give_back(index, lane, reserved, "put(reserved=...)")
            else:
                waiters = self._pool_waiters if self._pooled else lane.waiters
                if waiters or not self._fits(lane, size):
                    self._wait_for_room(lane, waiters, size, timeout_s)
            self._admit(index, lane, item, size)

    def _reserve(self, index: int, nbytes: int, timeout_s: float | None) -> None:
        nbytes = check_nbytes(nbytes, name="nbytes")  # (before anything is counted)
        with self._lock:
            lane = self._check_open(index)
            waiters = self._pool_waiters if self._pooled else lane.waiters
            if waiters or not self._fits(lane, nbytes):
                self._wait_for_room(lane, waiters, nbytes, timeout_s)
            lane.reserved += 1
            lane.reserved_bytes += nbytes
            self._reserved += 1
            self._count_bytes(lane, nbytes)
            if nbytes > (self._max_bytes if self._pooled else lane.max_bytes):
                lane.oversize += 1
                self._oversize += 1
            if self._observer is not None:
                self._observer(self)

    def _give_back(self, index: int, lane: _Lane, nbytes: int, what: str) -> None:
        """Turn one reservation of ``nbytes`` on ``lane`` back (lock held): refused, with
        nothing counted, where the lane holds no reservation or fewer bytes reserved (a
        cancel without a reserve, or twice, would free room that is not there and let
        the bounds be passed)."""
        if lane.reserved <= 0:
            raise ValueError(f"{what} on lane {index}, which holds no reservation: reserve() first")
        if nbytes > lane.reserved_bytes:
            raise ValueError(
                f"{what} gives back {nbytes} bytes on lane {index}, whose reservations hold "
                f"{lane.reserved_bytes}: give back what reserve() took"
            )
        lane.reserved -= 1
        lane.reserved_bytes -= nbytes
        self._reserved -= 1
        lane.bytes -= nbytes
        self._bytes -= nbytes

    def _cancel(self, index: int, nbytes: int) -> None:
        nbytes = check_nbytes(nbytes, name="nbytes")
        with self._lock:
            if self._closed:
                return  # close()/abort() already forgot every reservation
            lane = self._lanes[index]
            self._give_back(index, lane, nbytes, "cancel()")
            waiters = self._pool_waiters if self._pooled else lane.waiters
            if waiters:
                waiters[0].wake()

    def _count_bytes(self, lane: _Lane, size: int) -> None:
        lane.bytes += size
        self._bytes += size
        if lane.bytes > lane.peak_bytes:
            lane.peak_bytes = lane.bytes
        if self._bytes > self._peak_bytes:
            self._peak_bytes = self._bytes

    def _wait_for_room(
        self,
        lane: _Lane,
        waiters: deque[_Waiter],
        size: int,
        timeout_s: float | None,
    ) -> None:
        token = _Waiter()
        waiters.append(token)
        self._put_waiting += 1
        t0 = time.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        try:
            while True:
                if self._closed:
                    raise BufferClosed("buffer closed while put() was waiting")
                if waiters[0] is token and self._fits(lane, size):
                    return
                if deadline is None:
                    token.sleep(self._lock, None)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"put() found no room within {timeout_s} s")
                    token.sleep(self._lock, left)
        finally:
            waiters.remove(token)
            self._put_waiting -= 1
            if waiters:
                waiters[0].wake()  # the next waiter may now be at the head
            waited = time.monotonic() - t0
            lane.put_wait_s += waited
            self._put_wait_s += waited

    def _admit(self, index: int, lane: _Lane, item: Any, size: int) -> None:
        limit = self._max_bytes if self._pooled else lane.max_bytes
        if size > limit:
            lane.oversize += 1
            self._oversize += 1
        lane.q.append(item)
        lane.sizes.append(size)
        self._count_bytes(lane, size)
        lane.puts += 1
        n = len(lane.q)
        if n > lane.peak_items:
            lane.peak_items = n
        self._items += 1
        self._puts += 1
        if self._items > self._peak_items:
            self._peak_items = self._items
        if self._pooled and self._nlanes > 1:
            self._arrivals.append(index)
        if self._observer is not None:
            self._observer(self)
        if self._get_waiters:
            if self._pooled:
                self._get_waiters.popleft().wake()  # one new item: one consumer
            else:
                rot = self._rotation
                if not rot or rot[self._cursor % len(rot)] == index:
                    self._wake_all_gets()  # round-robin: only the awaited lane matters

    def _wake_all_puts(self) -> None:
        for waiters in (self._pool_waiters, *(ln.waiters for ln in self._lanes)):
            for token in waiters:
                token.wake()

    def _wake_all_gets(self) -> None:
        waiters = self._get_waiters
        while waiters:
            waiters.popleft().wake()

    def _finish(self, index: int) -> None:
        with self._lock:
            self._lanes[index].done = True
            self._wake_all_gets()

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
            item = lane.q.popleft()
            size = lane.sizes.popleft()
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
                    waiters[0].wake()
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
        token = _Waiter()
        waiters = self._get_waiters
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
                left = None
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"get() found no item within {timeout_s} s")
                waiters.append(token)  # a waker takes it off the list
                token.sleep(self._lock, left)
                if token in waiters:  # timed out unwoken
                    waiters.remove(token)
        finally:
            if token in waiters:  # interrupted in its sleep
                waiters.remove(token)
            waited = time.monotonic() - t0
            self._get_wait_s += waited
            if waiting_on is not None:
                self._lanes[waiting_on].get_wait_s += waited

    def _restart_at(self, index: int) -> None:
        """Round robin: deliver from lane ``index`` next (the buffer must be empty: a
        producer skipped items that were delivered another way)."""
        with self._lock:
            if self._items:
                raise RuntimeError("_restart_at() on a buffer that holds items")
            if index in self._rotation:
                self._cursor = self._rotation.index(index)

    # -- lifecycle ------------------------------------------------------------------
    def _forget_reservations(self) -> None:
        """After close: producers' reservations are void (their puts will fail)."""
        for ln in self._lanes:
            ln.bytes = sum(ln.sizes)
            ln.reserved = ln.reserved_bytes = 0
        self._reserved = 0
        self._bytes = sum(ln.bytes for ln in self._lanes)

    def close(self) -> None:
        """Stop accepting items and wake every waiter. Idempotent.

        Blocked and later puts and reservations raise ``BufferClosed``; gets drain what
        is queued, then raise ``BufferClosed`` (iteration simply ends).
        """
        with self._lock:
            self._closed = True
            self._forget_reservations()
            self._wake_all_puts()
            self._wake_all_gets()

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
                lane.sizes.clear()
            self._arrivals.clear()
            self._items = 0
            self._forget_reservations()
            self._wake_all_puts()
            self._wake_all_gets()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self._items

    @property
    def nbytes(self) -> int:
        """Bytes held now (queued and reserved)."""
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
