"""Byte- and count-bounded FIFO buffers: ``BoundedBuffer`` and ``ShardedBuffer``.

Invariants (docs/design.md 1, 2, 4), kept under one lock and checked by property tests:

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

* **Reservations.** ``reserve(lane, nbytes)`` takes room for an item before it is built
  and ``put(lane, item, reserved=nbytes)`` turns it into the item (``cancel`` gives it
  back): what is being built counts like what is queued (``streambuf._engine``).

Ownership: an item belongs to the buffer from a successful ``put`` until ``get`` returns
it; the buffer never copies or inspects it beyond calling ``sizeof`` once, on the
producer's thread, before taking the lock.

``BoundedBuffer`` (one lane, one pool) has its own lean put and get: the default sizer's
exact-type table (``nbytes.exact``: ints, floats, str, bytes, tensors...) instead of its
dispatch, the bounds checked inline, no per-lane counters (``stats().lanes`` is empty for
one lane anyway), a consumer woken only when one sleeps, and ``put_many``/``get_many``,
which move a run of items under one lock acquisition. The bounds, the order and the
counters mean exactly what they mean in the engine (the same property tests run both).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

from ._engine import Engine
from ._units import _is_integer, check_size
from .errors import BufferClosed
from .sizing import nbytes
from .stats import BufferStats

__all__ = ["BoundedBuffer", "BufferStats", "Order", "ShardedBuffer"]

T = TypeVar("T")
Order = Literal["round_robin", "first_ready"]


class BoundedBuffer(Engine[T]):
    """A thread-safe FIFO bounded by an item count and a byte budget.

    Args:
        max_items: at most this many items held (>= 1).
        max_bytes: at most this many bytes held (int or "512MiB"); one item larger than
            this is admitted alone into an empty buffer and counted in ``oversize``.
        sizeof: the size of an item in bytes; ``streambuf.nbytes`` by default.

    ``put_many(items)`` and ``get_many(max_items)`` move runs of items through one lock
    acquisition each: ``put_many`` admits the items in order and blocks whenever the next
    one does not fit, exactly like a ``put`` per item (first come, first served among
    producers; the bounds hold at every item); ``get_many`` blocks like ``get`` while the
    buffer is empty, then returns every ready item, at most ``max_items``, oldest first.

    Example::

        with BoundedBuffer(max_items=8, max_bytes="64MiB") as buf:
            buf.put(b"x" * 1024)
            assert buf.get() == b"x" * 1024
            buf.put_many([1, 2, 3])
            assert buf.get_many(8) == [1, 2, 3]
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
        self._lane0 = self._lanes[0]
        self._q = self._lane0.q  # the queued items
        self._qs = self._lane0.sizes  # their sizes, in step
        # exact type -> sizer, for the default sizer only (the same numbers, no dispatch)
        self._exact: dict[type, Callable[[Any], int]] = nbytes.exact if sizeof is nbytes else {}

    def put(self, item: T, *, timeout_s: float | None = None, reserved: int | None = None) -> None:
        """Add ``item``, blocking while it would exceed a bound (never, with ``reserved``:
        the bytes taken by an earlier ``reserve``).

        Raises:
            BufferClosed: the buffer is (or gets) closed.
            TimeoutError: no room within ``timeout_s`` seconds.
        """
        sizer = self._exact.get(type(item))
        size = sizer(item) if sizer is not None else check_size(self._sizeof(item))
        if reserved is not None:
            self._put(0, item, timeout_s, reserved, size)
            return
        with self._lock:
            if self._closed:
                raise BufferClosed("put() on a closed buffer")
            n = self._items + self._reserved
            if self._pool_waiters or (
                n and (n >= self._max_items or self._bytes + size > self._max_bytes)
            ):
                self._wait_for_room(self._lane0, self._pool_waiters, size, timeout_s)
            self._q.append(item)
            self._qs.append(size)
            self._lane0.bytes += size
            held = self._bytes = self._bytes + size
            n = self._items = self._items + 1
            self._puts += 1
            if n > self._peak_items:
                self._peak_items = n
            if held > self._peak_bytes:
                self._peak_bytes = held
            if size > self._max_bytes:
                self._oversize += 1
            if self._observer is not None:
                self._observer(self)
            if self._get_waiters:
                self._get_waiters.popleft().wake()

    def put_many(self, items: Iterable[T], *, timeout_s: float | None = None) -> None:
        """Add ``items`` in order, as many per lock acquisition as fit, blocking whenever
        the next one does not fit, exactly like one ``put`` per item. ``timeout_s``
        bounds the whole call.

        Raises:
            BufferClosed: the buffer is (or gets) closed.
            TimeoutError: no room for the next item within ``timeout_s`` seconds.
            Either way the items before that one are in the buffer: the exception's
            ``admitted`` attribute says how many.
        """
        batch = list(items)
        sizes = self._sizes(batch)
        total = len(batch)
        lane, waiters = self._lane0, self._pool_waiters
        done = 0
        with self._lock:
            if self._closed:
                raise _admitted(BufferClosed("put_many() on a closed buffer"), 0)
            if total and not waiters and self._items + self._reserved + total <= self._max_items:
                added = sum(sizes)  # the usual case: the whole run fits now, at once
                if self._bytes + added <= self._max_bytes:
                    self._queue_run(batch, sizes, total, added, 0)
                    return
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while done < total:
                # the run that fits now, unless producers already wait (they go first)
                n = self._items + self._reserved
                held = self._bytes
                max_n, max_b = self._max_items, self._max_bytes
                end = done
                over = 0
                if not waiters:
                    fit = min(total - done, max_n - n)  # by count; then by bytes, at once:
                    if fit > 0:
                        run_bytes = sum(sizes[done : done + fit])
                        if held + run_bytes <= max_b:  # each item fits, none is oversize
                            end = done + fit
                            n += fit
                            held += run_bytes
                    while end < total:  # then item by item (an oversize one alone)
                        size = sizes[end]
                        if n and (n >= max_n or held + size > max_b):
                            break
                        if size > max_b:
                            over += 1
                        n += 1
                        held += size
                        end += 1
                if end == done:  # wait for room for the next item, like put()
                    left = None if deadline is None else deadline - time.monotonic()
                    try:
                        self._wait_for_room(lane, waiters, sizes[done], left)
                    except TimeoutError:  # (it counts the time left, not the call's)
                        exc = TimeoutError(
                            f"put_many() found no room for its item {done} within {timeout_s} s"
                        )
                        raise _admitted(exc, done) from None
                    except BufferClosed as exc:
                        raise _admitted(exc, done) from None
                    end = done + 1
                    over = 1 if sizes[done] > self._max_bytes else 0
                self._admit_run(batch, sizes, done, end, over)
                done = end

    def _sizes(self, batch: list[Any]) -> list[int]:
        """Each item's size, as ``put`` sizes it (one type with an exact sizer: mapped)."""
        exact, sizeof = self._exact, self._sizeof
        if batch:
            first = type(batch[0])
            sizer = exact.get(first)
            if sizer is not None and list(map(type, batch)).count(first) == len(batch):
                return list(map(sizer, batch))  # one exact type: mapped
        return [
            sizer(x) if (sizer := exact.get(type(x))) is not None else check_size(sizeof(x))
            for x in batch
        ]

    def _admit_run(
        self, batch: list[Any], sizes: list[int], start: int, end: int, over: int
    ) -> None:
        """Queue ``batch[start:end]``, which fits (lock held): the bounds are checked."""
        run = sizes[start:end]
        self._queue_run(batch[start:end], run, end - start, sum(run), over)

    def _queue_run(self, run: list[Any], sizes: list[int], k: int, added: int, over: int) -> None:
        """Queue ``run`` (``k`` items of ``sizes``, ``added`` bytes in all, ``over`` of
        them oversize), which fits (lock held): the bounds are checked."""
        self._q.extend(run)
        self._qs.extend(sizes)
        self._lane0.bytes += added
        held = self._bytes = self._bytes + added
        n = self._items = self._items + k
        self._puts += k
        if n > self._peak_items:
            self._peak_items = n  # counts only grow within a run: its end is its peak
        if held > self._peak_bytes:
            self._peak_bytes = held
        self._oversize += over
        if self._observer is not None:
            self._observer(self)
        getters = self._get_waiters
        while getters and k:  # one consumer per new item
            getters.popleft().wake()
            k -= 1

    def reserve(self, nbytes: int, *, timeout_s: float | None = None) -> None:
        """Take room for one item of about ``nbytes`` before building it (see ``put``)."""
        self._reserve(0, nbytes, timeout_s)

    def cancel(self, nbytes: int) -> None:
        """Give back a reservation of ``nbytes`` that produced no item."""
        self._cancel(0, nbytes)

    def get(self, *, timeout_s: float | None = None) -> T:
        """Remove and return the oldest item, blocking while the buffer is empty.

        Raises:
            BufferClosed: the buffer is closed and drained.
            TimeoutError: nothing arrived within ``timeout_s`` seconds.
        """
        with self._lock:
            if not self._items:
                self._wait_for_item(timeout_s)
            item = self._q.popleft()
            size = self._qs.popleft()
            self._lane0.bytes -= size
            self._bytes -= size
            self._items -= 1
            self._gets += 1
            if self._observer is not None:
                self._observer(self)
            if self._pool_waiters:
                head = self._pool_waiters[0]
                if not head.woken:  # (a producer already woken is not woken again)
                    head.wake()
            return item

    def get_many(self, max_items: int, *, timeout_s: float | None = None) -> list[T]:
        """Remove and return the oldest items, at least one and at most ``max_items``:
        blocks like ``get`` while the buffer is empty, then takes what is ready.

        Raises:
            BufferClosed: the buffer is closed and drained.
            TimeoutError: nothing arrived within ``timeout_s`` seconds.
            ValueError: ``max_items`` is not an int >= 1.
        """
        if type(max_items) is not int or max_items < 1:
            raise ValueError(f"max_items={max_items!r} must be an int >= 1")
        with self._lock:
            if not self._items:
                self._wait_for_item(timeout_s)
            q, qs = self._q, self._qs
            if max_items >= self._items:
                got = list(q)
                freed = sum(qs)
                q.clear()
                qs.clear()
            else:
                pop, spop = q.popleft, qs.popleft
                got = [pop() for _ in range(max_items)]
                freed = sum([spop() for _ in range(max_items)])
            self._lane0.bytes -= freed
            self._bytes -= freed
            self._items -= len(got)
            self._gets += len(got)
            if self._observer is not None:
                self._observer(self)
            if self._pool_waiters:
                self._pool_waiters[0].wake()
            return got

    def __iter__(self) -> Iterator[T]:
        """Yield items until the buffer is closed and drained."""
        get = self.get
        while True:
            try:
                item = get()
            except BufferClosed:
                return
            yield item


def _admitted(exc: BaseException, count: int) -> BaseException:
    """``exc`` telling how many of a ``put_many``'s items are in the buffer."""
    exc.args = (f"{exc.args[0] if exc.args else exc} ({count} items of this put_many were put)",)
    exc.admitted = count  # type: ignore[attr-defined]
    return exc


class ShardedBuffer(Engine[T]):
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
        start_lane: the lane round-robin delivery starts with (a resumed stream).

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
        start_lane: int = 0,
    ) -> None:
        if order not in ("round_robin", "first_ready"):
            raise ValueError(f"order={order!r} must be 'round_robin' or 'first_ready'")
        self.order: Order = order
        # lane -> its open reservations' sizes, oldest first (commit/release take the
        # last; cancel(lane, n) the last of n bytes); list.append/pop/remove are atomic
        self._reserved_by: dict[int, list[int]] = {}
        super().__init__(
            lanes=lanes,
            max_items=max_items,
            max_bytes=max_bytes,
            pooled=order == "first_ready",
            sizeof=sizeof,
            start_lane=start_lane,
        )

    @property
    def lanes(self) -> int:
        return self._nlanes

    def put(
        self, lane: int, item: T, *, timeout_s: float | None = None, reserved: int | None = None
    ) -> None:
        """Add ``item`` to ``lane``, blocking while the lane (or the pool) is full (never,
        with ``reserved``: the bytes taken by an earlier ``reserve`` on this lane).

        Raises:
            BufferClosed: the buffer is closed, or ``lane`` was finished.
            TimeoutError: no room within ``timeout_s`` seconds.
            IndexError: no such lane.
        """
        self._lane_index(lane)
        self._put(lane, item, timeout_s, reserved)

    def reserve(self, lane: int, nbytes: int, *, timeout_s: float | None = None) -> None:
        """Take room in ``lane`` for one item of about ``nbytes`` before building it."""
        self._lane_index(lane)
        self._reserve(lane, nbytes, timeout_s)
        self._reserved_by.setdefault(lane, []).append(nbytes)  # for commit/release

    def cancel(self, lane: int, nbytes: int) -> None:
        """Give back a reservation of ``lane`` that produced no item."""
        self._lane_index(lane)
        self._cancel(lane, nbytes)
        open_ = self._reserved_by.get(lane, [])
        for k in range(len(open_) - 1, -1, -1):  # that reservation's record, not another's
            if open_[k] == nbytes:
                del open_[k]  # (a release() after it gives nothing back)
                break

    # -- the runner's window protocol (streambuf.window.LaneWindow) ----------------------
    def share(self, lane: int) -> int:
        """Lane ``lane``'s slice of the byte bound (pooled: an even share): a lane's
        first size estimate, before it has made any item."""
        self._lane_index(lane)
        return self._lane_limit(lane)

    def commit(self, lane: int, item: T, size: int, *, seq: int | None = None) -> None:
        """``item`` (``size`` bytes, measured by the caller) replaces ``lane``'s last
        ``reserve``; larger than it, it gives the room back and waits for room at its
        real size (alone in an empty lane, counted in ``oversize``). ``seq`` is unused:
        the lane order decides."""
        self._lane_index(lane)
        try:
            est = self._reserved_by.get(lane, []).pop()
        except IndexError:
            raise ValueError(
                f"commit() on lane {lane}, which holds no reservation: reserve() first"
            ) from None
        if size <= est:
            self._put(lane, item, None, est, size)
        else:
            self._cancel(lane, est)
            self._put(lane, item, None, None, size)

    def release(self, lane: int) -> None:
        """Give back ``lane``'s last ``reserve`` (it made no item)."""
        self._lane_index(lane)
        open_ = self._reserved_by.get(lane)
        if open_:
            est = open_.pop()
            self._cancel(lane, est)

    def _lane_index(self, lane: int) -> None:
        """Every method that takes a lane checks it here (a negative one would be another
        lane counted from the end)."""
        if type(lane) is not int and (isinstance(lane, bool) or not _is_integer(lane)):
            raise TypeError(f"lane={lane!r} must be an int lane index")
        if not 0 <= lane < self._nlanes:
            raise IndexError(f"lane={lane} out of range for lanes={self._nlanes}")

    def finish(self, lane: int) -> None:
        """Mark ``lane`` as having no more items (its producer is done). Idempotent."""
        self._lane_index(lane)
        self._finish(lane)

    def get(self, *, timeout_s: float | None = None) -> T:
        """Next item in this buffer's order (see ``order``).

        Raises:
            BufferClosed: every lane is finished and drained, or closed and drained.
            TimeoutError: nothing ready within ``timeout_s`` seconds.
        """
        return self._get(timeout_s)
