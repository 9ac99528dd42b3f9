"""``OrderedWindow``: results of a threaded map, delivered in sequence order, bounded in
items and bytes as one pool (reservations of items being made plus finished results).

Why not ``ShardedBuffer``: in-order delivery from a shared pool can deadlock (docs/design.md
invariant 4), which ``ShardedBuffer`` avoids by giving each lane its own slice; but then
every lane admits one item larger than its slice (``max_bytes / lanes``) alone, so
``threads`` such items are held at once: the node's total is no longer bounded by
``max_bytes``. This window keeps one pool and removes the deadlock at its root instead:

* **Reservations in pull order.** A thread reserves room (first come, first served)
  before it pulls its item, so an item never waits behind room taken by a *later* one.
* **A result larger than its reservation** gives the reservation back and waits, in its
  thread and outside the count, for room at its real size; if it becomes the next item
  to deliver first, ``get`` takes it straight from the thread (hand-off). That is the
  only wait a later item could otherwise block (the head's), so delivery cannot
  deadlock: the head is always admitted, reserved, or handed over.

Invariants (checked by tests/test_nodes_properties.py under the lock): held items
(reservations + admitted results) <= ``max_items`` and their bytes <= ``max_bytes``,
except one item or reservation larger than ``max_bytes`` admitted alone into an empty
window, counted in ``oversize``. What the count cannot see: results waiting for room
outside it, at most one per thread, each larger than its reservation (that is, larger
than any result before it).

Ownership: a result belongs to the window from ``put`` until ``get`` returns it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import BufferClosed
from ..stats import BufferStats

__all__ = ["OrderedWindow"]


class _Slot:
    __slots__ = ("admitted", "item", "size", "taken", "token")

    def __init__(self, item: Any, size: int) -> None:
        self.item, self.size = item, size
        self.admitted = False  # counted in the window (else: waiting in its thread)
        self.taken = False  # handed over by get() before it was admitted
        self.token: threading.Condition | None = None  # its thread waits on this


class OrderedWindow:
    """See the module docstring. ``threads`` producers each ``reserve``, then ``put``
    (or ``cancel``), then ``finish`` once; one consumer calls ``get``."""

    def __init__(self, *, threads: int, max_items: int, max_bytes: int) -> None:
        self.max_items, self.max_bytes = max_items, max_bytes
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # the consumer waits here
        self._waiters: deque[threading.Condition] = deque()  # for room, first come first
        self._held = 0  # reservations + admitted results
        self._reserved = 0  # reservations
        self._bytes = 0  # their bytes
        self._results: dict[int, _Slot] = {}
        self._next = 0  # the sequence number get() delivers next
        self._running = threads  # producers not finished
        self._closed = False
        self._error: BaseException | None = None
        self._peak_items = self._peak_bytes = self._oversize = 0
        self._puts = self._gets = self._empty_gets = 0
        self._put_wait_s = self._get_wait_s = 0.0
        self._observer: Callable[[OrderedWindow], None] | None = None  # tests only

    # -- producers ----------------------------------------------------------------------
    def _fits(self, nbytes: int) -> bool:
        return self._held == 0 or (
            self._held < self.max_items and self._bytes + nbytes <= self.max_bytes
        )

    def _count(self, nbytes: int) -> None:
        self._held += 1
        self._bytes += nbytes
        self._peak_bytes = max(self._peak_bytes, self._bytes)
        if nbytes > self.max_bytes:
            self._oversize += 1
        if self._observer is not None:
            self._observer(self)

    def _wake_first(self) -> None:
        if self._waiters:
            self._waiters[0].notify()

    def _wait_for_room(self, nbytes: int, slot: _Slot | None = None) -> None:
        """Until ``nbytes`` fits and this waiter is first (or ``slot`` is taken)."""
        token = threading.Condition(self._lock)
        if slot is not None:
            slot.token = token
        self._waiters.append(token)
        t0 = time.monotonic()
        try:
            while True:
                if self._closed:
                    raise BufferClosed("window closed while waiting for room")
                if slot is not None and slot.taken:
                    return
                if self._waiters[0] is token and self._fits(nbytes):
                    return
                token.wait()
        finally:
            self._waiters.remove(token)
            self._wake_first()
            self._put_wait_s += time.monotonic() - t0

    def reserve(self, nbytes: int) -> None:
        """Take room for one item of about ``nbytes`` before pulling and making it."""
        with self._lock:
            if self._closed:
                raise BufferClosed("reserve() on a closed window")
            if self._waiters or not self._fits(nbytes):
                self._wait_for_room(nbytes)
            self._reserved += 1
            self._count(nbytes)

    def cancel(self, nbytes: int) -> None:
        """Give back a reservation that made no item."""
        with self._lock:
            if self._closed:
                return  # abort() forgot every reservation
            self._held -= 1
            self._reserved -= 1
            self._bytes -= nbytes
            self._wake_first()

    def put(self, seq: int, item: Any, size: int, reserved: int) -> None:
        """Result ``seq`` (``size`` bytes) replaces a reservation of ``reserved`` bytes;
        if it is larger, it waits for room at its real size or for its hand-off."""
        with self._lock:
            if self._closed:
                raise BufferClosed("put() on a closed window")
            self._held -= 1
            self._reserved -= 1
            self._bytes -= reserved
            slot = _Slot(item, size)
            self._puts += 1
            if size > reserved and (self._waiters or not self._fits(size)):
                self._results[seq] = slot  # visible to get(): the hand-off
                if seq == self._next:
                    self._arrived.notify()
                self._wait_for_room(size, slot)
                if slot.taken:
                    return
            else:
                self._results[seq] = slot
            slot.admitted = True
            self._count(size)
            self._peak_items = max(self._peak_items, self._held - self._reserved)
            self._wake_first()  # a smaller result may have left room
            if seq == self._next:
                self._arrived.notify()

    def finish(self) -> None:
        """One producer is done (no more puts from it)."""
        with self._lock:
            self._running -= 1
            self._arrived.notify()

    # -- consumer -----------------------------------------------------------------------
    def get(self) -> Any:
        """The next result in sequence order.

        Raises:
            BufferClosed: every producer finished and all was delivered, or closed.
            the error given to ``abort``.
        """
        with self._lock:
            t0 = None
            while True:
                slot = self._results.get(self._next)
                # admitted, or waiting outside the count in its thread: hand it over
                if slot is not None and (slot.admitted or slot.token is not None):
                    break
                if self._error is not None:
                    raise self._error
                if self._closed or self._running == 0:
                    raise BufferClosed("window drained")
                if t0 is None:
                    t0 = time.monotonic()
                    self._empty_gets += 1
                self._arrived.wait()
            if t0 is not None:
                self._get_wait_s += time.monotonic() - t0
            del self._results[self._next]
            self._next += 1
            self._gets += 1
            if slot.admitted:
                self._held -= 1
                self._bytes -= slot.size
                if self._observer is not None:
                    self._observer(self)
                self._wake_first()
            else:  # waiting outside the count: handed over, its thread goes on
                slot.taken = True
                assert slot.token is not None
                slot.token.notify()
            return slot.item

    # -- lifecycle ----------------------------------------------------------------------
    def abort(self, exc: BaseException) -> None:
        """Drop everything held, wake everyone; ``get`` raises ``exc`` from now on."""
        with self._lock:
            if self._error is None:
                self._error = exc
            self._closed = True
            self._results.clear()
            self._held = self._reserved = self._bytes = 0
            for token in self._waiters:
                token.notify()
            self._arrived.notify_all()

    def stats(self) -> BufferStats:
        """``items``: admitted results; ``bytes``: theirs plus reservations."""
        with self._lock:
            return BufferStats(
                items=self._held - self._reserved,
                bytes=self._bytes,
                max_items=self.max_items,
                max_bytes=self.max_bytes,
                peak_items=self._peak_items,
                peak_bytes=self._peak_bytes,
                oversize=self._oversize,
                puts=self._puts,
                gets=self._gets,
                put_wait_s=self._put_wait_s,
                get_wait_s=self._get_wait_s,
                empty_gets=self._empty_gets,
            )
