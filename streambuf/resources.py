"""CPU and memory limits as a container sees them, and defaults that respect them.

A container limited to 2 CPUs on a 64-core host still reports 64 from ``os.cpu_count()``;
workers sized from that are throttled. The CPU limit is the smallest of: cgroup v2
``cpu.max`` (quota/period), cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, and the
process's CPU affinity. The memory limit is the smallest of cgroup v2 ``memory.max``,
cgroup v1 ``memory.limit_in_bytes`` (values near 2**63 mean "none") and physical memory.

Every reader takes ``root`` (default ``/sys/fs/cgroup``) so tests can point it at a fake
tree, and ``/proc/self/cgroup`` is used to find the process's own cgroup when present.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Limits",
    "Recommendation",
    "cpu_limit",
    "cpu_seconds",
    "memory_limit",
    "read_limits",
    "recommend",
]

_NO_LIMIT_V1 = 1 << 60  # v1 reports "no limit" as a huge page-aligned number


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """Candidate cgroup folders for this process: its own (from /proc/self/cgroup), then root."""
    dirs: list[Path] = []
    text = _read(proc_cgroup) or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        rel = parts[2].lstrip("/")
        # v1 mounts "cpu,cpuacct" as one folder (plus per-controller links); v2 has ""
        controllers = [parts[1], *parts[1].split(",")] if parts[1] else [""]
        for c in controllers:
            base = root / c if c else root
            if rel:
                dirs.append(base / rel)
            dirs.append(base)
    dirs.append(root)
    seen: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def cpu_limit(
    *,
    root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    affinity: int | None = None,
) -> float:
    """CPUs this process may use (may be fractional, e.g. 1.5)."""
    root = Path(root)
    limits: list[float] = []
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except AttributeError:
            affinity = os.cpu_count() or 1
    limits.append(float(affinity))
    for d in _own_cgroup_dirs(root, Path(proc_cgroup)):
        v2 = _read(d / "cpu.max")
        if v2:
            quota, _, period = v2.partition(" ")
            if quota != "max":
                limits.append(int(quota) / int(period or 100000))
        q = _read(d / "cpu.cfs_quota_us")
        p = _read(d / "cpu.cfs_period_us")
        if q and p and int(q) > 0:
            limits.append(int(q) / int(p))
    return max(0.01, min(limits))


def cpu_seconds(
    *,
    root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    proc_stat: str | Path = "/proc/stat",
) -> float:
    """CPU seconds used so far by every process sharing this container's CPU limit: the
    cgroup's usage (v2 ``cpu.stat`` ``usage_usec``, v1 ``cpuacct.usage``), else the
    whole machine's (``/proc/stat``: the CPUs are busy whoever keeps them so), else this
    process's. A clock: compare two readings (``streambuf._tuner``: are the CPUs busy?)."""
    root = Path(root)
    for d in _own_cgroup_dirs(root, Path(proc_cgroup)):
        v2 = _read(d / "cpu.stat")
        if v2:
            for line in v2.splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
        v1 = _read(d / "cpuacct.usage")
        if v1 and v1.isdigit():
            return int(v1) / 1e9
    stat = _read(Path(proc_stat))
    if stat and stat.startswith("cpu "):
        ticks = [int(x) for x in stat.split("\n", 1)[0].split()[1:]]
        busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # not idle, iowait
        return busy / os.sysconf("SC_CLK_TCK")
    import time

    return time.process_time()


def memory_limit(
    *,
    root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    physical: int | None = None,
) -> int:
    """Bytes of memory this process's cgroup may use (physical memory if unlimited)."""
    root = Path(root)
    if physical is None:
        import psutil

        physical = int(psutil.virtual_memory().total)
    limits = [physical]
    for d in _own_cgroup_dirs(root, Path(proc_cgroup)):
        v2 = _read(d / "memory.max")
        if v2 and v2 != "max":
            limits.append(int(v2))
        v1 = _read(d / "memory.limit_in_bytes")
        if v1 and int(v1) < _NO_LIMIT_V1:
            limits.append(int(v1))
    return min(limits)


def memory_available(
    *, root: str | Path = "/sys/fs/cgroup", proc_cgroup: str | Path = "/proc/self/cgroup"
) -> int:
    """Bytes that can still be used: min(system available, cgroup limit - cgroup usage)."""
    import psutil

    avail = int(psutil.virtual_memory().available)
    limit = memory_limit(root=root, proc_cgroup=proc_cgroup)
    for d in _own_cgroup_dirs(Path(root), Path(proc_cgroup)):
        used = _read(d / "memory.current") or _read(d / "memory.usage_in_bytes")
        if used:
            return max(0, min(avail, limit - int(used)))
    return min(avail, limit)


@dataclass(frozen=True)
class Limits:
    cpus: float
    memory_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_limits(**kwargs: Any) -> Limits:
    """Both limits (same keyword arguments as ``cpu_limit``/``memory_limit`` roots)."""
    roots = {k: v for k, v in kwargs.items() if k in ("root", "proc_cgroup")}
    return Limits(
        cpus=cpu_limit(**roots, affinity=kwargs.get("affinity")),
        memory_bytes=memory_limit(**roots, physical=kwargs.get("physical")),
    )


@dataclass(frozen=True)
class Recommendation:
    """Defaults for a Loader on this machine, with the reasons.

    Attributes:
        num_workers: worker processes (CPU-bound work needs processes).
        threads: threads per worker for ``.map`` (I/O-bound work needs concurrency).
        max_bytes: a byte budget that fits the memory limit.
        max_batches: a batch budget.
        reasons: one line per choice.
    """

    num_workers: int
    threads: int
    max_bytes: int
    max_batches: int
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def recommend(
    *,
    batch_bytes: int | None = None,
    io_bound: bool = True,
    memory_fraction: float = 0.25,
    limits: Limits | None = None,
) -> Recommendation:
    """Defaults for ``num_workers``, ``threads``, ``max_bytes`` that respect the limits.

    Args:
        batch_bytes: size of one batch, if known (sets max_batches from max_bytes).
        io_bound: samples wait on I/O or GIL-releasing decode (more threads help).
        memory_fraction: share of the memory limit the loader may hold in flight.
        limits: the limits to respect (read from this machine when None).
    """
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"{memory_fraction=} must be in (0, 1]")
    lim = limits or read_limits()
    cpus = max(1, math.floor(lim.cpus))
    reasons = [
        f"CPU limit {lim.cpus:g} (cgroup quota and affinity), memory limit "
        f"{lim.memory_bytes / (1 << 30):.1f} GiB"
    ]
    num_workers = max(1, cpus - 1) if cpus > 2 else cpus
    reasons.append(
        f"num_workers={num_workers}: one process per usable CPU"
        + (", one left for the training loop" if cpus > 2 else "")
    )
    threads = 16 if io_bound else 1
    reasons.append(
        f"threads={threads}: "
        + (
            "latency-bound samples need concurrency, threads are cheap"
            if io_bound
            else "CPU-bound Python gains nothing from threads under the GIL"
        )
    )
    max_bytes = max(1 << 20, int(lim.memory_bytes * memory_fraction))
    reasons.append(
        f"max_bytes={max_bytes >> 20} MiB: {memory_fraction:.0%} of the memory limit "
        "(the rest is the model, the framework and the OS page cache)"
    )
    if batch_bytes:
        max_batches = max(num_workers, min(64, max_bytes // max(1, batch_bytes)))
        reasons.append(f"max_batches={max_batches}: as many {batch_bytes >> 20} MiB batches as fit")
    else:
        max_batches = 4 * num_workers
        reasons.append(f"max_batches={max_batches}: 4 per worker (batch size unknown)")
    return Recommendation(num_workers, threads, max_bytes, max_batches, tuple(reasons))
