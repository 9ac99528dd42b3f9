"""What every benchmark shares: isolated runs under a memory watch, interleaved repeats,
medians and the environment record.

A *run* is one loader configuration (a JSON-able dict naming its ``runner``,
``"module:function"``) executed either in a fresh child process (``python -m
streambuf.bench._child``: allocator state and imports never leak between runs) while
this process samples system used memory (``streambuf.bench.memwatch``, docs/design.md "Measuring
memory"), or, for the tiny smoke-test sizes, in this process. Repeats are interleaved
(A B C, A B C, ...) so that machine noise hits every side alike; figures are medians.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._deps import package_versions, progress
from .memwatch import MemoryWatch

__all__ = [
    "MIB",
    "call_runner",
    "environment",
    "interleaved",
    "measure_configs",
    "median",
    "mode_of",
    "run_config",
    "summarise",
    "with_growth",
]

MIB = 1 << 20
Config = dict[str, Any]
Result = dict[str, Any]


def call_runner(cfg: Config) -> Result:
    """Run ``cfg`` in this process: import ``cfg["runner"]`` (``module:function``), call it."""
    modname, _, fn = cfg["runner"].partition(":")
    result: Result = getattr(importlib.import_module(modname), fn)(cfg)
    return result


def _child_env(root: str | None = None) -> dict[str, str]:
    """The child imports the very streambuf this process runs (a checkout or an install),
    or the checkout at ``root``."""
    if root is None:
        import streambuf

        root = str(Path(streambuf.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))


def _in_child(cfg: Config, timeout_s: float, root: str | None = None) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "streambuf.bench._child", json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=_child_env(root),
        cwd=root,  # ``-m`` puts the working directory first on the path
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"benchmark run {cfg.get('name', cfg['runner'])!r} failed (exit "
            f"{proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return dict(json.loads(lines[-1]))


def run_config(
    cfg: Config, *, isolate: bool = True, timeout_s: float = 600, root: str | None = None
) -> Result:
    """One run of ``cfg`` under a memory watch: its report plus ``peak`` and ``shm_peak``
    (system AnonPages + Shmem and /dev/shm, bytes). ``isolate=False`` runs it here;
    ``root``: the child imports the streambuf of that checkout (another revision)."""
    if root is not None and not isolate:
        raise ValueError("run_config: root= needs isolate=True (a fresh process)")
    with MemoryWatch() as watch:
        report = _in_child(cfg, timeout_s, root) if isolate else call_runner(cfg)
    peak = watch.result()
    report["peak"] = peak.peak
    report["shm_peak"] = peak.shm_peak
    report["isolated"] = isolate
    return report


def with_growth(cfg: Config, *, isolate: bool = True) -> Result:
    """``run_config(cfg)`` plus ``growth_bytes``: its peak minus the peak of the same run
    with 1-element samples (same workers, threads and batches: start-up cancels out)."""
    tiny = run_config(dict(cfg, shape=[1]), isolate=isolate)
    real = run_config(cfg, isolate=isolate)
    real["tiny_peak"] = tiny["peak"]
    real["growth_bytes"] = real["peak"] - tiny["peak"]
    return real


def interleaved(
    configs: Sequence[Config],
    fn: Callable[[Config], Result],
    *,
    repeats: int,
    label: str,
) -> list[list[Result]]:
    """Run every config ``repeats`` times, interleaved and rotated (no config always goes
    first), with a progress bar; ``results[i]`` are config ``i``'s runs in order."""
    results: list[list[Result]] = [[] for _ in configs]
    n = len(configs)
    with progress(repeats * n, label) as bar:
        for r in range(repeats):
            for k in range(n):
                i = (k + r) % n
                bar.label(str(configs[i].get("name", i)))
                results[i].append(fn(configs[i]))
                bar.step()
    return results


def median(rows: Sequence[Result], key: str) -> float:
    """Median of ``row[key]`` over the rows that have it (NaN when none do)."""
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float) and r[key] == r[key]]
    return float(statistics.median(vals)) if vals else float("nan")


def summarise(
    configs: Sequence[Config], results: Sequence[list[Result]], keys: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per config: its name, kind, config, every run, and the median of each key."""
    rows = []
    for cfg, runs in zip(configs, results):
        row: dict[str, Any] = {
            "name": cfg["name"],
            "kind": cfg.get("kind"),
            "config": cfg,
            "runs": runs,
        }
        row.update({k: median(runs, k) for k in keys})
        rows.append(row)
    return rows


def measure_configs(
    configs: Sequence[Config],
    fn: Callable[[Config], Result],
    *,
    repeats: int,
    label: str,
    keys: Sequence[str],
) -> list[dict[str, Any]]:
    """``summarise`` of ``interleaved`` runs: one row per config with the median of each key."""
    return summarise(configs, interleaved(configs, fn, repeats=repeats, label=label), keys)


def mode_of(*, quick: bool, tiny: bool) -> str:
    """ "tiny" (smoke tests: proves it runs, measures nothing), "quick" or "full"."""
    return "tiny" if tiny else ("quick" if quick else "full")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def environment() -> dict[str, Any]:
    """Versions, CPUs (count, affinity, cgroup limit), memory limit, load, GPU: for the JSON."""
    import numpy
    import torch

    import streambuf
    from streambuf.resources import read_limits

    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    cuda = torch.cuda.is_available()
    return {
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "streambuf": streambuf.__version__,
        "peers": package_versions("torchdata", "webdataset", "moto", "torchcodec", "av"),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "limits": read_limits().as_dict(),  # cgroup CPU quota / affinity, memory limit
        "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max"),
        "cgroup_memory_max": _read("/sys/fs/cgroup/memory.max"),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cuda": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
