"""``streambuf tune``: measure a user's pipeline at several depths and recommend settings.

One decision procedure with the ``Loader``'s defaults: the worker count is the one
``Loader(num_workers="auto")`` takes (``streambuf.resources.auto_num_workers``, the
same limits), and the ladder's depths are batches per worker around the default
(``max_batches="auto"``: 4 a worker). Each trial iterates the pipeline through
``Loader`` at one depth (``max_batches`` = 1, 2, 4, 8 x num_workers), with the depth
tuner off, for at least ``batches`` batches and ``seconds`` seconds, and its rate is
measured over the second half of its batches only (the first half lets
``threads="auto"`` climb and settle: a short trial measured the climb, not where it
ends). The threaded ``.map`` stages run with ``threads="auto"`` (the run-time
controller, ``streambuf._tuner``; each trial reports the count it chose per worker and
when it last changed) unless ``threads`` lists fixed counts to try instead.
Recommendation: the trial that measured the most batches/s (never one its own trials
measured slower than another), and ``max_bytes`` = 1.25 x that depth's batches, never
above the budget allowed by the memory read from this machine (``memory_fraction`` of
the cgroup limit / physical memory, and of memory available now).
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

from ._units import check_count_or_auto, check_int, check_seconds, check_weight
from .loader import Loader
from .pipeline import Pipeline
from .resources import Limits, auto_num_workers, read_limits
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


def _settled_rate(times: list[float]) -> float:
    """Batches/s over the second half of a trial's batch times (the first half is the
    climb of ``threads="auto"`` and the workers' start); 0.0 below two batches."""
    if len(times) < 2:
        return 0.0
    half = times[(len(times) - 1) // 2 :]
    if len(half) < 2:
        half = times
    dt = half[-1] - half[0]
    return (len(half) - 1) / dt if dt > 0 else 0.0


def _trial(
    pipe: Pipeline, *, workers: int, depth: int, max_bytes: int, batches: int, seconds: float
) -> dict[str, Any]:
    loader = Loader(
        pipe, num_workers=workers, max_batches=depth, max_bytes=max_bytes, adaptive=False
    )
    times: list[float] = []
    size = 0
    chosen: list[float] = []
    changed_s: float | None = None  # when the chosen count last changed
    with loader:
        for _ in loader:
            now = time.perf_counter()
            times.append(now)
            got = _chosen(pipe)
            if got is not None:
                if chosen and got != chosen[-1]:
                    changed_s = now - times[0]
                chosen.append(got)
            if len(times) >= batches and now - times[0] >= seconds:
                break
    n = len(times)
    st = loader.stats()
    if n:
        size = st.bytes // max(1, st.batches)
    return {
        "depth": depth,
        "batches": n,
        "seconds": times[-1] - times[0] if n else 0.0,
        "batches_per_s": _settled_rate(times),
        "last_change_s": changed_s,
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
    seconds: Any = 0.0,
    batches: Any,
    depths: Any = (1,),
    threads: Any = ("auto",),
    memory_fraction: Any,
) -> None:
    """``tune``'s options, checked before anything runs (``streambuf tune`` too)."""
    if num_workers != "auto":
        check_int(num_workers, name="num_workers")
    check_seconds(seconds, name="seconds", allow_zero=True)
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
    num_workers: int | str = "auto",
    batches: int = 30,
    seconds: float = 3.0,
    depths: tuple[int, ...] = (1, 2, 4, 8),
    threads: tuple[int | str, ...] = ("auto",),
    memory_fraction: float = 0.25,
    limits: Limits | None = None,
    available_bytes: int | None = None,
    verbose: bool = True,
) -> TuneResult:
    """Run the ladder on ``pipe`` and recommend max_batches, max_bytes and threads.

    ``num_workers="auto"``: the count ``Loader`` takes by default, from the same limits.
    ``batches`` and ``seconds``: each trial runs at least both (its rate is measured
    over its second half). ``limits`` / ``available_bytes`` default to what this
    machine reports.
    """
    check_options(
        num_workers=num_workers,
        seconds=seconds,
        batches=batches,
        depths=depths,
        threads=threads,
        memory_fraction=memory_fraction,
    )
    lim = limits or read_limits()
    if num_workers == "auto":
        num_workers = auto_num_workers(lim, on_device=pipe._decodes_on())[0]
    assert isinstance(num_workers, int)
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
            t = _trial(
                p,
                workers=num_workers,
                depth=depth,
                max_bytes=cap,
                batches=batches,
                seconds=seconds,
            )
            t["threads"] = th
            trials.append(t)
            if verbose:
                chose = t["chosen_threads"]
                print(
                    f"threads={th} max_batches={depth:3d}: {t['batches_per_s']:8.1f} batches/s, "
                    f"batch {t['batch_bytes'] / (1 << 20):.1f} MiB"
                    + (f", chose {_per_worker(chose)}" if chose is not None else "")
                    + (
                        f" (last change at {t['last_change_s']:.1f} s of {t['seconds']:.1f})"
                        if t["last_change_s"] is not None
                        else ""
                    ),
                    flush=True,
                )
    if all(t["batches"] < 2 for t in trials):
        raise NothingToTune(
            f"the pipeline gave at most {max(t['batches'] for t in trials)} batch(es) "
            "a trial: a rate needs 2 or more; give it more data (or a smaller batch size)"
        )
    best = max(t["batches_per_s"] for t in trials)
    # the fastest trial: never a setting measured slower than another it tried (an
    # exact tie: the fewest threads, then the smallest depth)
    pick = min(
        (t for t in trials if t["batches_per_s"] == best), key=lambda t: (_count(t), t["depth"])
    )
    batch_bytes = max(t["batch_bytes"] for t in trials)
    max_bytes = min(cap, max(1 << 20, math.ceil(1.25 * pick["depth"] * max(1, batch_bytes))))
    chose = pick.get("chosen_threads")
    reasons = (
        f"best throughput {best:.1f} batches/s; threads={pick['threads']!r}"
        + (f" (it chose {_per_worker(chose)})" if chose is not None else "")
        + ", "
        f"max_batches={pick['depth']} with {num_workers} workers: the fastest of "
        f"{len(trials)} trials",
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
