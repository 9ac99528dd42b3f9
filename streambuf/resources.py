"""CPU and memory limits as a container sees them, and defaults that respect them.

A container limited to 2 CPUs on a 64-core host still reports 64 from ``os.cpu_count()``;
workers sized from that are throttled. The CPU limit is the smallest of: cgroup v2
``cpu.max`` (quota/period), cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, and the
process's CPU affinity. The memory limit is the smallest of cgroup v2 ``memory.max``,
cgroup v1 ``memory.limit_in_bytes`` (values near 2**63 mean "none") and physical memory.

Every reader takes ``root`` (default ``/sys/fs/cgroup``) so tests can point it at a fake
tree, and ``/proc/self/cgroup`` is used to find the process's own cgroup when present.

``loader_defaults`` is the one place the ``Loader``'s defaults (``num_workers``,
``max_batches``, ``max_bytes`` left at ``"auto"``) are chosen: a pure function of the
``Limits`` read here, returning the values with their reasons (docs/defaults.md).
``recommend`` takes its worker and batch counts from the same functions.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BATCHES_PER_WORKER",
    "MAX_BYTES_CEILING",
    "MAX_BYTES_FLOOR",
    "MAX_BYTES_SHARE",
    "MAX_WORKERS",
    "WORKER_BYTES",
    "WORKER_MEMORY_SHARE",
    "Limits",
    "LoaderDefaults",
    "Recommendation",
    "auto_max_batches",
    "auto_max_bytes",
    "auto_num_workers",
    "cpu_limit",
    "cpu_seconds",
    "loader_defaults",
    "memory_available",
    "memory_limit",
    "read_limits",
    "recommend",
    "torch_suggested_workers",
]

# -- the numbers behind the Loader's defaults (docs/defaults.md says why each) ---------
WORKER_BYTES = 512 << 20  # memory allowed for each worker process
WORKER_MEMORY_SHARE = 0.5  # workers together take at most this share of the memory limit
MAX_WORKERS = 64  # the shared counters' rows (streambuf._counters)
BATCHES_PER_WORKER = 4  # max_batches="auto": this many a worker...
MIN_BATCHES = 2  # ...and at least this many
MAX_BYTES_SHARE = 0.25  # max_bytes="auto": this share of the memory available...
MAX_BYTES_FLOOR = 256 << 20  # ...at least this...
MAX_BYTES_CEILING = 16 << 30  # ...at most this (unless the fixed stage buffers need more)

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
    *,
    root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    physical: int | None = None,
    system_available: int | None = None,
) -> int:
    """Bytes that can still be used: min(system available, cgroup limit - cgroup usage)
    (``physical``, ``system_available``: the machine's, read when None)."""
    if system_available is None:
        import psutil

        system_available = int(psutil.virtual_memory().available)
    avail = system_available
    limit = memory_limit(root=root, proc_cgroup=proc_cgroup, physical=physical)
    for d in _own_cgroup_dirs(Path(root), Path(proc_cgroup)):
        used = _read(d / "memory.current") or _read(d / "memory.usage_in_bytes")
        if used:
            return max(0, min(avail, limit - int(used)))
    return min(avail, limit)


def torch_suggested_workers(affinity: int | None = None) -> int | None:
    """The most worker processes torch's DataLoader accepts without its warning "This
    DataLoader will create N worker processes in total. Our suggested max number of
    worker in current system is M": the CPUs in this process's affinity, else
    ``os.cpu_count()``, as ``torch.utils.data.DataLoader``'s
    ``check_worker_number_rationality`` counts them (``torch._utils.cpu_count``).
    ``affinity``: that count, given. None: torch cannot tell (it warns for any worker)."""
    if affinity is not None:
        return affinity
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


@dataclass(frozen=True)
class Limits:
    """What this process may use.

    Attributes:
        cpus: the CPU limit (``cpu_limit``: cgroup quota and affinity; may be fractional).
        memory_bytes: the memory limit (``memory_limit``: cgroup or physical memory).
        cores: the machine's cores (``os.cpu_count()``); None: not known, no bound.
        suggested_workers: torch's DataLoader's most workers without a warning
            (``torch_suggested_workers``); None: not known, no bound.
        available_bytes: memory still available (``memory_available``); None: take
            ``memory_bytes``.
        local_processes: the job's processes on this node that share these limits,
            each with its own Loader (``LOCAL_WORLD_SIZE``, set by ``torchrun``; 1
            when not set): the defaults give each process its share.
    """

    cpus: float
    memory_bytes: int
    cores: int | None = None
    suggested_workers: int | None = None
    available_bytes: int | None = None
    local_processes: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def available(self) -> int:
        """Memory available now (the memory limit when not known)."""
        return self.memory_bytes if self.available_bytes is None else self.available_bytes


def read_limits(
    *,
    root: str | Path = "/sys/fs/cgroup",
    proc_cgroup: str | Path = "/proc/self/cgroup",
    affinity: int | None = None,
    physical: int | None = None,
    cores: int | None = None,
    system_available: int | None = None,
    local_processes: int | None = None,
) -> Limits:
    """Every limit of this process (the readers' keyword arguments; ``affinity``,
    ``physical``, ``cores``, ``system_available`` stand in for the machine's own
    readings when given: the CPUs in the affinity mask, physical memory,
    ``os.cpu_count()``, the system's available memory; ``local_processes``: the
    job's processes on this node, else ``LOCAL_WORLD_SIZE`` from the environment)."""
    roots: dict[str, Any] = {"root": root, "proc_cgroup": proc_cgroup}
    return Limits(
        cpus=cpu_limit(**roots, affinity=affinity),
        memory_bytes=memory_limit(**roots, physical=physical),
        cores=cores if cores is not None else os.cpu_count(),
        suggested_workers=torch_suggested_workers(affinity),
        available_bytes=memory_available(
            **roots, physical=physical, system_available=system_available
        ),
        local_processes=local_processes if local_processes is not None else _local_processes(),
    )


def _local_processes() -> int:
    """``LOCAL_WORLD_SIZE`` (the job's processes on this node, ``torchrun``), else 1."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    try:
        return max(1, int(text))
    except ValueError:
        return 1


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


def auto_num_workers(
    limits: Limits, *, on_device: str | None = None, max_batches: int | None = None
) -> tuple[int, str]:
    """``num_workers="auto"``: (count, why).

    The usable CPUs are the fewest of the CPU limit (rounded down, at least 1), the
    machine's cores and torch's suggested maximum; one worker per usable CPU, one left
    for the training loop above two. Then at most what the memory limit holds at
    ``WORKER_BYTES`` a worker in ``WORKER_MEMORY_SHARE`` of it (at least 1), at most
    ``max_batches`` (given in order: each worker owns a batch of credit) and
    ``MAX_WORKERS``. A pipeline that decodes onto a device: 0 (it runs in this process).
    """
    if on_device is not None:
        return 0, f"the pipeline decodes onto {on_device!r}: in this process"
    local = max(1, limits.local_processes)
    bounds = [(max(1, math.floor(limits.cpus)), f"cgroup quota and affinity: {limits.cpus:g}")]
    if limits.cores is not None:
        bounds.append((limits.cores, "the machine's cores"))
    if limits.suggested_workers is not None:
        bounds.append((limits.suggested_workers, "torch's suggested max"))
    cpus, by = min(bounds, key=lambda b: b[0])  # the first of the fewest
    if local > 1:  # each of the node's processes gets its share
        cpus, by = max(1, cpus // local), f"{by}, shared by {local} processes on this node"
    count = cpus - 1 if cpus > 2 else cpus
    why = f"{cpus} CPU{'s' if cpus != 1 else ''}, by {by}"
    if cpus > 2:
        why += ", one left for the training loop"
    memory = limits.memory_bytes // local
    by_memory = max(1, int(memory * WORKER_MEMORY_SHARE) // WORKER_BYTES)
    if by_memory < count:
        count = by_memory
        why = (
            f"{WORKER_BYTES >> 20} MiB a worker in {WORKER_MEMORY_SHARE:.0%} of the "
            f"{_size(memory)} memory limit"
            + (f" (a share of {local} processes on this node)" if local > 1 else "")
        )
    if max_batches is not None and max_batches < count:
        count, why = max_batches, f"max_batches={max_batches}: a batch of credit a worker"
    if count > MAX_WORKERS:
        count, why = MAX_WORKERS, f"at most {MAX_WORKERS}"
    return count, why


def auto_max_batches(num_workers: int) -> tuple[int, str]:
    """``max_batches="auto"``: ``BATCHES_PER_WORKER`` a worker, at least ``MIN_BATCHES``
    (the depth tuner starts at 2 a worker and grows up to it while the loop waits)."""
    per_worker = BATCHES_PER_WORKER * num_workers
    if per_worker < MIN_BATCHES:
        return MIN_BATCHES, f"at least {MIN_BATCHES}"
    return per_worker, f"{BATCHES_PER_WORKER} per worker"


def auto_max_bytes(available: int, *, fixed_bytes: int = 0) -> tuple[int, str]:
    """``max_bytes="auto"``: (bytes, why): ``MAX_BYTES_SHARE`` of the memory available,
    within ``[MAX_BYTES_FLOOR, MAX_BYTES_CEILING]``, and at least twice the pipeline's
    fixed stage buffers (``fixed_bytes``, all copies: the Loader refuses a ``max_bytes``
    they take over half of) while that fits in half of what is available.

    Raises:
        ValueError: the fixed stage buffers need more than half of the memory available
            (how much they need, and how to pin ``max_bytes``).
    """
    share = int(available * MAX_BYTES_SHARE)
    value = min(MAX_BYTES_CEILING, max(MAX_BYTES_FLOOR, share))
    why = f"{MAX_BYTES_SHARE:.0%} of {_size(available)} available"
    if value != share:
        bound = "floor" if value == MAX_BYTES_FLOOR else "ceiling"
        why += f", the {bound} {_size(value)}"
    need = 2 * fixed_bytes
    if need > value:
        if need > available // 2:
            raise ValueError(
                f"max_bytes='auto': the pipeline's fixed stage buffers ({fixed_bytes} bytes) "
                f"need max_bytes >= {need} ({_size(need)}), more than half of the "
                f"{_size(available)} memory available; pin it, e.g. max_bytes={need} "
                "(if the memory is there), or use fewer workers or a smaller stage buffer "
                "(pack: a shorter seq_len)"
            )
        value, why = need, f"twice the pipeline's fixed stage buffers ({_size(fixed_bytes)})"
    return value, why


@dataclass(frozen=True)
class LoaderDefaults:
    """The ``Loader``'s ``num_workers``, ``max_batches``, ``max_bytes``, with the reason
    for each (``"given"`` where it was pinned) and whether it was chosen ("auto")."""

    num_workers: int
    max_batches: int
    max_bytes: int
    reasons: tuple[str, str, str]
    auto: tuple[bool, bool, bool]

    def line(self) -> str:
        """One log line naming the three values and why."""
        parts = []
        for name, value, why, auto in zip(
            ("num_workers", "max_batches", "max_bytes"),
            (self.num_workers, self.max_batches, self.max_bytes),
            self.reasons,
            self.auto,
        ):
            shown = _size(value) if name == "max_bytes" else str(value)
            parts.append(f"{name}=auto -> {shown} ({why})" if auto else f"{name}={shown}")
        return "streambuf.Loader: " + ", ".join(parts)


def loader_defaults(
    limits: Limits | None = None,
    *,
    num_workers: int | str = "auto",
    max_batches: int | str = "auto",
    max_bytes: int | str = "auto",
    in_order: bool = True,
    on_device: str | None = None,
    fixed_bytes_per_copy: int = 0,
) -> LoaderDefaults:
    """The ``Loader``'s three budgets: those given "auto" chosen from ``limits`` (read
    from this machine when None and needed), the others kept (already checked ints).

    ``num_workers`` first (``auto_num_workers``; capped by a given ``max_batches`` when
    ``in_order``), then ``max_batches`` from it (``auto_max_batches``), then
    ``max_bytes`` from the memory available and the fixed stage buffers of
    ``max(1, num_workers)`` copies (``auto_max_bytes``).
    """
    auto = (num_workers == "auto", max_batches == "auto", max_bytes == "auto")
    if any(auto) and limits is None:
        limits = read_limits()
    reasons = ["given", "given", "given"]
    if num_workers == "auto":
        assert limits is not None
        cap = max_batches if in_order and isinstance(max_batches, int) else None
        num_workers, reasons[0] = auto_num_workers(limits, on_device=on_device, max_batches=cap)
    assert isinstance(num_workers, int)
    if max_batches == "auto":
        max_batches, reasons[1] = auto_max_batches(num_workers)
    assert isinstance(max_batches, int)
    if max_bytes == "auto":
        assert limits is not None
        fixed = fixed_bytes_per_copy * max(1, num_workers)
        local = max(1, limits.local_processes)
        max_bytes, reasons[2] = auto_max_bytes(limits.available // local, fixed_bytes=fixed)
        if local > 1:
            reasons[2] += f", this process's share of {local} on this node"
    assert isinstance(max_bytes, int)
    return LoaderDefaults(
        num_workers, max_batches, max_bytes, (reasons[0], reasons[1], reasons[2]), auto
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
    reasons = [
        f"CPU limit {lim.cpus:g} (cgroup quota and affinity), memory limit "
        f"{lim.memory_bytes / (1 << 30):.1f} GiB"
    ]
    # the Loader's num_workers="auto" count (the same function)
    num_workers, why = auto_num_workers(lim)
    reasons.append(f"num_workers={num_workers}: one process per usable CPU ({why})")
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
        max_batches, why = auto_max_batches(num_workers)  # the Loader's "auto"
        reasons.append(f"max_batches={max_batches}: {why} (batch size unknown)")
    return Recommendation(num_workers, threads, max_bytes, max_batches, tuple(reasons))
