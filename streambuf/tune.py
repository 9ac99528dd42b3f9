"""``streambuf tune``: measure a user's pipeline at several depths and recommend settings.

The ladder method: iterate the pipeline through ``Loader`` for ``batches`` batches at
each depth (``max_batches`` = 1, 2, 4, 8 x num_workers), with the depth tuner off,
measuring batches/s and the batch size. The threaded ``.map`` stages run with
``threads="auto"`` (the run-time controller, ``streambuf._tuner``; each trial reports
the count it chose per worker) unless ``threads`` lists fixed counts to try instead.
Recommendation: the fewest threads and the smallest depth within 5% of the best
throughput, and ``max_bytes`` = 1.25 x that depth's batches, never above the budget
allowed by the memory limit read from this machine (``memory_fraction`` of the cgroup
limit / physical memory, and of memory available now).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ._units import check_count_or_auto, check_int, check_weight
from .loader import Loader
from .pipeline import Pipeline
from .resources import Limits, read_limits
from .stages import Map

__all__ = ["TuneResult", "load_pipeline", "tune"]


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` measured and recommends (bytes, batches/s)."""

    num_workers: int
    max_batches: int
    max_bytes: int
    threads: int | str | None
    memory_cap_bytes: int
    batch_bytes: int
    trials: tuple[dict[str, Any], ...]
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_pipeline(spec: str) -> Pipeline:
    """``module:attr`` or ``path/to/file.py:attr``; attr is a Pipeline or returns one."""
    target, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"{spec!r}: expected MODULE:NAME or FILE.py:NAME")
    if target.endswith(".py"):
        path = Path(target).resolve()
        modspec = importlib.util.spec_from_file_location(path.stem, path)
        if modspec is None or modspec.loader is None:
            raise ValueError(f"cannot import {path}")
        module = importlib.util.module_from_spec(modspec)
        sys.modules[path.stem] = module  # so DataLoader workers can unpickle its functions
        modspec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj = getattr(module, attr)
    pipe = obj() if callable(obj) and not isinstance(obj, Pipeline) else obj
    if not isinstance(pipe, Pipeline):
        raise TypeError(f"{spec!r} gave {type(pipe).__name__}, not a streambuf.Pipeline")
    return pipe


def _with_threads(pipe: Pipeline, threads: int | str) -> Pipeline:
    new = Pipeline.__new__(Pipeline)
    new.__dict__.update(pipe.__dict__)
    new._stages = tuple(
        replace(
            s,
            threads=threads,
            max_threads=s.max_threads if threads == "auto" else None,
            counters=None,
        )
        if isinstance(s, Map) and s.threaded
        else s
        for s in pipe._stages
    )
    return new


def _chosen(pipe: Pipeline) -> float | None:
    """Threads per worker the ``threads="auto"`` stages use now (their mean), or None."""
    got = [t.threads / t.running for t in pipe.stats().threads if t.running]
    return sum(got) / len(got) if got else None


def _per_worker(chosen: float) -> str:
    """A chosen count in words (0: every worker runs the function inline)."""
    if chosen == 0:
        return "inline (0 threads per worker: the function runs in the worker's own thread)"
    return f"{chosen:g} threads per worker"


def _count(trial: dict[str, Any]) -> float:
    """A trial's threads per worker, for preferring fewer: the chosen count with auto."""
    th = trial["threads"]
    if th == "auto":  # no reading (no worker ran the stage when sampled): no evidence
        chosen = trial["chosen_threads"]
        return float("inf") if chosen is None else float(chosen)
    return float(th or 0)


def _trial(
    pipe: Pipeline, *, workers: int, depth: int, max_bytes: int, batches: int
) -> dict[str, Any]:
    loader = Loader(
        pipe, num_workers=workers, max_batches=depth, max_bytes=max_bytes, adaptive=False
    )
    n = 0
    t_first = None
    size = 0
    chosen: list[float] = []
    for _ in loader:
        if n == 0:
            t_first = time.perf_counter()
        n += 1
        got = _chosen(pipe)
        if got is not None:
            chosen.append(got)
        if n >= batches:
            break
    dt = time.perf_counter() - (t_first or time.perf_counter())
    st = loader.stats()
    if n:
        size = st.bytes // max(1, st.batches)
    return {
        "depth": depth,
        "batches": n,
        "batches_per_s": (n - 1) / dt if dt > 0 and n > 1 else 0.0,
        "batch_bytes": size,
        "peak_in_flight_bytes": st.budget.peak_in_flight_bytes if st.budget else 0,
        # threads="auto": the count per worker at the end of the trial (and on the way)
        "chosen_threads": round(chosen[-1], 1) if chosen else None,
        "threads_over_time": [round(c, 1) for c in chosen[:: max(1, len(chosen) // 8)]],
    }


class NothingToTune(ValueError):
    """The pipeline gave too few batches to measure a rate."""


def check_options(
    *,
    num_workers: Any,
    batches: Any,
    depths: Any = (1,),
    threads: Any = ("auto",),
    memory_fraction: Any,
) -> None:
    """``tune``'s options, checked before anything runs (``streambuf tune`` too)."""
    check_int(num_workers, name="num_workers")
    check_int(batches, name="batches", minimum=2)  # (a rate needs two)
    if not isinstance(depths, tuple | list) or not depths:
        raise TypeError(f"depths={depths!r} must be a non-empty list of batch counts")
    for d in depths:
        check_int(d, name="depths[]", minimum=1)
    if not isinstance(threads, tuple | list) or not threads:
        raise TypeError(f"threads={threads!r} must be a non-empty list of counts or 'auto'")
    for th in threads:
        check_count_or_auto(th, name="threads[]")
    fraction = check_weight(memory_fraction, name="memory_fraction")
    if fraction > 1:
        raise ValueError(
            f"memory_fraction={memory_fraction!r} must be in (0, 1]: the share of the "
            "machine's memory the recommended max_bytes may take"
        )


def tune(
    pipe: Pipeline,
    *,
    num_workers: int = 2,
    batches: int = 30,
    depths: tuple[int, ...] = (1, 2, 4, 8),
    threads: tuple[int | str, ...] = ("auto",),
    memory_fraction: float = 0.25,
    limits: Limits | None = None,
    available_bytes: int | None = None,
    verbose: bool = True,
) -> TuneResult:
    """Run the ladder on ``pipe`` and recommend max_batches, max_bytes and threads.

    ``limits`` / ``available_bytes`` default to what this machine reports.
    """
    check_options(
        num_workers=num_workers,
        batches=batches,
        depths=depths,
        threads=threads,
        memory_fraction=memory_fraction,
    )
    lim = limits or read_limits()
    if available_bytes is None:
        from .resources import memory_available

        available_bytes = memory_available()
    cap = max(1 << 20, int(min(lim.memory_bytes, available_bytes) * memory_fraction))
    threaded = any(isinstance(s, Map) and s.threaded for s in pipe._stages)
    thread_opts: tuple[int | str | None, ...] = tuple(threads) if threaded else (None,)
    trials: list[dict[str, Any]] = []
    for th in thread_opts:
        p = _with_threads(pipe, th) if th is not None else pipe
        for d in depths:
            depth = d * num_workers if num_workers else 1
            t = _trial(p, workers=num_workers, depth=depth, max_bytes=cap, batches=batches)
            t["threads"] = th
            trials.append(t)
            if verbose:
                chose = t["chosen_threads"]
                print(
                    f"threads={th} max_batches={depth:3d}: {t['batches_per_s']:8.1f} batches/s, "
                    f"batch {t['batch_bytes'] / (1 << 20):.1f} MiB"
                    + (f", chose {_per_worker(chose)}" if chose is not None else ""),
                    flush=True,
                )
    if all(t["batches"] < 2 for t in trials):
        raise NothingToTune(
            f"the pipeline gave at most {max(t['batches'] for t in trials)} batch(es) "
            "a trial: a rate needs 2 or more; give it more data (or a smaller batch size)"
        )
    best = max(t["batches_per_s"] for t in trials)
    good = [t for t in trials if t["batches_per_s"] >= 0.95 * best]
    pick = min(good, key=lambda t: (_count(t), t["depth"]))
    batch_bytes = max(t["batch_bytes"] for t in trials)
    max_bytes = min(cap, max(1 << 20, math.ceil(1.25 * pick["depth"] * max(1, batch_bytes))))
    chose = pick.get("chosen_threads")
    reasons = (
        f"best throughput {best:.1f} batches/s; threads={pick['threads']!r}"
        + (f" (it chose {_per_worker(chose)})" if chose is not None else "")
        + ", "
        f"max_batches={pick['depth']} reach {pick['batches_per_s']:.1f} (within 5%) with the "
        "fewest threads and the smallest depth",
        f"max_bytes = 1.25 x {pick['depth']} batches of {batch_bytes / (1 << 20):.1f} MiB, "
        f"capped at {cap >> 20} MiB = {memory_fraction:.0%} of min(memory limit "
        f"{lim.memory_bytes >> 20} MiB, available {available_bytes >> 20} MiB)",
    )
    res = TuneResult(
        num_workers=num_workers,
        max_batches=pick["depth"],
        max_bytes=max_bytes,
        threads=pick["threads"],
        memory_cap_bytes=cap,
        batch_bytes=batch_bytes,
        trials=tuple(trials),
        reasons=reasons,
    )
    if verbose:
        print("\nrecommended:")
        print(
            f"  Loader(pipe, num_workers={num_workers}, max_batches={res.max_batches}, "
            f"max_bytes={res.max_bytes >> 20}MiB)"
            + (f" with .map(..., threads={res.threads!r})" if res.threads else "")
        )
        for r in reasons:
            print("  because", r)
    return res
