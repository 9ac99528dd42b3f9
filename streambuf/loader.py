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

__all__ = ["Loader", "LoaderStats"]


@dataclass(frozen=True)
class _Tagged:
    """A batch on its way from worker ``worker`` to the main process, with its size."""

    worker: int
    nbytes: int
    batch: Any


def _identity(x: Any) -> Any:
    return x


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
                budget.adjust(worker, size - estimate, overshoot=size > estimate)
                estimate = max(size, 1) if first else max(estimate, size)
                first = False
                yield _Tagged(worker, size, batch)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()


@dataclass(frozen=True)
class LoaderStats:
    """Snapshot of a Loader.

    Attributes:
        batches: batches handed to the user so far (all epochs).
        bytes: bytes of those batches.
        wait_s: seconds the user's loop spent waiting for the next batch.
        elapsed_s: seconds since the current iteration began.
        batches_per_s: batches / elapsed_s of the current iteration.
        wait_fraction: wait_s / elapsed_s of the current iteration.
        budget: the credit accounting (bytes in flight, peak, per worker); None when
            num_workers == 0.
    """

    batches: int
    bytes: int
    wait_s: float
    elapsed_s: float
    batches_per_s: float
    wait_fraction: float
    budget: BudgetStats | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        self._iter_start = time.monotonic()
        self._iter_batches = 0
        self._iter_wait = 0.0
        self._budget: CreditBudget | None = None
        self._dl: DataLoader[Any] | None = None
        self._dl_iter: Any = None
        if pipeline._rank_world is None:  # capture dist state here: workers may not have it
            rank, world = current_rank_world()
            pipeline._rank_world = (rank, world)
        if num_workers == 0:
            return
        ctx = multiprocessing.get_context(multiprocessing_context)
        self._budget = CreditBudget(
            num_workers=num_workers,
            max_bytes=self.max_bytes,
            max_batches=self.max_batches,
            pooled=not in_order,
            ctx=ctx,
        )
        from ._shared import SharedInt

        self._generation = SharedInt(0, ctx=ctx)
        # stage buffers inside a worker default to a quarter of its slice of the budget
        pipeline._stage_bytes = max(1, self.max_bytes // num_workers // 4)
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
            else:
                size = nbytes(item)
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
        return LoaderStats(
            batches=self._batches,
            bytes=self._bytes,
            wait_s=self._wait_s,
            elapsed_s=elapsed,
            batches_per_s=self._iter_batches / elapsed,
            wait_fraction=self._iter_wait / elapsed,
            budget=None if self._budget is None else self._budget.stats(),
        )
