"""Measuring what a loader holds in memory (docs/design.md, "Measuring memory").

Per-process RSS/USS/PSS cannot see batches in flight (they travel as unlinked /dev/shm
files whose descriptors wait in a socket), so the figure is **system anonymous plus
shared memory**: ``AnonPages + Shmem`` from /proc/meminfo, sampled every ``interval_s``
on a thread, with /dev/shm usage recorded beside it.

"Growth" of a run is its peak **minus the peak of the same run with tiny items** (same
workers, threads and batch count): start-up and imports cancel out; what is left is what
buffers, queues, batches under construction and the allocator kept. The budget rule is
``growth <= 1.25 * max_bytes + 100 MiB``.

Linux only (reads /proc/meminfo); elsewhere ``available()`` is False.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MemoryPeak", "MemoryWatch", "available", "budget_rule_bytes", "system_used_bytes"]

_MIB = 1 << 20


def available() -> bool:
    """True where /proc/meminfo exists."""
    return os.path.exists("/proc/meminfo")


def system_used_bytes() -> int:
    """``AnonPages + Shmem`` from /proc/meminfo, in bytes."""
    anon = shmem = 0
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"AnonPages:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith(b"Shmem:"):
                shmem = int(line.split()[1]) * 1024
    return anon + shmem


def _dev_shm_used() -> int:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def budget_rule_bytes(max_bytes: int) -> int:
    """The most growth a budget of ``max_bytes`` may show: 1.25 x max_bytes + 100 MiB."""
    return int(1.25 * max_bytes) + 100 * _MIB


@dataclass(frozen=True)
class MemoryPeak:
    """Result of one watched run (bytes).

    Attributes:
        baseline: used memory when the watch started.
        peak: the most used memory seen while watching.
        shm_peak: the most /dev/shm usage seen.
        samples: how many readings were taken.
    """

    baseline: int
    peak: int
    shm_peak: int
    samples: int

    @property
    def rise(self) -> int:
        """peak - baseline."""
        return self.peak - self.baseline


class MemoryWatch:
    """Context manager sampling system used memory on a background thread.

    ``with MemoryWatch() as w: run()`` then ``w.result()``.
    """

    def __init__(self, *, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline = self._peak = self._shm_peak = self._n = 0

    def _sample(self) -> None:
        used = system_used_bytes()
        shm = _dev_shm_used()
        self._peak = max(self._peak, used)
        self._shm_peak = max(self._shm_peak, shm)
        self._n += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> MemoryWatch:
        self._baseline = system_used_bytes()
        self._peak = self._baseline
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="streambuf-memwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()

    def result(self) -> MemoryPeak:
        return MemoryPeak(self._baseline, self._peak, self._shm_peak, self._n)


def watch(fn: Callable[[], Any], *, interval_s: float = 0.02) -> tuple[Any, MemoryPeak]:
    """Run ``fn()`` under a ``MemoryWatch``; returns (its result, the peak)."""
    with MemoryWatch(interval_s=interval_s) as w:
        out = fn()
    return out, w.result()
