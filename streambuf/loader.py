"""``Loader``: a ``torch.utils.data.DataLoader`` with a byte budget across worker processes.

What it adds to the DataLoader it builds:

* **A byte and batch budget across processes** (``streambuf.budget.CreditBudget``):
  bytes of batches produced by workers but not yet handed to the user stay <=
  ``max_bytes`` (oversize rule aside), batches <= ``max_batches``. Sharded per worker when
  ``in_order=True`` (no deadlock), pooled when ``in_order=False``.
* **set_epoch** that reaches the workers, persistent ones included (shared memory).
* **Errors**: a dead or silent worker becomes ``WorkerError`` (within ``timeout_s``); an
  exception in a stage keeps its type, its worker traceback and the note naming the
  stage and the sample/shard.
* **Clean shutdown**: leaving the loop (break, exception, Ctrl-C) shuts the workers down.
* **Device prefetch** with ``device="cuda"`` (see ``streambuf.device``).

Ownership: a batch belongs to the worker until the DataLoader hands it to this loader,
then to the user; its credits are released at that hand-over.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ._units import parse_bytes, parse_count
from .budget import BudgetStats, CreditBudget
from .device import DevicePrefetcher
from .errors import WorkerError
from .pipeline import Pipeline
from .sharding import current_rank_world
from .sizing import nbytes
from .tuning import DepthTuner, TunerDecision

__all__ = ["Loader", "LoaderStats"]

log = logging.getLogger("streambuf")


@dataclass(frozen=True)
class _Tagged:
    """A batch on its way from worker ``worker`` to the main process, with its size."""

    worker: int
    nbytes: int
    batch: Any


def _identity(x: Any) -> Any:
    return x


_MALLOC_FIXED = False


def _fix_malloc_thresholds() -> None:
    """In a worker: fix glibc's mmap/trim thresholds at 32 KiB (once per process).

    glibc raises its mmap threshold each time a large mmapped block is freed (up to
    32 MiB), after which big samples come from thread heaps that keep freed memory:
    worker memory then grows past any budget. A fixed threshold keeps large blocks in
    mmap, returned to the system on free. 32 KiB rather than glibc's initial 128 KiB:
    with many map threads, each thread's arena kept freed 64 KiB samples (measured:
    growth 66 -> 29 MiB at 32 threads x 4 workers, throughput within noise).
    ``STREAMBUF_MMAP_THRESHOLD`` (bytes; 0 = leave glibc alone) and
    ``STREAMBUF_ARENA_MAX`` override. No-op where glibc is not the allocator.
    """
    global _MALLOC_FIXED
    if _MALLOC_FIXED:
        return
    _MALLOC_FIXED = True
    import os

    threshold = int(os.environ.get("STREAMBUF_MMAP_THRESHOLD", 32 * 1024))
    if threshold <= 0:
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, threshold)  # M_TRIM_THRESHOLD
        arenas = int(os.environ.get("STREAMBUF_ARENA_MAX", 0))
        if arenas > 0:
            libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


class _Budgeted(IterableDataset[_Tagged]):
    """The dataset the DataLoader sees: the pipeline, with credits taken per batch."""

    def __init__(self, pipeline: Pipeline, budget: CreditBudget, generation: Any) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.budget = budget
        self.generation = generation  # SharedInt, set by the main process per iteration

    def __iter__(self) -> Iterator[_Tagged]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker = 0 if info is None else info.id
        if info is not None:
            _fix_malloc_thresholds()
        gen = self.generation.value
        budget = self.budget
        estimate = budget.slice_bytes(worker)  # first batch: its whole slice (size unknown)
        first = True
        it = iter(self.pipeline)
        try:
            while True:
                if not budget.reserve(worker, estimate, generation=gen):
                    return  # the main process abandoned this iteration
                try:
                    batch = next(it)
                except StopIteration:
                    budget.cancel(worker, estimate)
                    return
                except BaseException:
                    budget.cancel(worker, estimate)
                    raise
                size = nbytes(batch)
                budget.adjust(worker, size - estimate, batch_bytes=size, overshoot=size > estimate)
                estimate = max(size, 1) if first else max(estimate, size)
                first = False
                yield _Tagged(worker, size, batch)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()


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
        empty_gets: times the loop asked while no finished batch was waiting (starved).
        depth: batches allowed in flight now (the tuner's choice, or max_batches).
        occupancy: batches in flight / depth, now.
        tuner_decisions: depth changes so far; ``decisions`` holds the last 16.
        budget: the credit accounting (bytes in flight, peak, per worker, oversize);
            None when num_workers == 0.
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


class Loader:
    """Iterate a ``Pipeline`` through a DataLoader with a byte budget across workers.

    Args:
        pipeline: the ``streambuf.Pipeline`` (batching happens inside it: ``.batch(n)``).
        num_workers: DataLoader worker processes (0: iterate in this process).
        max_batches: batches in flight at most (>= num_workers when in_order).
        max_bytes: bytes in flight at most (int or "4GiB"); covers the batch being built.
        in_order: deliver in a deterministic order (sharded credits) or as ready (pooled).
        pin_memory: let the DataLoader pin batches (only useful without ``device``).
        device: "cuda" to prefetch batches to the GPU on a side stream; "cpu"/None: no.
        device_depth: batches copied ahead to the device.
        persistent_workers: keep workers alive between epochs.
        multiprocessing_context: "fork", "spawn" or "forkserver" (None: default).
        timeout_s: raise ``WorkerError`` when no batch arrives within this many seconds.
        adaptive: let ``streambuf.tuning.DepthTuner`` choose the depth at run time, from
            ``num_workers`` up to ``max_batches``, growing while the consumer waits and
            shrinking when available memory drops below ``memory_reserve_bytes``. The
            byte budget is a hard bound either way. False: depth is ``max_batches``.
        tuner_interval_s: the tuner's decision window.
        memory_reserve_bytes: shrink the depth when less memory than this is available.
        log_every_s: log a stats line (INFO, logger "streambuf") this often.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        /,
        *,
        num_workers: int,
        max_batches: int,
        max_bytes: int | str,
        in_order: bool = True,
        pin_memory: bool = False,
        device: str | torch.device | None = None,
        device_depth: int = 2,
        persistent_workers: bool = False,
        multiprocessing_context: str | None = None,
        timeout_s: float | None = None,
        adaptive: bool = True,
        tuner_interval_s: float = 0.5,
        memory_reserve_bytes: int | str | None = "1GiB",
        log_every_s: float | None = None,
    ) -> None:
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"pipeline must be a streambuf.Pipeline, got {type(pipeline).__name__}")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.pipeline = pipeline
        self.num_workers = num_workers
        self.max_batches = parse_count(max_batches, name="max_batches")
        self.max_bytes = parse_bytes(max_bytes)
        self.in_order = in_order
        self.device = None if device is None else torch.device(device)
        self.device_depth = device_depth
        self.timeout_s = timeout_s
        self._batches = 0
        self._bytes = 0
        self._wait_s = 0.0
        self._empty_gets = 0
        self._iter_start = time.monotonic()
        self._iter_batches = 0
        self._iter_wait = 0.0
        self._budget: CreditBudget | None = None
        self.tuner: DepthTuner | None = None
        self.log_every_s = log_every_s
        self._last_log = time.monotonic()
        self._dl: DataLoader[Any] | None = None
        self._dl_iter: Any = None
        if pipeline._rank_world is None:  # capture dist state here: workers may not have it
            rank, world = current_rank_world()
            pipeline._rank_world = (rank, world)
        if num_workers == 0:
            return
        ctx = multiprocessing.get_context(multiprocessing_context)
        # stage buffers inside workers (threaded map, prefetch) get a quarter of the
        # budget, batches in flight the rest: max_bytes covers everything the pipeline holds
        stage_total = self.max_bytes // 4 if pipeline._has_stage_buffers() else 0
        pipeline._stage_bytes = max(1, stage_total // num_workers) if stage_total else None
        min_depth = num_workers if in_order else 1
        if self.max_batches < min_depth:
            raise ValueError(
                f"max_batches={self.max_batches} must be >= num_workers={num_workers} with "
                "in_order=True (each worker owns at least one batch of credit)"
            )
        if adaptive:
            reserve = None if memory_reserve_bytes is None else parse_bytes(memory_reserve_bytes)
            self.tuner = DepthTuner(
                min_depth=min_depth,
                max_depth=self.max_batches,
                max_bytes=self.max_bytes - stage_total,
                start_depth=min(self.max_batches, max(min_depth, 2 * num_workers)),
                interval_s=tuner_interval_s,
                reserve_bytes=reserve,
            )
        self._budget = CreditBudget(
            num_workers=num_workers,
            max_bytes=self.max_bytes - stage_total,
            max_batches=self.tuner.depth if self.tuner else self.max_batches,
            pooled=not in_order,
            ctx=ctx,
        )
        from ._shared import SharedInt

        self._generation = SharedInt(0, ctx=ctx)
        per_worker = math.ceil(self.max_batches / num_workers)
        self._dl = DataLoader(
            _Budgeted(pipeline, self._budget, self._generation),
            batch_size=None,
            collate_fn=_identity,
            num_workers=num_workers,
            prefetch_factor=per_worker + 1,
            persistent_workers=persistent_workers,
            pin_memory=pin_memory,
            in_order=in_order,
            multiprocessing_context=ctx if multiprocessing_context else None,
            timeout=timeout_s or 0,
        )

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch for the next iteration (reaches persistent workers too)."""
        self.pipeline.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        source = self._iter_host()
        if self.device is not None and self.device.type != "cpu":
            return iter(DevicePrefetcher(source, device=self.device, depth=self.device_depth))
        return source

    def _iter_host(self) -> Iterator[Any]:
        self._iter_start = time.monotonic()
        self._iter_batches = 0
        self._iter_wait = 0.0
        if self._dl is None:
            yield from self._count(iter(self.pipeline), tagged=False)
            return
        assert self._budget is not None
        self._generation.value = self._budget.new_generation()
        dl_iter = iter(self._dl)
        self._dl_iter = dl_iter
        try:
            yield from self._count(dl_iter, tagged=True)
        finally:
            # wake workers blocked waiting for credits of this iteration, then shut down
            self._budget.new_generation()
            if not self._dl.persistent_workers:
                shutdown = getattr(dl_iter, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()

    def _count(self, it: Iterator[Any], *, tagged: bool) -> Iterator[Any]:
        while True:
            # "found empty": no finished batch was waiting when the loop asked. Waiting
            # while one is in transit is transport cost, not starvation.
            empty = self._budget is not None and self._budget.held_bytes() <= 0
            t0 = time.monotonic()
            try:
                item = next(it)
            except StopIteration:
                return
            except RuntimeError as exc:
                text = str(exc)
                if "DataLoader worker" in text or "timed out" in text:
                    raise WorkerError(
                        f"{text.strip()} (streambuf.Loader: num_workers={self.num_workers}, "
                        f"timeout_s={self.timeout_s})"
                    ) from exc
                raise
            waited = time.monotonic() - t0
            self._wait_s += waited
            self._iter_wait += waited
            if tagged:
                assert self._budget is not None
                self._budget.release(item.worker, item.nbytes)
                size, item = item.nbytes, item.batch
                if empty:
                    self._empty_gets += 1
                if self.tuner is not None:
                    self.tuner.observe(waited_s=waited if empty else 0.0, batch_bytes=size)
                    depth = self.tuner.update()
                    if depth is not None:
                        self._budget.set_limits(max_batches=depth)
            else:
                size = nbytes(item)
            if self.log_every_s is not None and t0 - self._last_log >= self.log_every_s:
                self._last_log = t0
                log.info("streambuf: %s", self.stats().as_dict(flat=True))
            self._batches += 1
            self._iter_batches += 1
            self._bytes += size
            yield item

    def worker_pids(self) -> list[int]:
        """Process ids of the current iteration's workers (empty without workers)."""
        workers = getattr(self._dl_iter, "_workers", None) or []
        return [int(w.pid) for w in workers if w.pid is not None]

    def stats(self) -> LoaderStats:
        """A snapshot: throughput, consumer wait, bytes in flight per worker, peaks."""
        elapsed = max(1e-9, time.monotonic() - self._iter_start)
        budget = None if self._budget is None else self._budget.stats()
        depth = budget.max_batches if budget is not None else 1
        decisions = tuple(self.tuner.decisions) if self.tuner is not None else ()
        return LoaderStats(
            batches=self._batches,
            bytes=self._bytes,
            wait_s=self._wait_s,
            elapsed_s=elapsed,
            batches_per_s=self._iter_batches / elapsed,
            wait_fraction=self._iter_wait / elapsed,
            empty_gets=self._empty_gets,
            depth=depth,
            occupancy=(budget.in_flight_batches / depth) if budget is not None else 0.0,
            tuner_decisions=len(decisions),
            decisions=decisions[-16:],
            budget=budget,
        )
