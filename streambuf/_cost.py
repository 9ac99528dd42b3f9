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
_CALLS, _SAMPLED, _WALL, _CPU, _WAIT, _NEXT = range(6)


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
    """Wall, CPU and core-wait seconds of a stage's calls, over its threads.

    ``call(fn, x)`` runs ``fn(x)`` on the calling thread and, on a sample of the calls,
    accounts what it cost; ``totals()`` returns the estimated seconds of all calls so
    far, ``(wall, cpu, core_wait)``: a clock to compare two readings of.
    """

    def __init__(self, every: int = 4) -> None:
        if every < 1:
            raise ValueError(f"every={every!r} must be >= 1")
        self.every = int(every)
        self._cells: list[list[int]] = []
        self._lock = threading.Lock()  # (registration of a thread's cell only)
        self._local = threading.local()

    def _cell(self) -> list[int]:
        try:
            return self._local.cell
        except AttributeError:
            cell = [0, 0, 0, 0, 0, 0]
            with self._lock:
                self._cells.append(cell)
            self._local.cell = cell
            return cell

    def call(self, fn: Callable[[Any], T], x: Any) -> T:
        cell = self._cell()
        n = cell[_CALLS]
        cell[_CALLS] = n + 1
        if n < cell[_NEXT]:
            return fn(x)
        cell[_NEXT] = n + 1 + random.randrange(2 * self.every - 1)
        q0 = queued_ns()
        c0 = time.thread_time_ns()
        w0 = time.perf_counter_ns()
        try:
            return fn(x)
        finally:
            w1 = time.perf_counter_ns()
            c1 = time.thread_time_ns()
            cell[_WAIT] += max(0, queued_ns() - q0)
            cell[_CPU] += c1 - c0
            cell[_WALL] += w1 - w0
            cell[_SAMPLED] += 1

    def totals(self) -> tuple[float, float, float]:
        """``(wall, cpu, core_wait)`` seconds of every call so far (sampled, scaled per
        thread to all its calls)."""
        wall = cpu = wait = 0.0
        for cell in list(self._cells):
            calls, sampled = cell[_CALLS], cell[_SAMPLED]
            if sampled:
                scale = calls / sampled / 1e9
                wall += cell[_WALL] * scale
                cpu += cell[_CPU] * scale
                wait += cell[_WAIT] * scale
        return wall, cpu, wait
