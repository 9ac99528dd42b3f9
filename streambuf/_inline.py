"""When a threaded map should run its function inline: decided by measurement.

Threads pay off when the function waits (I/O, sleeps, GIL-releasing decode). When it
holds the GIL and is cheap (tens of microseconds of Python per item), eight threads only
add hand-offs: every item crosses a lock, a condition and a GIL switch, and the consumer
waits for the GIL behind the producers (``python -m streambuf.bench._handoff_profile``:
~80-140 us per 64 KiB item with ``map(threads=8)``, ~15-30 us inline). Which case a
function is cannot be told from the outside (a sleep and a GIL wait look alike), so
``InlineChooser`` measures both modes as the consumer sees them (items delivered per
second, downstream work included) and keeps the faster:

1. threaded: skip ``window`` items (warm-up), then measure ``window`` items and at
   least ``min_window_s`` seconds -> ``r_thr`` (the time floor keeps one hiccup of a
   loaded machine from deciding);
2. probe inline (after the producers' items in flight are drained): as long, given up
   as soon as it is behind the threaded pace by two items (a 10 ms sleep costs one
   item: the probe of a waiting function is nearly free); inline is kept if its rate
   beats ``r_thr`` by ``margin``;
   (``start_inline=True``: begin at 3, kept inline, when inline is the likely winner:
   a lane thread's start-up then never delays the first item);
3. the kept mode is re-checked after ``interval`` seconds (the other mode measured
   again the same way); the interval doubles each time a check confirms the mode (up to
   ``max_interval_s``) and starts again at ``min_interval_s`` when the mode changes.

The chooser is only the decision (no threads, a clock passed in: unit-testable);
``ThreadPrefetcher`` carries it out (pause the producers, drain, pull inline, resume).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["Action", "InlineChooser"]

Action = Literal["none", "pause", "resume"]


class InlineChooser:
    """The state machine of the module docstring; ``tick()`` once per delivered item."""

    def __init__(
        self,
        window: int,
        *,
        margin: float = 1.05,
        min_window_s: float = 0.05,
        min_interval_s: float = 1.0,
        max_interval_s: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
        start_inline: bool = False,
    ) -> None:
        self.window = max(4, int(window))
        self.margin = margin
        self.min_window_s = min_window_s
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self._clock = clock
        self.inline = False  # the mode items are made in now
        self.switches = 0
        self._state = "warm"  # warm, measure, keep_threads, drain, probe, keep_inline, rewarm
        self._n = 0
        self._t0 = clock()
        self._r_thr = 0.0
        self._r_inl = 0.0
        self._interval = min_interval_s
        self._decided_at = self._t0
        self._prefer_inline = False  # the mode the last comparison chose
        if start_inline:  # inline first; threads are measured after ``min_interval_s``
            self.inline = self._prefer_inline = True
            self._start("keep_inline")

    @property
    def state(self) -> str:
        return self._state

    def _start(self, state: str) -> None:
        self._state, self._n, self._t0 = state, 0, self._clock()

    def _keep(self, inline: bool) -> None:
        if inline == self._prefer_inline:
            self._interval = min(self._interval * 2, self.max_interval_s)
        else:
            self._interval = self.min_interval_s
        self._prefer_inline = inline
        self._decided_at = self._clock()
        self._start("keep_inline" if inline else "keep_threads")

    def drained(self) -> None:
        """The producers are paused and every item they made was delivered."""
        assert self._state == "drain"
        self.inline = True
        self.switches += 1
        self._start("probe")

    def tick(self) -> Action:
        """Account one delivered item; what the ThreadPrefetcher must do next."""
        self._n += 1
        now = self._clock()
        state = self._state
        if state in ("warm", "rewarm"):
            if self._n >= self.window:
                self._start("measure" if state == "warm" else "recheck")
        elif state in ("measure", "recheck"):
            if self._n >= self.window and now - self._t0 >= self.min_window_s:
                self._r_thr = self._n / max(now - self._t0, 1e-9)
                if state == "recheck" and self._r_thr <= self.margin * self._r_inl:
                    self._start("drain")  # threads did not beat inline: back to inline
                    return "pause"
                if state == "recheck":
                    self._keep(False)
                    return "none"
                self._start("drain")
                return "pause"
        elif state == "keep_threads":
            if now - self._decided_at >= self._interval:
                self._start("measure")
        elif state == "probe":
            elapsed = now - self._t0
            if elapsed > (self._n + 2) / max(self._r_thr, 1e-9):  # behind the threads
                return self._to_threads(keep=True)
            if self._n >= self.window and elapsed >= self.min_window_s:
                self._r_inl = self._n / max(elapsed, 1e-9)
                if self._r_inl > self.margin * self._r_thr:
                    self._keep(True)
                    return "none"
                return self._to_threads(keep=True)
        elif state == "keep_inline":
            if now - self._decided_at >= self._interval:
                self._r_inl = self._n / max(now - self._t0, 1e-9)
                return self._to_threads(keep=False)
        return "none"

    def _to_threads(self, *, keep: bool) -> Action:
        self.inline = False
        self.switches += 1
        if keep:
            self._keep(False)
        else:
            self._start("rewarm")
        return "resume"
