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

Counts are nanoseconds and items in a ``SharedCounters`` made with the pipeline (one
row per worker, summed over workers when read); each link keeps its counts in local
variables and adds them every ``FLUSH`` items and when it closes, so the per-item cost
is two clock reads (counts are published every 64 items and at least every 0.1 s while items pass).
"""

from __future__ import annotations

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
_FIELDS = ("ns", "items", "fn_ns", "fn_cpu_ns", "fn_calls", "fn_cpu_calls")
CPU_EVERY = 8  # a function's CPU time is read on every 8th call (a system call, ~0.6 us)


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

    def wrap(self, it: Iterator[T], k: int, worker: int) -> Iterator[T]:
        """``it`` (link ``k``: ``SOURCE`` or a stage index), counted in ``worker``'s row."""
        return _metered(it, self.counters, worker, f"{k}/ns", f"{k}/items")

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
        rows: list[tuple[str, int, int, int, int, int]] = []
        for k, name in zip(range(SOURCE, self.stages), names):
            own, items, fn, cpu, calls, cpu_calls = (c[f"{k}/{x}"] for x in _FIELDS)
            if cpu_calls:  # CPU was read on a sample of the calls: scaled to all of them
                cpu = min(fn, cpu * calls // cpu_calls)  # (a call's CPU is within its wall)
            rows.append((name, items, own, fn, cpu, calls))
        rows.append(("downstream", c["down/items"], c["down/ns"], 0, 0, 0))
        total = sum(r[2] for r in rows) or 1
        return tuple(
            StageStats(
                stage=name,
                items=items,
                own_s=own / 1e9,
                own_per_item_s=own / 1e9 / items if items else 0.0,
                fn_s=fn / 1e9,
                fn_cpu_s=cpu / 1e9,
                fn_calls=calls,
                share=own / total,
            )
            for name, items, own, fn, cpu, calls in rows
        )


# per thread (by ident): [inclusive ns of the links called inside the running one];
# every link puts back what it found, so an idle thread's cell holds 0
_CELLS: dict[int, list[int]] = {}


def _metered(
    it: Iterator[T], counters: SharedCounters, worker: int, ns_key: str, items_key: str
) -> Iterator[T]:
    """``it``, counting the time its ``next()`` takes minus the time of the links it
    calls on the same thread (so a link's time is its own whichever thread pulls it: a
    threaded stage's lanes pull its upstream on their threads). ~0.3 us an item."""
    clock, cells, ident = time.perf_counter_ns, _CELLS, threading.get_ident
    ns = n = flushed = 0
    last = clock()
    try:
        while True:
            cell = cells.get(ident())
            if cell is None:
                cell = cells.setdefault(ident(), [0])
            outer = cell[0]
            cell[0] = 0
            t = clock()
            try:
                x = next(it)
            except BaseException:  # StopIteration included: the cell as it was found
                dt = clock() - t
                ns += dt - cell[0]
                cell[0] = outer + dt
                raise
            dt = clock() - t
            ns += dt - cell[0]
            cell[0] = outer + dt
            n += 1
            if n - flushed >= FLUSH or t - last >= FLUSH_NS:
                counters.add(worker, {ns_key: ns, items_key: n - flushed})
                ns, flushed, last = 0, n, t
            yield x
    except StopIteration:
        return
    finally:
        counters.add(worker, {ns_key: ns, items_key: n - flushed})
        close = getattr(it, "close", None)
        if close is not None:
            close()
