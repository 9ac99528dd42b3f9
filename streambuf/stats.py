"""Snapshots for logs and benchmarks: ``LoaderStats`` (``Loader.stats()``).

One convention across the package: ``stats()`` returns a frozen dataclass with documented
fields and ``as_dict()`` (``BufferStats``, ``BudgetStats``, ``LoaderStats``, the shard and
video counters).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .budget import BudgetStats
from .depth import TunerDecision

__all__ = ["BufferStats", "LoaderStats"]


@dataclass(frozen=True)
class BufferStats:
    """A frozen snapshot of a buffer (or of one lane, in ``lanes``).

    Attributes:
        items, bytes: held now.
        max_items, max_bytes: the limits in force now (a lane's slice, for a lane).
        peak_items, peak_bytes: the most ever held at once.
        oversize: items admitted alone because they were larger than ``max_bytes``.
        puts, gets: items put and taken so far.
        put_wait_s: total seconds producers spent blocked in ``put`` (``put_many``).
        get_wait_s: total seconds consumers spent blocked in ``get`` (``get_many``).
        empty_gets: ``get`` (``get_many``) calls that found nothing ready and waited (the
            depth tuner's signal: the consumer is starved).
        lanes: one snapshot per lane (``ShardedBuffer`` only; empty otherwise).
        outside: reservations a ``Window`` granted outside the count (round robin: the
            lane the consumer waited on, while the window was full of other lanes' items).
    """

    items: int
    bytes: int
    max_items: int
    max_bytes: int
    peak_items: int
    peak_bytes: int
    oversize: int
    puts: int
    gets: int
    put_wait_s: float
    get_wait_s: float
    empty_gets: int
    lanes: tuple[BufferStats, ...] = ()
    outside: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Flat dict for loggers (lanes as a list of dicts)."""
        return asdict(self)


def thread_scalars(threads: Any) -> dict[str, Any]:
    """``ThreadStats`` rows (as dicts) -> ``{"threads/<stage>/<field>": number}``."""
    return {f"threads/{t['stage']}/{k}": x for t in threads for k, x in t.items() if k != "stage"}


@dataclass(frozen=True)
class LoaderStats:
    """Snapshot of a Loader (``loader.stats()``); ``as_dict(flat=True)`` for loggers.

    Attributes:
        batches: batches handed to the user so far (all epochs).
        bytes: bytes of those batches.
        wait_s: seconds the user's loop spent waiting for the next batch (all epochs).
        elapsed_s: seconds since the current iteration began.
        batches_per_s: batches / elapsed_s of the current iteration.
        wait_fraction: share of the current iteration's time spent waiting for data.
        steady_wait_fraction: share of the time after start-up (from the
            ``num_workers``-th batch, the last worker's first, to the latest; NaN until
            then) the loop spent waiting for batches, for any reason (the worker due
            was behind, the transport): below 5%, batches were ready and the consumer is
            the bottleneck (``loader.report()``).
        empty_gets: times the loop asked while no finished batch was waiting (starved).
        depth: batches allowed in flight now (the tuner's choice, or max_batches).
        occupancy: batches in flight / depth, now.
        tuner_decisions: depth changes so far; ``decisions`` holds the last 16.
        budget: the credit accounting (bytes in flight, peak, per worker, oversize);
            None when num_workers == 0. ``budget.max_bytes`` is the credit limit the
            Loader applies to batches: ``max_bytes`` minus the stage share.
        stage_bytes: bytes granted to the stage buffers (threaded map, prefetch, shard
            and video lanes) of *each* worker: ``max_bytes // 4 // num_workers`` when the
            pipeline has such stages, else None (then batches get all of ``max_bytes``).
        threads: for each ``map(threads="auto")`` stage, the threads its workers use
            now (``streambuf.ThreadStats``; the same as ``pipeline.stats().threads``):
            log ``stats()`` over time (``log_every_s``) to see the counts move.
        stages: where the time went, per stage (``streambuf.StageStats``: the source,
            each stage, ``downstream``), summed over the workers; ``loader.report()``
            turns them into a table and names the bottleneck.
    """

    batches: int
    bytes: int
    wait_s: float
    elapsed_s: float
    batches_per_s: float
    wait_fraction: float
    empty_gets: int
    depth: int
    occupancy: float
    tuner_decisions: int
    decisions: tuple[TunerDecision, ...]
    budget: BudgetStats | None
    steady_wait_fraction: float = float("nan")
    stage_bytes: int | None = None
    threads: tuple[Any, ...] = ()
    stages: tuple[Any, ...] = ()

    def as_dict(self, *, flat: bool = False) -> dict[str, Any]:
        """A dict; with ``flat=True`` scalar values only, nested keys joined by "/"
        (drops straight into TensorBoard's ``add_scalars`` or any logger)."""
        d = asdict(self)
        if not flat:
            return d
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k == "decisions":
                continue
            if k == "threads":  # threads/<stage>/<count>: numbers only, keyed by stage
                out.update(thread_scalars(v))
                continue
            if k == "stages":  # stages/<i> <stage>/<field>: numbers only
                for i, st in enumerate(v):
                    for f, x in st.items():
                        if f != "stage":
                            out[f"stages/{i} {st['stage']}/{f}"] = x
                continue
            if isinstance(v, dict):
                for k2, v2 in v.items():
                    if isinstance(v2, list | tuple):
                        for i, x in enumerate(v2):
                            out[f"{k}/{k2}/{i}"] = x
                    else:
                        out[f"{k}/{k2}"] = v2
            elif v is not None:
                out[k] = v
        return out
