"""How many threads a stage runs, decided by measurement (``threads="auto"``).

A stage whose function waits (I/O, a sleep, a decode that releases the GIL) delivers at
most ``threads / latency`` items per second; one whose function holds the GIL gains
nothing from more threads and pays for their hand-offs. Which case a function is cannot
be told from outside, and it changes with the storage, the CPU quota and the sample size,
so ``ThreadTuner`` measures the rate the consumer sees (items delivered per second,
downstream work included) at one count after another, and climbs:

1. **measure** the current count: skip ``settle`` items after a change (default: two
   per thread; the stage refills at the new count), then take at least ``window`` items,
   four per thread (a waiting function's items arrive in bursts of ``count``) and
   ``min_window_s`` seconds (0.1: one hiccup of a loaded machine does not decide),
   over ``cycles`` (3) bursts, from the start of one to the start of another (the
   consumer takes items in bursts: a batch, then a pause while it collates and hands
   the batch on, and one cycle's length moves with the other workers'; a burst begins
   after a pause of at least ``align`` of the window's longest): a window cut inside a
   burst measures its fast part, or its pause, not the cycle. Where the bursts do not
   come, the window ends at ``cycles + 1`` times the time it needed (in a smooth
   stream every item begins a "burst": nothing is waited for). Each window is split
   at the burst start nearest its middle and its two halves' rates compared: their
   relative difference, its root mean square over the last ``noise_windows`` (8), is
   ``noise``: what a window moves by with nothing changed (0 on a quiet machine;
   0.1-0.45 on the 2-core VM with 4 Loader workers). Every comparison below must clear it as well as
   its own margin: a difference inside the noise is a coin flip, and a rule that moves
   on coin flips walks wherever its asymmetries push it. A window counts the items the
   threads *made*: those delivered plus the change in what the stage holds (``held()``,
   made or being made). Delivered alone, a step down would read as fast as the count
   before it while the buffer it filled drains at the consumer's pace (a stage that
   keeps a consumer-limited Loader full holds a few batches' worth), and "fewer threads
   did as much" would be kept;
2. **up**: double the count (a smaller step where the limit caps it), up to the
   *limit*: ``max_threads`` and the items the byte bound has room for (``room()``: each
   thread's item in flight counts against ``max_bytes``); no growth past the most
   threads a check has kept (the start at first) while the stage is *contended*: more
   threads would fight for cores. That is told from the stage's own calls
   (``cost()``: wall, CPU and core-wait seconds of its function on its threads,
   ``streambuf._cost.CallCost``), never from how busy the machine is: over the window,
   its calls needed a core (on one, or waiting in the run queue for one) ``computes``
   (50%) of their time or more, and waited for one ``core_wait`` (20%) of it or more
   (the function computes on cores others or its own threads keep busy; a function
   that mostly sleeps may wait for a core after each wake-up, but another thread
   sleeping beside it costs no core), or its threads
   together kept ``gil_cores`` (0.8) to ``GIL_MAX_CORES`` (1.25) CPUs busy while each
   was on a core or waiting for one less than ``gil_share`` (75%) of its calls' time
   (they take turns: the function holds the GIL; not on a free-threaded build). A
   function that releases the GIL and uses about one CPU over its threads reads the
   same, and is held there: a decode that keeps more CPUs busy is not. A function that waits (a sleep, I/O, a decode that releases the GIL on free
   cores) grows however busy other processes keep the machine. The new count is kept
   if the rate rose by ``gain`` (5% for a doubling; a smaller step in proportion) and
   by ``noise``; then up again;
3. **down**: when the first step up did not pay (or could not be taken), halve the
   count (fewer threads may do the same work: the function holds the GIL, or something
   downstream is the limit; from a count a capped step reached, e.g. 21, down to the
   power of two below it, 16, the count that step began at); then down
   again (down to one thread: a GIL-bound function can be much faster on one thread
   than on two; with ``inline=True`` down to 0, *inline*: no thread, the consumer runs
   the function itself, without a hand-off) while the rate stays above ``fall`` of the
   best (in a re-check: within ``keep``, not widened by the noise: a step that loses is
   not repeated, each window at a count that pays less costs the run, and a noisy
   machine would walk every re-check down to the count that costs most). The count
   kept: the one the check began with if its rate is within ``keep`` (and the noise) of the best
   measured (a change must pay more than the noise of a loaded machine) or, when the
   stage was contended, the fewest threads that did more than it by the noise (they contend
   less for the CPUs and the GIL; "more by the noise": else each check would be a coin
   flip that can only go down, since contention stops growth: on the 2-core VM the mixed
   workload walked down to 2 threads a worker and stayed); else the fewest threads
   within ``keep`` and the noise of the best. A count at the byte room (``room()``
   below ``max_threads``) gives way to the most threads below it that did as much
   (within ``keep`` and the noise of its rate): there each thread's item in flight is
   all the bound allows, and threads that add nothing only hold bytes;
4. **settled**: re-checked (steps 1-3 from the current count) after ``interval``
   seconds; the interval doubles each time a check confirms the count (up to
   ``max_interval_s``) and starts again at ``min_interval_s`` when the count changes.
   The first check is re-checked after ``first_recheck_s`` (0.5 s): its windows fall
   in the stage's start-up (threads and the other workers starting, buffers filling,
   the CPUs busy with it), which makes a doubling look as if it did not pay.

Only the decision (no threads, clocks passed in: unit-testable); ``ThreadPrefetcher``
carries it out (``streambuf.prefetch``: starts lanes as the count grows; a lane above
the count parks before it takes its next item, after delivering the one it holds).
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

__all__ = ["START_THREADS", "Lead", "ThreadTuner", "room_for"]

START_THREADS = 4  # where a climb begins
# the GIL rule's reading: threads taking turns at the GIL keep about one CPU busy (a
# stage above this many CPUs runs outside the GIL: a decode that releases it)
GIL_MAX_CORES = 1.25
_GIL = bool(getattr(sys, "_is_gil_enabled", lambda: True)())  # (a free-threaded build: no)


def room_for(max_items: int, max_bytes: int, largest: int) -> int:
    """Threads a window's bounds have room for, each with one item in flight reserved
    (``largest``: bytes of the largest item made so far; <= 0: none yet, the count
    bound alone): a ``ThreadTuner``'s ``room``."""
    if largest <= 0:
        return max_items
    return max(1, min(max_items, max_bytes // largest))


class ThreadTuner:
    """The hill climb of the module docstring; ``tick()`` once per delivered item.

    Attributes (read-only): ``count`` (threads now), ``history`` (``(seconds since the
    start, count, items/s measured at the count before it)`` for every change),
    ``settled_s`` (when the first check settled; None before).
    """

    SAME = 0.999  # "as much" (a rate's rounding, not a window's noise)

    def __init__(
        self,
        *,
        max_threads: int,
        start: int = START_THREADS,
        window: int = 32,
        settle: int | None = None,
        min_window_s: float = 0.1,
        gain: float = 1.05,
        keep: float = 0.95,
        fall: float = 0.5,
        computes: float = 0.5,
        core_wait: float = 0.2,
        gil_cores: float = 0.8,
        gil_share: float = 0.75,
        cost: Callable[[], tuple[int, int, float, float, float]] | None = None,
        room: Callable[[], int] | None = None,
        held: Callable[[], int] | None = None,
        min_interval_s: float = 2.0,
        max_interval_s: float = 60.0,
        first_recheck_s: float = 0.5,
        align: float = 0.5,
        cycles: int = 3,
        noise_windows: int = 8,
        inline: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads={max_threads!r} must be >= 1")
        if not 0.0 <= align <= 1.0:
            raise ValueError(f"align={align!r} must be within [0, 1]")
        self.max_threads = int(max_threads)
        self.window = max(4, int(window))
        self._settle_items = settle
        self.min_window_s = min_window_s
        self.gain, self.keep, self.fall = gain, keep, fall
        self.computes, self.core_wait = computes, core_wait
        self.gil_cores, self.gil_share = gil_cores, gil_share
        # the stage's own calls so far: (made, sampled, and the sampled ones' wall, CPU
        # and core-wait seconds; ``streambuf._cost.CallCost.totals``)
        self._cost = cost
        self._room = room
        self._held = held  # items the stage holds now, made or being made (None: 0)
        self.min_interval_s, self.max_interval_s = min_interval_s, max_interval_s
        self.first_recheck_s = first_recheck_s
        self._clock = clock
        self.align, self.cycles = align, max(1, int(cycles))
        self._t_start = clock()
        self.least = 0 if inline else 1  # the fewest: 0 is inline (the consumer runs fn)
        self.count = max(1, min(int(start), self.limit()))
        self._high = self.count  # the most threads a check kept (or the start)
        self.history: list[tuple[float, int, float]] = []
        self.settled_s: float | None = None
        # the last window's stage cost: its calls' shares of their time on a core and
        # waiting for one, and the CPUs its threads kept busy (``contended``)
        self.on_core = self.waited = self.cores = 0.0
        self.contended = False  # more threads would fight for cores (last window)
        # the relative difference of each window's two halves (the last ``noise_windows``):
        # how much a window's rate moves with nothing changed (``noise``)
        self._spreads: deque[float] = deque(maxlen=noise_windows)
        self._interval = min_interval_s
        self._check()

    # -- the climb ----------------------------------------------------------------------
    def _check(self) -> None:
        """Start a check from the current count (steps 1-3)."""
        self._from = self.count
        self._rates: dict[int, float] = {}  # count -> items/s measured in this check
        self._dir = ""  # "up" or "down" while a step is measured
        self._prev = self.count  # the count measured before the step
        self._contended_from = False  # contended at the check's first measurement
        self._climbed = False  # a step up was kept in this check
        self._skip()

    def _skip(self) -> None:
        self._state, self._n = "skip", 0

    def _measure(self) -> None:
        self._state, self._n = "measure", 0
        self._t0 = self._t_last = self._clock()
        self._c0 = self._cost() if self._cost is not None else None
        self._gap_max = 0.0  # the longest pause between two items in this window
        self._ready_s = 0.0  # when the window first had its items and time (0: not yet)
        self._made0 = self._made()  # items made when the window began (step 1)
        # the items that began a burst: (pause before it, its time, items made at it),
        # those with a pause >= ``align`` of the longest so far (all of them: the list is
        # rebuilt when the longest grows)
        self._starts: deque[tuple[float, float, int]] = deque()

    def _made(self) -> int:
        """Items the threads made in this window so far, plus what the stage held when
        it began: those delivered and what the stage holds now (made or being made)."""
        return self._n + (self._held() if self._held is not None else 0)

    @property
    def noise(self) -> float:
        """How much two windows at the same count differ on this machine now: the root
        mean square of the relative difference of the two halves of the last
        ``noise_windows`` windows (0.0 before any window was split: a smooth stream, or
        none measured yet). Halves with a standard deviation ``s`` differ by ``2 s^2`` in
        the mean square, and two windows (each two halves) by ``s``: this is ~1.4 of the
        standard deviation of a difference of two windows, a margin that noise alone
        clears about one time in 12. Every comparison of two counts must clear it (a
        median of a few halves' differences read 0.01-0.04 on windows 30% apart)."""
        spreads = self._spreads
        return math.sqrt(sum(d * d for d in spreads) / len(spreads)) if spreads else 0.0

    def _near(self) -> float:
        """The least rate that counts as "as good as ``best``", over ``best``: ``keep``,
        lowered where the windows' noise is larger than ``1 / keep - 1``."""
        return 1.0 / max(1.0 / self.keep, 1.0 + self.noise)

    def limit(self) -> int:
        """The most threads allowed now: ``max_threads`` and the byte bound's room."""
        room = self._room() if self._room is not None else self.max_threads
        return max(1, min(self.max_threads, room))

    def _room_cap(self) -> float:
        """The count the byte room caps now, where it is below ``max_threads`` (else
        infinity: ``max_threads`` is the user's bound, not memory)."""
        room = self._room() if self._room is not None else self.max_threads
        return room if room < self.max_threads else math.inf

    def _set(self, count: int) -> int:
        self.history.append((self._clock() - self._t_start, count, self._rates[self.count]))
        self._prev = self.count
        self.count = count
        self._skip()
        return count

    def _up(self) -> int | None:
        new = min(max(1, 2 * self.count), self.limit())
        if self.contended:
            # more threads than ever paid would only fight for cores (or the GIL); but
            # back up to a count kept before (a noisy window may have taken it away, and
            # while contended nothing else would bring it back)
            new = min(new, self._high)
        if new <= self.count or new in self._rates:
            return None
        self._dir = "up"
        return self._set(new)

    def _below(self, count: int) -> int:
        """The count a step down from ``count`` measures: the power of two below it (half
        of one; from a count a step capped by the limit reached, e.g. 21 from 16, the
        count that step began at, so a check from there measures it again: from 21 a
        halving measured 10, never 16, and a count the noise once took up to the limit
        stayed there)."""
        new = max(self.least, 1 << (count.bit_length() - 1) if count > 1 else 0)
        return new if new < count else max(self.least, count // 2)

    def _down(self) -> int | None:
        new = self._below(self.count)
        if new >= self.count or new in self._rates:
            return None
        self._dir = "down"
        return self._set(new)

    def _choose(self) -> int | None:
        """End of a check: the count the check began with if its rate is within ``keep``
        and ``noise`` of the best measured (a change must pay more than noise; when the
        stage was contended, fewer threads that did more than it by ``noise``), else the
        fewest threads within ``keep`` and ``noise`` of the best."""
        least = self._near() * max(self._rates.values())
        near = [c for c, r in self._rates.items() if r >= least]
        if self._from in near:
            count = self._from
            if self._contended_from:
                # contended, fewer threads doing as much are better (less contention
                # for the CPUs and the GIL), but only if they lost nothing: a window's
                # noise must not take away threads that pay (the mixed workload: 2
                # threads a worker ran 0.87 of 4, inside ``keep`` of one window's noise),
                # so "as much" is beyond the noise (else every check would be a coin
                # flip that can only go down: contended, the count never grows back)
                same = (self.SAME + self.noise) * self._rates[self._from]
                count = min(c for c in near if c == count or self._rates[c] >= same)
        else:
            count = min(near)
        if count >= self._room_cap() and count > 1:
            # at the byte room: each thread's item in flight is the most the bound allows,
            # so fewer threads that did as much (within ``keep`` and the noise of its
            # rate) are taken: the bytes buy nothing there
            floor = self._near() * self._rates[count]
            fewer = [c for c, r in self._rates.items() if c < count and r >= floor]
            if fewer:
                count = max(fewer)
        now = self._clock()
        if count == self._from:
            self._interval = min(2 * self._interval, self.max_interval_s)
        else:
            self._interval = self.min_interval_s
        if self.settled_s is None:
            self.settled_s = now - self._t_start
            # the first check ran in the stage's start-up (threads starting, the other
            # workers starting, buffers filling): its windows measure the start-up too,
            # so its decision is checked again soon
            self._interval = min(self._interval, self.first_recheck_s)
        got = self._set(count) if count != self.count else None
        self._high = max(self._high, count)
        self._state, self._decided_at = "settled", now
        return got

    def _measured(self, rate: float) -> int | None:
        prev = self._rates.get(self._prev, 0.0) if self._dir else 0.0
        self._rates[self.count] = rate
        if self._dir == "up":
            # a doubling must pay ``gain``; a smaller step (capped by the limit) in step
            # and by more than the windows' noise (``noise``): a step that paid by noise
            # alone would be taken back at the next check, each check a coin flip
            step = self.count / self._prev - 1.0 if self._prev else 1.0  # (inline -> 1)
            if rate >= (1.0 + max((self.gain - 1.0) * step, self.noise)) * prev:
                self._climbed = True
                got = self._up()
                return got if got is not None else self._choose()
            if self._climbed:
                return self._choose()
            # the first step up did not pay: try fewer threads than where the check began
            new = self._below(self._from)
            if new < self._from and new not in self._rates:
                self._dir = "down"
                return self._set(new)
            return self._choose()
        if self._dir == "down":
            # on down while not clearly worse than the best so far (a GIL-bound function
            # can be much faster on one thread than on two: do not stop at two); a
            # re-check goes on only while a step loses nothing (``keep``): it checks a
            # count already found, and each window at a count that pays less costs the
            # run (the mixed workload: 1 thread a worker runs 0.6 of 4)
            floor = self.fall if self.settled_s is None else self.keep
            if rate < floor * max(self._rates.values()):
                return self._choose()
            got = self._down()
            return got if got is not None else self._choose()
        self._contended_from = self.contended  # the check's first measurement
        got = self._up()
        if got is None:
            got = self._down()
        return got if got is not None else self._choose()

    # -- per item -----------------------------------------------------------------------
    def tick(self) -> int | None:
        """Account one delivered item; the new thread count when it changes, else None."""
        self._n += 1
        state = self._state
        if state == "skip":
            settle = self._settle_items
            if self._n >= (settle if settle is not None else max(8, 2 * self.count)):
                self._measure()
        elif state == "measure":
            return self._measure_tick()
        elif self._clock() - self._decided_at >= self._interval:
            self._check()
        return None

    def _measure_tick(self) -> int | None:
        """One item of a window. Every thread delivers a few items in it (a waiting
        function's items come in bursts of ``count``: a window of one burst measures
        nothing), it lasts ``min_window_s``, and it runs over ``cycles`` bursts, from
        the start of one to the start of another: the consumer takes items in bursts too
        (a batch's worth, then a pause while it collates and hands the batch on), and a
        window cut inside a burst counts its fast part or its pause, not their mean.
        Invariant: ``_starts`` holds every item of the window whose pause is at least
        ``align`` of the longest so far, in order (so its length counts the bursts)."""
        now = self._clock()
        gap = now - self._t_last
        self._t_last = now
        starts = self._starts
        if gap > self._gap_max:  # (rare after a window's first items)
            self._gap_max = gap
            cut = self.align * gap
            self._starts = starts = deque(e for e in starts if e[0] >= cut)
        else:
            cut = self.align * self._gap_max
        begins = gap >= cut and self.align > 0.0  # this item begins a burst
        if begins:
            starts.append((gap, now, self._made()))
        need = max(self.window, 4 * self.count)
        dt = now - self._t0
        if self._n < need or dt < self.min_window_s:
            return None
        if self._ready_s == 0.0:
            self._ready_s = dt
        if self.align > 0.0:
            # ``cycles`` bursts, from the first one's start to this item's (it begins one)
            _, t_first, made_first = starts[0]
            made = self._made()
            if (
                begins
                and len(starts) > self.cycles
                and made - made_first >= need
                and now - t_first >= self.min_window_s
            ):
                self._window_cost(dt)
                self._spread(starts, now, made)
                return self._measured((made - made_first) / max(now - t_first, 1e-9))
            if dt < (self.cycles + 1) * self._ready_s:
                return None  # wait for the bursts, a few times the time needed at most
        # the whole window (``align=0``, or no burst came)
        self._window_cost(dt)
        return self._measured((self._made() - self._made0) / max(dt, 1e-9))

    def _window_cost(self, dt: float) -> None:
        """The stage's cost over the window that just ended (``dt`` seconds): its
        calls' shares of their time on a core (``on_core``) and waiting for one
        (``waited``), the CPUs its threads kept busy (``cores``), and from them
        ``contended`` (module docstring, step 2). No ``cost``: never contended."""
        c0 = self._c0
        if c0 is None or self._cost is None:
            self.contended = False
            return
        calls, sampled, wall, cpu, wait = (b - a for a, b in zip(c0, self._cost(), strict=True))
        if sampled <= 0 or wall <= 0.0:
            # no call of the stage was sampled in the window (a few slow calls): the
            # last window's reading stands, on purpose (nothing new says otherwise)
            return
        self.on_core = cpu / wall
        self.waited = wait / wall
        self.cores = cpu * (calls / sampled) / max(dt, 1e-9)
        needs_core = self.on_core + self.waited  # on a core, or queued for one
        self.contended = (needs_core >= self.computes and self.waited >= self.core_wait) or (
            _GIL and self.gil_cores <= self.cores <= GIL_MAX_CORES and needs_core < self.gil_share
        )

    def _spread(self, starts: deque[tuple[float, float, int]], now: float, made: int) -> None:
        """Record how much the window's two halves differ: its bursts split at the burst
        start nearest its middle (whole bursts each side, as the window), each half's
        rate against their mean (``noise``)."""
        _, t_first, made_first = starts[0]
        middle = 0.5 * (t_first + now)
        _, t_mid, made_mid = min(list(starts)[1:], key=lambda e: abs(e[1] - middle))
        if not t_first < t_mid < now:
            return
        a = (made_mid - made_first) / (t_mid - t_first)
        b = (made - made_mid) / (now - t_mid)
        if a + b > 0.0:
            self._spreads.append(abs(a - b) / (0.5 * (a + b)))

    def restart(self) -> None:
        """The stage's items stopped flowing through the threads for a while (ran
        inline): the window being measured is void; the check goes on from the same
        count (what it measured before stays)."""
        if self._state != "settled":
            self._skip()

    def detach(self) -> None:
        """The stage closed: drop the callbacks into it (``room``, ``held``), so that a
        closed stage is freed by reference counting, not at a later garbage collection."""
        self._room = self._held = None

    def adopt(self, count: int) -> None:
        """The count was set from outside (a follower took its leader's, ``Lead``) and
        this tuner decides again from now: a new check from ``count`` (within the
        limit), its interval back at the start."""
        self.count = max(self.least, min(int(count), self.limit()))
        self._interval = self.min_interval_s
        self._check()


class Lead(Protocol):
    """One decision for every worker process of a stage (``threads="auto"``).

    The workers of a Loader run the same stage on equal shares, so the count that suits
    one suits all; and a worker measuring alone sees its own change confounded with the
    others' (each adds threads at its own moment, and with in-order delivery a worker's
    rate is tied to the slowest one's). So worker 0 (the *leader*) runs the climb and
    publishes its count; the others (followers) take it, within their own limit, and
    run their own climb only while the leader is not running the stage (it ended its
    share, or has none).
    """

    leader: bool

    def count(self) -> int | None:
        """The leader's thread count while it runs the stage, else None."""
        ...
