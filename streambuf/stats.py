"""Snapshots for logs and benchmarks: ``LoaderStats`` (``Loader.stats()``).

One convention across the package: ``stats()`` returns a frozen dataclass with documented
fields and ``as_dict()`` (``BufferStats``, ``BudgetStats``, ``LoaderStats``, the shard and
video counters).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ._diagnosis import render_table
from ._units import check_seconds
from .budget import BudgetStats
from .depth import TunerDecision
from .errors import add_note

__all__ = ["BufferStats", "LoaderStats", "StatsLog", "log_every"]


@dataclass(frozen=True)
class BufferStats:
    """A frozen snapshot of a buffer (or of one lane, in ``lanes``).

    Attributes:
        items: items queued now (made, not yet taken); reservations are not items.
        bytes: bytes held now: the queued items' and the reservations' (``reserve``
            takes room before an item is made, so a buffer whose slots are all reserved
            reads ``items == 0`` and still makes ``put`` wait).
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

    Every figure of the summary covers one span, the current iteration (the epoch being
    iterated, or the last one), so that ratios of them are shares of that span
    (``wait_s / elapsed_s`` is ``wait_fraction``); the ``total_*`` fields are the same
    counts over every iteration of this Loader.

    Attributes:
        batches: batches handed to the user in the current iteration.
        bytes: bytes of those batches.
        wait_s: seconds the user's loop spent waiting for the next batch in it.
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
            Loader applies to batches: ``max_bytes`` minus the fixed and stage shares.
        fixed_bytes: what stages hold whatever the budget, over all workers (``pack``'s
            block: ``12 * seq_len`` in each; ``shards()``' read buffers, cut where they
            would pass half of ``max_bytes``), taken out of ``max_bytes`` first; 0 if none.
        stage_bytes: bytes granted to the stage buffers (threaded map, prefetch, shard
            and video lanes) of *each* worker: ``(max_bytes - fixed_bytes) // 4 //
            num_workers`` when the pipeline has such stages, else None (then batches get
            the rest).
        threads: for each ``map(threads="auto")`` stage, the threads its workers use
            now (``streambuf.ThreadStats``; the same as ``pipeline.stats().threads``):
            log ``stats()`` over time (``log_every_s``) to see the counts move.
        stages: where the time went, per stage (``streambuf.StageStats``: the source,
            each stage, ``downstream``), summed over the workers; ``loader.report()``
            turns them into a table and names the bottleneck.
        bottleneck: that conclusion in one line (``report()``'s last line); ``""`` when
            nothing was measured yet. ``print(loader.stats())`` shows it all.
        total_batches, total_bytes, total_wait_s: ``batches``, ``bytes`` and ``wait_s``
            over every iteration (all epochs) of this Loader.
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
    fixed_bytes: int = 0
    threads: tuple[Any, ...] = ()
    stages: tuple[Any, ...] = ()
    bottleneck: str = ""
    total_batches: int = 0
    total_bytes: int = 0
    total_wait_s: float = 0.0

    def __str__(self) -> str:
        """A readable summary: throughput and wait, the depth and bytes in flight, the
        per-stage table in the order data flows and the bottleneck (``loader.report()``)."""
        steady = self.steady_wait_fraction
        lines = [
            f"{self.batches} batches ({self.bytes / 2**20:.1f} MiB), "
            f"{self.batches_per_s:.1f} batches/s over {self.elapsed_s:.1f} s; the loop "
            f"waited {self.wait_fraction:.1%} of the time"
            + ("" if math.isnan(steady) else f" ({steady:.1%} after start-up)"),
            f"depth {self.depth} batches, {self.occupancy:.0%} in flight"
            + (
                f", {self.budget.in_flight_bytes / 2**20:.1f} of "
                f"{self.budget.max_bytes / 2**20:.0f} MiB"
                if self.budget is not None
                else ""
            )
            + f"; {self.tuner_decisions} depth changes",
        ]
        if self.stages:
            lines += ["", render_table(self.stages)]
        if self.bottleneck:
            lines += ["", self.bottleneck]
        return "\n".join(lines)

    def as_dict(self, *, flat: bool = False) -> dict[str, Any]:
        """A dict; with ``flat=True`` numbers only (no ``decisions``, no ``bottleneck``
        text), nested keys joined by "/"
        (drops straight into TensorBoard's ``add_scalars`` or any logger)."""
        d = asdict(self)
        if not flat:
            return d
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k in ("decisions", "bottleneck"):  # (not numbers)
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


Sink = Callable[[dict[str, Any], int], Any]


class StatsLog:
    """``loader.stats()`` handed to a sink every ``seconds`` while batches flow, and once
    more at the end of each epoch (``streambuf.log_every``; ``Loader(log=...)``).

    Invariants: called from the training loop's thread, right after a batch is counted
    (never while the loop waits); at most once per ``seconds``, plus the epoch's end; an
    exception of the sink is the loop's (noted with where it came from), never swallowed.
    """

    def __init__(self, seconds: float, sink: Sink | logging.Logger | None = None) -> None:
        self.seconds = check_seconds(seconds, name="log_every(seconds)", allow_zero=True)
        if sink is not None and not isinstance(sink, logging.Logger) and not callable(sink):
            raise TypeError(
                f"log_every(sink={sink!r}) must be a callable sink(scalars, step), a "
                "logging.Logger, or None (the 'streambuf' logger)"
            )
        self.sink = sink
        self._last = time.monotonic()

    def due(self, now: float) -> bool:
        return now - self._last >= self.seconds

    def emit(self, stats: LoaderStats) -> None:
        """Hand ``stats`` to the sink now: a callable gets ``(stats.as_dict(flat=True),
        stats.total_batches)`` (a step that grows over epochs); a logger (or None) an INFO line with those and the bottleneck."""
        self._last = time.monotonic()
        sink = self.sink
        try:
            if sink is None or isinstance(sink, logging.Logger):
                logger = sink or logging.getLogger("streambuf")
                logger.info("streambuf: %s", stats.as_dict(flat=True))
                if stats.bottleneck:
                    logger.info("streambuf: %s", stats.bottleneck)
            else:
                sink(stats.as_dict(flat=True), stats.total_batches)
        except Exception as exc:
            add_note(exc, f"streambuf: raised in the stats sink {sink!r} (log_every)")
            raise


def log_every(seconds: float, sink: Sink | logging.Logger | None = None) -> StatsLog:
    """Log ``loader.stats()`` every ``seconds`` (and at each epoch's end) to ``sink``:

    * a callable ``sink(scalars, step)``: ``scalars`` is ``stats().as_dict(flat=True)``
      (numbers only: ``wait_fraction``, ``batches_per_s``, ``budget/in_flight_bytes``,
      ``stages/<i> <stage>/own_s``, ...), ``step`` the batches delivered so far. For
      TensorBoard: ``lambda d, step: writer.add_scalars("data", d, step)``.
    * a ``logging.Logger`` (or None: the ``"streambuf"`` logger): an INFO line with the
      same dict, and one with the bottleneck (``loader.report()``'s conclusion).

    Pass it to the Loader: ``Loader(pipe, ..., log=streambuf.log_every(30, sink))``.
    """
    return StatsLog(seconds, sink)
