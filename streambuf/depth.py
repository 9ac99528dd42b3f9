"""Run-time depth control: deepen the buffer while the consumer starves, within budget.

The signal is the one tf.data's prefetch autotuner uses: **the consumer found the buffer
empty** (it had to wait for the next batch). Rules, each tested with scripted timings:

* Every ``interval_s`` at most one decision is taken (so changes per second are bounded
  by ``1 / interval_s``), from what the consumer saw during that window.
* **Grow** when the consumer waited more than ``starve_fraction`` of the window: depth
  becomes ``max(depth + 1, ceil(depth * grow_factor))``, capped at ``max_depth`` and at
  what the byte budget can hold (``max_bytes // largest batch seen``). Never past the
  byte budget: the credits enforce it anyway, the tuner does not even ask.
* **Shrink** when memory runs short (available memory, cgroup-aware, below
  ``reserve_bytes``): depth halves (not below ``min_depth``) and growth pauses for
  ``hold_intervals`` windows, so pressure cannot make it oscillate.
* There is no shrink on "too much buffer": an idle buffer costs nothing beyond its
  bytes, which the budget bounds, and shrinking on fullness is what makes depth
  controllers oscillate between phases.
* Every decision is logged (INFO, logger "streambuf") and kept in ``decisions``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DepthTuner", "TunerDecision"]

log = logging.getLogger("streambuf")


@dataclass(frozen=True)
class TunerDecision:
    """One change of depth: when, from, to, and why."""

    at_s: float
    old_depth: int
    new_depth: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class DepthTuner:
    """Chooses how many batches may be in flight (see the module docstring).

    Args:
        min_depth, max_depth: the range (e.g. num_workers .. max_batches).
        max_bytes: the byte budget; depth never exceeds what it can hold.
        start_depth: initial depth (default: ``min(max_depth, 2 * min_depth)``).
        interval_s: length of a decision window.
        starve_fraction: grow when the consumer waited more than this share of a window.
        grow_factor: multiplicative growth step (at least +1).
        reserve_bytes: shrink when available memory falls below this (None: never).
        available_fn: returns available memory in bytes (cgroup-aware by default).
        hold_intervals: windows without growth after a shrink.
        clock: time source (scripted in tests).
    """

    def __init__(
        self,
        *,
        min_depth: int,
        max_depth: int,
        max_bytes: int,
        start_depth: int | None = None,
        interval_s: float = 0.5,
        starve_fraction: float = 0.02,
        grow_factor: float = 1.5,
        reserve_bytes: int | None = None,
        available_fn: Callable[[], int] | None = None,
        hold_intervals: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= min_depth <= max_depth:
            raise ValueError(f"need 1 <= min_depth={min_depth} <= max_depth={max_depth}")
        if interval_s <= 0:
            raise ValueError(f"{interval_s=} must be > 0")
        self.min_depth = min_depth
        self.max_depth = max_depth
        self.max_bytes = max_bytes
        self.depth = start_depth if start_depth is not None else min(max_depth, 2 * min_depth)
        self.depth = max(min_depth, min(max_depth, self.depth))
        self.interval_s = interval_s
        self.starve_fraction = starve_fraction
        self.grow_factor = grow_factor
        self.reserve_bytes = reserve_bytes
        if available_fn is None and reserve_bytes is not None:
            from .resources import memory_available

            available_fn = memory_available
        self.available_fn = available_fn
        self.hold_intervals = hold_intervals
        self.clock = clock
        self.decisions: list[TunerDecision] = []
        self._t0 = clock()
        self._window_start = self._t0
        self._waited = 0.0
        self._largest = 0
        self._hold = 0

    def observe(self, *, waited_s: float, batch_bytes: int) -> None:
        """The consumer got one batch after waiting ``waited_s`` *because the buffer was
        empty* (pass 0 when a finished batch was already waiting: that wait is transport)."""
        self._waited += waited_s
        if batch_bytes > self._largest:
            self._largest = batch_bytes

    def update(self) -> int | None:
        """Close the window if ``interval_s`` has passed; returns the new depth if it changed."""
        now = self.clock()
        elapsed = now - self._window_start
        if elapsed < self.interval_s:
            return None
        waited, self._waited, self._window_start = self._waited, 0.0, now
        old = self.depth
        new, reason = old, ""
        if self.reserve_bytes is not None and self.available_fn is not None:
            available = self.available_fn()
            if available < self.reserve_bytes:
                new = max(self.min_depth, old // 2)
                self._hold = self.hold_intervals
                reason = (
                    f"memory pressure: {available >> 20} MiB available < reserve "
                    f"{self.reserve_bytes >> 20} MiB"
                )
        if not reason:
            if self._hold > 0:
                self._hold -= 1
            elif waited > self.starve_fraction * elapsed and old < self.max_depth:
                cap = self.max_depth
                if self._largest > 0:
                    cap = min(cap, max(old, self.max_bytes // self._largest))
                new = min(cap, max(old + 1, math.ceil(old * self.grow_factor)))
                reason = f"consumer waited {waited / elapsed:.0%} of the last {elapsed:.2f} s"
        if new == old:
            return None
        self.depth = new
        d = TunerDecision(now - self._t0, old, new, reason)
        self.decisions.append(d)
        log.info("streambuf: depth %d -> %d (%s)", old, new, reason)
        return new
