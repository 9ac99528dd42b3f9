"""Where the time goes, per stage: ``StageMeter`` (always on) and ``StageStats``.

A pipeline's stages run as a chain of iterators in each worker's thread: the source,
then stage 0, 1, ... Each link is wrapped (``wrap``) so that the time spent in its
``next()`` minus the time of the links it calls on the same thread (its *own* time: a
threaded stage's lanes pull its upstream on their threads, so its own time is the wait
for results) and the items it passed are counted. The
time between the last link handing an output on and being asked for the next one is
*downstream* (the worker handing a batch to the DataLoader and waiting for a credit:
the consumer's side). A threaded ``map`` also times its function on its threads
(``timed``: wall and CPU per call), since its chain time is only the wait for results.

CPU time (``time.thread_time_ns``, a system call) is read on a sample of a link's calls
(after 1 to 128 calls at random, times its inclusive over its own time, up to 64; 1 to
4 after a call that took 2 ms of its own) and on every call
made inside a sampled call (a per-thread flag), so a sampled link's own CPU is its CPU
minus that of the links it called, exactly as for wall time; the link's CPU is its own
time times the CPU per wall second of its sampled calls. Random gaps keep a periodic
cost (a shard opened every N items) from being always or never sampled; the average of
64, stretched for a link whose calls make many (a batch's: all of them are read too),
keeps the cost near 0.1 reads an item. A link whose stage holds items
(a threaded map's or prefetch's window, a shuffle's pool, the source's lanes) registers
a probe (``Env.held``; a source run's ``held()``) read at each flush: gauges of the
items and bytes it holds, back to 0 when the link closes.

Counts are nanoseconds and items in a ``SharedCounters`` made with the pipeline (one
row per worker, summed over workers when read); each link keeps its counts in local
variables and adds them every ``FLUSH`` items and when it closes, so the per-item cost
is two clock reads (counts are published every 64 items and at least every 0.1 s while items pass).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from ._counters import SharedCounters

__all__ = ["StageMeter", "StageStats"]

T = TypeVar("T")
FLUSH = 64
FLUSH_NS = 100_000_000  # and 0.1 s after the last time (a batch-level link sees few items)
SOURCE = -1  # the link index of the source
_FIELDS = (
    "ns", "items", "fn_ns", "fn_cpu_ns", "fn_calls", "fn_cpu_calls",
    "cpu_ns", "cpu_wall_ns", "held_items", "held_bytes", "peak_items", "peak_bytes",
    "core_wait_ns",
)  # fmt: skip
_LINK = _FIELDS[:2] + _FIELDS[6:]  # a link's own (the fn_ fields are its function's)
CPU_EVERY = 8  # a threaded map's function: CPU read on every 8th call (~0.6 us)
CPU_BITS = 7  # a link: CPU read after 1 + 0..127 calls at random (64 on average)
SLOW_NS, SLOW_BITS = 2_000_000, 2  # after a call of 2 ms of its own: 1 + 0..3 calls
Held = Callable[[], tuple[int, int]]  # a stage's probe: (items, bytes) it holds now


@dataclass(frozen=True)
class StageStats:
    """One stage's time, summed over the workers (``LoaderStats.stages``).

    Attributes:
        stage: its name (``source``, ``map(decode)``, ``batch``, ... ; ``downstream``:
            handing outputs on, i.e. the transport and the consumer's credits).
        items: items it passed on.
        own_s: seconds spent in it in the workers' pipeline threads (its upstream
            excluded): the time the chain could not go on without it.
        own_per_item_s: ``own_s / items``.
        core_wait_s: the part of ``own_s`` its thread waited for a core (a busy
            machine; Linux run-queue time, apportioned; 0 elsewhere).
        cpu_s: the CPU seconds of ``own_s`` (the workers' threads that ran the link;
            read on a sample of the calls and scaled). Well below ``own_s``: the link
            waits (I/O, a lock, a lane); about equal: it computes.
        held_items, held_bytes: items and bytes the stage holds now, summed over the
            workers (a threaded map's or prefetch's window, a shuffle's pool, the
            source's lanes; 0 for stages that hold nothing between items).
        peak_items, peak_bytes: the most each worker's stage held at once (as read at
            each publication), summed over the workers: an upper bound of the whole.
        threads: the threads that run it in each worker (a threaded ``map``'s count,
            ``"auto"``: the mean over its runs; the source's lanes; else 1).
        fn_s, fn_cpu_s, fn_calls: a threaded ``map``'s function: wall and CPU seconds
            over its threads (CPU read on every 8th call, scaled), and calls (0 elsewhere). Wall well above CPU: the
            function waits (more threads help); about equal: it computes.
        share: ``own_s`` as a share of all stages' and ``downstream``'s time.
    """

    stage: str
    items: int
    own_s: float
    own_per_item_s: float
    fn_s: float = 0.0
    fn_cpu_s: float = 0.0
    fn_calls: int = 0
    share: float = 0.0
    cpu_s: float = 0.0
    held_items: int = 0
    held_bytes: int = 0
    peak_items: int = 0
    peak_bytes: int = 0
    threads: int = 1
    core_wait_s: float = 0.0


class StageMeter:
    """The counters of one pipeline's ``stages`` links plus the source and downstream
    (see the module docstring). Made in the main process with the pipeline, so forked
    and spawned workers share it."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        names = [f"{k}/{f}" for k in range(SOURCE, stages) for f in _FIELDS]
        self.counters = SharedCounters([*names, "down/ns", "down/items"])
        self._lock = threading.Lock()  # function timings from several threads

    def __getstate__(self) -> dict[str, Any]:
        return {"stages": self.stages, "counters": self.counters}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.stages, self.counters = state["stages"], state["counters"]
        self._lock = threading.Lock()

    def wrap(self, it: Iterator[T], k: int, worker: int, held: Held | None = None) -> Iterator[T]:
        """``it`` (link ``k``: ``SOURCE`` or a stage index), counted in ``worker``'s row;
        ``held``: the stage's probe of what it holds (module docstring)."""
        raw, slots = self.counters.slots(worker, [f"{k}/{f}" for f in _LINK])
        return _metered(it, raw, slots, held)

    def downstream(self, worker: int) -> Callable[[int, int], None]:
        """``add(ns, items)`` for the time between handing an output on and the next
        request (flushed by the caller)."""
        counters = self.counters

        def add(ns: int, items: int) -> None:
            counters.add(worker, {"down/ns": ns, "down/items": items})

        return add

    def timed(self, fn: Callable[[Any], T], k: int, worker: int) -> Callable[[Any], T]:
        """``fn`` counting its wall and thread-CPU time per call into stage ``k``."""
        lock = self._lock
        clock, cpu = time.perf_counter_ns, time.thread_time_ns
        raw, (i_ns, i_cpu, i_calls, i_cpu_calls) = self.counters.slots(
            worker, (f"{k}/fn_ns", f"{k}/fn_cpu_ns", f"{k}/fn_calls", f"{k}/fn_cpu_calls")
        )
        calls = [0]

        def call(x: Any) -> T:
            sample = calls[0] % CPU_EVERY == 0  # (read unlocked: a sample rate, not a count)
            c = cpu() if sample else 0
            t = clock()
            try:
                return fn(x)
            finally:
                dt = clock() - t
                dc = cpu() - c if sample else 0
                with lock:  # the lanes of this process share the row
                    calls[0] += 1
                    raw[i_ns] += dt
                    raw[i_calls] += 1
                    if sample:
                        raw[i_cpu] += dc
                        raw[i_cpu_calls] += 1

        return call

    def totals(self) -> dict[str, int]:
        return self.counters.totals()

    def stats(self, names: list[str]) -> tuple[StageStats, ...]:
        """Per link, in the order data flows: ``names[0]`` the source's, then the stages',
        then ``downstream``."""
        c = self.totals()
        rows: list[dict[str, Any]] = []
        for k, name in zip(range(SOURCE, self.stages), names):
            g = {f: c[f"{k}/{f}"] for f in _FIELDS}
            fn_cpu, own_cpu = g["fn_cpu_ns"], g["cpu_ns"]
            if g["fn_cpu_calls"]:  # read on a sample of the calls: scaled to all of them
                fn_cpu = min(g["fn_ns"], fn_cpu * g["fn_calls"] // g["fn_cpu_calls"])
            if g["cpu_wall_ns"] > 0:  # CPU per wall second of the sampled calls, to all
                own_cpu = min(g["ns"], max(0, own_cpu) * g["ns"] // g["cpu_wall_ns"])
            rows.append(dict(g, stage=name, fn_cpu_ns=fn_cpu, cpu_ns=own_cpu))
        rows.append(dict.fromkeys(_FIELDS, 0) | {"stage": "downstream"})
        rows[-1].update(ns=c["down/ns"], items=c["down/items"])
        total = sum(r["ns"] for r in rows) or 1
        return tuple(
            StageStats(
                stage=r["stage"],
                items=r["items"],
                own_s=r["ns"] / 1e9,
                own_per_item_s=r["ns"] / 1e9 / r["items"] if r["items"] else 0.0,
                fn_s=r["fn_ns"] / 1e9,
                fn_cpu_s=r["fn_cpu_ns"] / 1e9,
                fn_calls=r["fn_calls"],
                share=r["ns"] / total,
                cpu_s=r["cpu_ns"] / 1e9,
                held_items=r["held_items"],
                held_bytes=r["held_bytes"],
                peak_items=r["peak_items"],
                peak_bytes=r["peak_bytes"],
                core_wait_s=r["core_wait_ns"] / 1e9,
            )
            for r in rows
        )


RQ_EVERY_NS = 20_000_000
_RQ = threading.local()  # per thread: its schedstat file (of this pid), the last reading


def _core_wait(own_ns: int) -> int:
    """The part of ``own_ns`` (a link's own time since its last flush, on this thread)
    its thread spent waiting for a core: ``own_ns`` times the share of the wall time
    since this thread's previous reading it spent in the run queue (Linux
    ``/proc/thread-self/schedstat``, one ``pread``, ~1 us, at most every ``RQ_EVERY_NS``
    per thread: the share measured last serves between readings; 0 elsewhere). CPU time below
    wall time then tells waiting for I/O from waiting for a busy machine."""
    now = time.perf_counter_ns()
    if now - getattr(_RQ, "read_at", 0) < RQ_EVERY_NS and getattr(_RQ, "pid", 0) == os.getpid():
        return int(own_ns * _RQ.share)  # (the share measured last, on this thread)
    _RQ.read_at = now
    pid = os.getpid()
    if getattr(_RQ, "pid", None) != pid:  # (first use on this thread, or a forked copy)
        _RQ.pid, _RQ.last, _RQ.share = pid, None, 0.0
        try:
            _RQ.file = open("/proc/thread-self/schedstat", "rb", buffering=0)
        except OSError:
            _RQ.file = None
    file = _RQ.file
    if file is None:
        return 0
    try:
        queued = int(os.pread(file.fileno(), 128, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    last = _RQ.last
    _RQ.last = (now, queued)
    if last is None or now <= last[0]:
        return 0
    _RQ.share = share = min(1.0, max(0.0, (queued - last[1]) / (now - last[0])))
    return int(own_ns * share)


# per thread (by ident): [inclusive wall ns, inclusive CPU ns of the links called inside
# the running one, sampled calls running]; every link puts back what it found, so an
# idle thread's cell holds zeros
_CELL = threading.local()  # .cell (gone with its thread)


def _metered(it: Iterator[T], raw: Any, slots: list[int], held: Held | None) -> Iterator[T]:
    """``it``, counting the time its ``next()`` takes minus the time of the links it
    calls on the same thread (so a link's time is its own whichever thread pulls it: a
    threaded stage's lanes pull its upstream on their threads), its CPU likewise on
    sampled calls (module docstring), what its stage holds, and how long its thread
    waited for a core (``_core_wait``, at each flush). ~0.4 us an item."""
    clock, cpu_clock, local = time.perf_counter_ns, time.thread_time_ns, _CELL
    bits = random.getrandbits
    i_ns, i_items, i_cpu, i_cpu_wall, i_held, i_held_bytes, i_peak, i_peak_bytes, i_core = slots
    ns = n = flushed = cpu = cpu_wall = nxt = 0
    last = clock()
    _core_wait(0)  # (a start for this thread's run-queue reading)

    def flush() -> None:
        nonlocal ns, flushed, cpu, cpu_wall
        raw[i_core] += _core_wait(ns)
        raw[i_ns] += ns
        raw[i_items] += n - flushed
        raw[i_cpu] += cpu
        raw[i_cpu_wall] += cpu_wall
        ns = cpu = cpu_wall = 0
        flushed = n
        if held is not None:
            try:
                items, size = held()
            except Exception:  # (a probe never fails the run: e.g. at interpreter exit)
                return
            raw[i_held], raw[i_held_bytes] = items, size
            if items > raw[i_peak]:
                raw[i_peak] = items
            if size > raw[i_peak_bytes]:
                raw[i_peak_bytes] = size

    try:
        while True:
            try:
                cell = local.cell
            except AttributeError:  # (this thread's first link)
                cell = local.cell = [0, 0, 0]
            outer = cell[0]
            cell[0] = 0
            if n >= nxt or cell[2]:  # a sampled call
                outer_cpu = cell[1]
                cell[1] = 0
                cell[2] += 1  # the calls it makes are sampled too
                c = cpu_clock()
                t = clock()
                try:
                    x = next(it)
                finally:  # StopIteration included: the cell as found, plus this call
                    dt = clock() - t
                    dc = cpu_clock() - c
                    own = dt - cell[0]
                    ns += own
                    cpu += dc - cell[1]
                    cpu_wall += own
                    cell[0] = outer + dt
                    cell[1] = outer_cpu + dc
                    cell[2] -= 1
                if own >= SLOW_NS:  # slow calls: read often (cheap beside them)
                    nxt = n + 1 + bits(SLOW_BITS)
                else:  # fewer for a call that makes many (all read): dt over own
                    nxt = n + (1 + bits(CPU_BITS)) * min(64, 1 + dt // (own + 1))
            else:
                t = clock()
                try:
                    x = next(it)
                except BaseException:  # StopIteration included
                    dt = clock() - t
                    ns += dt - cell[0]
                    cell[0] = outer + dt
                    raise
                dt = clock() - t
                ns += dt - cell[0]
                cell[0] = outer + dt
            n += 1
            if n - flushed >= FLUSH or t - last >= FLUSH_NS:
                flush()
                last = t
            yield x
    except StopIteration:
        return
    finally:
        flush()
        if held is not None:  # the run ended: it holds nothing
            raw[i_held] = raw[i_held_bytes] = 0
        close = getattr(it, "close", None)
        if close is not None:
            close()
