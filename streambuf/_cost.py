"""What a stage's own calls cost on its threads: wall, CPU and core wait (``CallCost``).

``threads="auto"`` (``streambuf._tuner``) decides whether more threads would fight for
cores from the stage's own calls, not from how busy the machine is: a thread that
sleeps on I/O costs no CPU however busy other processes keep the machine, while a
function that computes (or holds the GIL) gains nothing from more threads once its
threads wait for cores. Per sampled call this module reads the wall time
(``time.perf_counter_ns``), the thread's CPU time (``time.thread_time_ns``) and the time
the thread spent in the run queue, waiting for a core (Linux
``/proc/thread-self/schedstat``, its second field; 0 elsewhere).

Ownership and invariants: one ``CallCost`` per stage copy (a worker's threaded map, a
source's lanes); each thread writes only its own cell (no lock on the per-call path);
``totals()`` may run on any thread and sums the cells, scaled from the sampled calls to
all calls. A thread's calls are sampled one in ``every`` on average (the first one
included; then after 1 to 2 * ``every`` - 1 calls at random: a fixed period would
alias with a periodic cost, e.g. a shard opened every 4th read, always or never
sampled), about 2 us a sampled call.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["CallCost"]

T = TypeVar("T")


class _Queue(threading.local):
    """This thread's schedstat file (of this process: a forked copy opens its own)."""

    pid = 0
    file: Any = None


_QUEUE = _Queue()


def queued_ns() -> int:
    """Nanoseconds this thread has waited in the run queue so far (0 where the system
    does not say)."""
    q = _QUEUE
    pid = os.getpid()
    if q.pid != pid:
        q.pid = pid
        try:
            q.file = open("/proc/thread-self/schedstat", "rb", buffering=0)
        except OSError:
            q.file = None
    if q.file is None:
        return 0
    try:
        return int(os.pread(q.file.fileno(), 128, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return 0


class CallCost:
    """Wall, CPU and core-wait seconds of a stage's sampled calls, over its threads.

    ``call(fn, x)`` runs ``fn(x)`` on the calling thread and, on a sample of the calls,
    accounts what it cost; ``totals()`` returns running sums (each only grows): the
    calls made, the calls sampled, and the sampled calls' wall, CPU and core-wait
    seconds. Compare two readings: the shares of a call's time on a core and waiting
    for one are ratios of the sampled sums' differences, and the CPUs the calls kept
    busy are the sampled CPU scaled by the calls made over those sampled.

    Each thread's cell is ``[calls, next sampled call, (sampled, wall, cpu, wait)]``:
    the sums are one tuple, replaced whole, so a reader on another thread never sees
    a sample half added. Sampling draws from the object's own random generator (the
    user's ``random`` stream is left alone).
    """

    def __init__(self, every: int = 4) -> None:
        if every < 1:
            raise ValueError(f"every={every!r} must be >= 1")
        self.every = int(every)
        self._cells: list[list[Any]] = []
        self._lock = threading.Lock()  # (registration of a thread's cell only)
        self._local = threading.local()
        self._rng = random.Random()

    def _cell(self) -> list[Any]:
        try:
            return self._local.cell
        except AttributeError:
            cell: list[Any] = [0, 0, (0, 0, 0, 0)]
            with self._lock:
                self._cells.append(cell)
            self._local.cell = cell
            return cell

    def call(self, fn: Callable[[Any], T], x: Any) -> T:
        cell = self._cell()
        n = cell[0]
        cell[0] = n + 1
        if n < cell[1]:
            return fn(x)
        cell[1] = n + 1 + self._rng.randrange(2 * self.every - 1)
        q0 = queued_ns()
        c0 = time.thread_time_ns()
        w0 = time.perf_counter_ns()
        try:
            return fn(x)
        finally:
            w1 = time.perf_counter_ns()
            c1 = time.thread_time_ns()
            q1 = queued_ns()
            k, wall, cpu, wait = cell[2]
            cell[2] = (k + 1, wall + w1 - w0, cpu + c1 - c0, wait + max(0, q1 - q0))

    def totals(self) -> tuple[int, int, float, float, float]:
        """``(calls, sampled, wall, cpu, core_wait)``: calls made and sampled so far, and
        the sampled calls' seconds, over every thread (running sums)."""
        calls = sampled = wall = cpu = wait = 0
        for cell in list(self._cells):
            calls += cell[0]
            k, w, c, q = cell[2]
            sampled += k
            wall += w
            cpu += c
            wait += q
        return calls, sampled, wall / 1e9, cpu / 1e9, wait / 1e9
