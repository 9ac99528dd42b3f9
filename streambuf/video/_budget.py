"""Per-lane byte reservations for clips being decoded (``clips()`` lanes).

A lane reserves an estimate of one clip's bytes *before* it decodes the clip, and the
reservation is released when the consumer takes the clip out of the buffer. So a lane's
slice covers its queued clips **and** the clip it is building; the buffer alone would
count only the queued ones (a lane blocked in ``put`` holds a finished clip outside it).

Rules (one lock; the same shape as ``ShardedBuffer``'s round-robin budget):

* Lane ``t`` owns ``max_bytes // lanes`` bytes (remainder to the first lanes).
* ``reserve`` waits until the lane holds nothing, or until ``held + size <= slice``; a
  lane that holds nothing may always reserve (one clip larger than the slice is built
  alone, never a deadlock: the consumer drains the lane's queue, which frees it).
* ``close`` wakes every waiter, which then raises ``BufferClosed``.
"""

from __future__ import annotations

import threading

from ..errors import BufferClosed

__all__ = ["LaneBudget"]


class LaneBudget:
    """Bytes held per lane (queued + being built), bounded by the lane's slice."""

    def __init__(self, lanes: int, max_bytes: int) -> None:
        base, extra = divmod(max_bytes, lanes)
        self.slices = [max(1, base + (1 if i < extra else 0)) for i in range(lanes)]
        self.held = [0] * lanes
        self.peak = [0] * lanes
        self._cond = threading.Condition()
        self._closed = False

    def reserve(self, lane: int, size: int) -> None:
        """Block until ``lane`` may hold ``size`` more bytes, then take them."""
        with self._cond:
            while (
                not self._closed
                and self.held[lane]
                and (self.held[lane] + size > self.slices[lane])
            ):
                self._cond.wait()
            if self._closed:
                raise BufferClosed("the clip reader was closed")
            self._add(lane, size)

    def adjust(self, lane: int, delta: int) -> None:
        """Correct a reservation once the clip's true size is known."""
        with self._cond:
            self._add(lane, delta)
            if delta < 0:
                self._cond.notify_all()

    def release(self, lane: int, size: int) -> None:
        """The consumer took a clip of ``size`` bytes from ``lane`` (or it was dropped)."""
        with self._cond:
            self._add(lane, -size)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _add(self, lane: int, size: int) -> None:
        self.held[lane] += size
        self.peak[lane] = max(self.peak[lane], self.held[lane])
