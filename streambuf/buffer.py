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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from ._engine import Engine
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

    def put(self, item: T, *, timeout_s: float | None = None, reserved: int | None = None) -> None:
        """Add ``item``, blocking while it would exceed a bound (never, with ``reserved``:
        the bytes taken by an earlier ``reserve``).

        Raises:
            BufferClosed: the buffer is (or gets) closed.
            TimeoutError: no room within ``timeout_s`` seconds.
        """
        self._put(0, item, timeout_s, reserved)

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
        return self._get(timeout_s)


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

    def cancel(self, lane: int, nbytes: int) -> None:
        """Give back a reservation of ``lane`` that produced no item."""
        self._lane_index(lane)
        self._cancel(lane, nbytes)

    def _lane_index(self, lane: int) -> None:
        if not 0 <= lane < self._nlanes:
            raise IndexError(f"lane={lane} out of range for lanes={self._nlanes}")

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
