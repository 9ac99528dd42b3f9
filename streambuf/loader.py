"""``Loader``: a ``torch.utils.data.DataLoader`` with a byte budget across worker processes.

What it adds to the DataLoader it builds:

* **A byte and batch budget across processes** (``streambuf.budget.CreditBudget``):
  bytes of batches produced by workers but not yet handed to the user stay <=
  ``max_bytes`` minus the stage share (oversize rule aside), batches <= ``max_batches``.
  Sharded per worker when ``in_order=True`` (no deadlock), pooled when ``in_order=False``.
  Stage buffers inside each worker (threaded map, prefetch, shard and video lanes) get a
  quarter of ``max_bytes``, split over the workers, so ``max_bytes`` covers everything
  the pipeline holds.
* **Per-iteration resolution.** Rank and world size (``torch.distributed``, unless the
  pipeline was given ``rank=``/``world_size=``) and the epoch are read in the main
  process when an iteration starts and published to the workers, persistent ones too.
  The Loader never modifies the ``Pipeline`` it is given.
* **Errors**: an exception raised in a stage reaches the loop as the same type, with its
  attributes and notes and a note naming the worker (``streambuf._transport``); a batch
  that cannot be pickled is an error naming its type and the fix. ``WorkerError`` means
  a worker died or did not answer within ``timeout_s``, decided from the workers' state
  (``streambuf._supervise``), and reaches the loop without shutdown delays.
* **Clean shutdown**: leaving the loop (break, exception, Ctrl-C) shuts the workers down;
  ``close()`` (or ``with``) ends persistent workers. Workers whose main process died exit
  on their own (``streambuf._worker``).
* **Device prefetch** with ``device="cuda"`` (see ``streambuf.device``).

Ownership: a batch belongs to the worker until the DataLoader hands it to this loader,
then to the user; its credits are released at that hand-over.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ._checkpoint import RunTracker
from ._contracts import WorkerContext
from ._forking import frozen_for_fork
from ._supervise import POLL_S, Supervisor, kill_workers
from ._transport import Failure, Tagged
from ._units import (
    check_bool,
    check_choice,
    check_int,
    check_optional_seconds,
    check_seconds,
    parse_bytes,
    parse_count,
    parse_optional_bytes,
)
from ._worker import Board, Feed
from .budget import CreditBudget
from .depth import DepthTuner
from .device import DevicePrefetcher, check_device
from .errors import WorkerError
from .pipeline import Pipeline
from .resources import LoaderDefaults, loader_defaults, read_limits
from .sharding import current_rank_world
from .sizing import nbytes
from .stats import LoaderStats, StatsLog

_logger = logging.getLogger("streambuf")
__all__ = ["Loader", "LoaderStats"]

# left early without persistent workers: how long torch's shutdown may wait before the
# workers still inside an item are killed, and the most it then waits for itself
EARLY_GRACE_S = 0.5
SHUTDOWN_JOIN_S = 30.0


_CONTEXTS = (None, "fork", "spawn", "forkserver")


def _identity(x: Any) -> Any:
    return x


class Loader:
    """Iterate a ``Pipeline`` through a DataLoader with a byte budget across workers.

    Args:
        pipeline: the ``streambuf.Pipeline`` (batching happens inside it: ``.batch(n)``).
        num_workers (int or str, optional): DataLoader worker processes (0: iterate in
            this process), or ``"auto"``: one process per usable CPU (the fewest of the
            cgroup CPU quota and affinity, ``os.cpu_count()`` and the most torch's
            DataLoader suggests), one left for the training loop above two; at most one
            per 512 MiB in half the memory limit, ``max_batches`` (given, in order) and
            64; 0 when the pipeline decodes onto a device
            (``streambuf.resources.auto_num_workers``, docs/defaults.md). Worth it where
            the work holds the GIL (Python decode, parsing); where samples wait (I/O,
            sleeps), ``map(threads="auto")`` adds concurrency more cheaply than
            processes. Default: ``"auto"``.
        max_batches (int or str, optional): batches in flight at most (>= num_workers
            when in_order), or ``"auto"``: 4 per worker, at least 2 (the depth tuner
            starts at 2 per worker and grows up to it). Default: ``"auto"``.
        max_bytes (int or str, optional): bytes in flight at most (int or "4GiB");
            covers the batch being built and the stage buffers. ``"auto"``: 25% of the
            memory available (``streambuf.resources.memory_available``: the system's,
            within the cgroup limit minus its usage), at least 256 MiB and at most
            16 GiB, raised to twice the pipeline's fixed stage buffers (``pack``'s
            block) where they need more and half the memory available holds that
            (else ``ValueError`` naming the bytes to pin). Default: ``"auto"``.
            The values chosen for ``"auto"`` are logged once (INFO, logger
            ``"streambuf"``) and kept in ``loader.defaults``.
        in_order: deliver in a deterministic order (sharded credits) or as ready (pooled).
        pin_memory: let the DataLoader pin batches (only useful without ``device``).
        device: "cuda" to prefetch batches to the GPU on a side stream; "cpu"/None: no.
        device_depth: batches copied ahead to the device.
        persistent_workers: keep workers alive between epochs (end them with ``close()``).
        multiprocessing_context: "fork", "spawn" or "forkserver" (None: default).
        timeout_s: raise ``WorkerError`` when no batch arrives within this many seconds
            (None: wait as long as it takes; a dead worker is still detected).
        adaptive: let ``streambuf.depth.DepthTuner`` choose the depth at run time, from
            ``num_workers`` up to ``max_batches``, growing while the consumer waits and
            shrinking when available memory drops below ``memory_reserve_bytes``. The
            byte budget is a hard bound either way. False: depth is ``max_batches``.
        tuner_interval_s: the tuner's decision window.
        memory_reserve_bytes: shrink the depth when less memory than this is available.
        log: ``streambuf.log_every(seconds, sink)``: hand ``stats()`` to a sink (a
            callable for TensorBoard scalars or any logger, or a ``logging.Logger``)
            every ``seconds`` and at each epoch's end. The sink runs in the loop's
            thread, after a batch is counted and before it is handed over; its
            exception reaches the loop in place of that batch (with a note naming the
            sink; never swallowed: a broken sink is not hidden) and ends the iteration
            like any error in it. That batch was not received, so it is not in
            ``state_dict()``: a state saved in the handler resumes with it, nothing lost
            or repeated (the same for any error between a batch leaving the pipeline and
            the loop receiving it: a device copy, a registered ``nbytes`` sizer).
        log_every_s: shorthand for ``log=streambuf.log_every(log_every_s)`` (INFO lines,
            logger "streambuf"); not with ``log``.
        arena: build batches in slots of one shared memory region mapped once in every
            process (``streambuf._arena``; Linux), instead of fresh shared memory per
            batch. A batch you keep keeps its slot until it dies (workers then use
            fresh memory meanwhile; never a wait).

    Raises:
        TypeError, ValueError: a bad option (named, with the fix), before any worker starts.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        /,
        *,
        num_workers: int | str = "auto",
        max_batches: int | str = "auto",
        max_bytes: int | str = "auto",
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
        arena: bool = True,
        log: StatsLog | None = None,
    ) -> None:
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"pipeline must be a streambuf.Pipeline, got {type(pipeline).__name__}")
        self.pipeline = pipeline
        # "auto": chosen in one place from the machine's limits (streambuf.resources:
        # loader_defaults; docs/defaults.md), the given values checked here first
        auto = [isinstance(v, str) and v == "auto" for v in (num_workers, max_batches, max_bytes)]
        if not auto[1]:
            max_batches = parse_count(max_batches, name="max_batches")  # type: ignore[arg-type]
        if isinstance(num_workers, str) and not auto[0]:
            raise ValueError(f"num_workers={num_workers!r} must be an int >= 0 or 'auto'")
        if not auto[0]:
            num_workers = check_int(num_workers, name="num_workers")
        if not auto[2]:
            max_bytes = parse_bytes(max_bytes)
        self.defaults: LoaderDefaults = loader_defaults(
            read_limits() if any(auto) else None,
            num_workers=num_workers,
            max_batches=max_batches,
            max_bytes=max_bytes,
            in_order=in_order is True,
            on_device=pipeline._decodes_on(),
            fixed_bytes_per_copy=pipeline._fixed_stage_bytes(),
        )
        self.num_workers = num_workers = self.defaults.num_workers
        self.max_batches = self.defaults.max_batches
        self.max_bytes = self.defaults.max_bytes
        self.in_order = check_bool(in_order, name="in_order")
        self.pin_memory = check_bool(pin_memory, name="pin_memory")
        self.device = check_device(device)  # refused here, not at the first batch
        self.device_depth = parse_count(device_depth, name="device_depth")
        self.persistent_workers = check_bool(persistent_workers, name="persistent_workers")
        check_choice(multiprocessing_context, name="multiprocessing_context", choices=_CONTEXTS)
        self.timeout_s = check_optional_seconds(timeout_s, name="timeout_s")
        check_bool(adaptive, name="adaptive")
        interval = check_seconds(tuner_interval_s, name="tuner_interval_s")
        reserve = parse_optional_bytes(memory_reserve_bytes, name="memory_reserve_bytes")
        self.log_every_s = check_optional_seconds(log_every_s, name="log_every_s")
        if log is not None and not isinstance(log, StatsLog):
            raise TypeError(f"log={log!r} must be streambuf.log_every(seconds, sink) or None")
        if log is not None and log_every_s is not None:
            raise ValueError("give log= or log_every_s=, not both (log_every_s=s is log_every(s))")
        self._log = log if log_every_s is None else StatsLog(log_every_s)
        self.use_arena = check_bool(arena, name="arena")
        on = pipeline._decodes_on()
        if num_workers and on is not None:
            raise ValueError(
                f"num_workers={num_workers}: this pipeline decodes onto {on!r} (decoder="
                f"{on!r}), which runs only in the training process (worker processes cannot "
                "hand device memory to it without a copy, and a forked child cannot use a "
                "CUDA context); use num_workers=0 (clips(threads=) decodes several videos "
                "at once), or decoder='cpu' with workers"
            )
        min_depth = num_workers if in_order else 1
        if num_workers and self.max_batches < min_depth:
            raise ValueError(
                f"max_batches={self.max_batches} must be >= num_workers={num_workers} with "
                "in_order=True (each worker owns at least one batch of credit)"
            )
        # stage buffers inside workers (threaded map, prefetch, lanes) get a quarter of
        # the budget, batches in flight the rest: max_bytes covers all the pipeline holds
        # and what stages hold whatever the budget (pack's block, in each copy) first
        copies = max(1, num_workers)
        fixed = pipeline._fixed_stage_bytes() * copies
        if fixed and fixed > self.max_bytes // 2:
            raise ValueError(
                f"max_bytes={self.max_bytes} cannot hold the pipeline's fixed stage buffers: "
                f"{fixed} bytes ({fixed // copies} in each of {copies} copies: "
                f"{pipeline._fixed_stage_holders()}; pack's block is 12 bytes a token) "
                f"would take over half of it; raise max_bytes (to at least {2 * fixed}), "
                "use fewer workers, or make the stage's buffer smaller (pack: a shorter "
                "seq_len)"
            )
        # the source's read buffers (shards' lanes) are fixed bytes too, charged whole
        # where they fit in what half of max_bytes leaves, else cut to that
        # (``TarReader.fit``, each worker reads with its charge: ``WorkerContext``)
        reads = pipeline._src.read_bytes(copies) if hasattr(pipeline._src, "read_bytes") else 0
        other = fixed // copies
        self.read_bytes: int | None = None
        if reads:
            self.read_bytes = max(0, min(reads, (self.max_bytes // 2 - fixed) // copies))
            fixed += self.read_bytes * copies
            cut = pipeline._src.read_cut(self.read_bytes, copies, other)
            if cut is not None:
                _logger.log(logging.WARNING if cut[1] else logging.INFO, "%s", cut[0])
        rest = self.max_bytes - fixed
        stage_total = rest // 4 if pipeline._has_stage_buffers() else 0
        self.stage_bytes = max(1, stage_total // copies) if stage_total else None
        self.fixed_bytes = fixed
        self.credit_bytes = rest - stage_total
        self._ctx = multiprocessing.get_context(multiprocessing_context)
        self._ctx_name = multiprocessing_context
        self.tuner: DepthTuner | None = None
        if adaptive and num_workers:
            self.tuner = DepthTuner(
                min_depth=min_depth,
                max_depth=self.max_batches,
                max_bytes=self.credit_bytes,
                start_depth=min(self.max_batches, max(min_depth, 2 * num_workers)),
                interval_s=interval,
                reserve_bytes=reserve,
            )
        self._epoch: int | None = None
        self._batches = self._bytes = self._empty_gets = 0
        self._wait_s = 0.0
        self._iter_start = time.monotonic()
        self._iter_batches = self._iter_bytes = 0
        self._iter_wait = 0.0
        self._iter_first = self._iter_last = self._iter_first_wait = 0.0
        self._budget: CreditBudget | None = None
        self._dl: DataLoader[Any] | None = None
        self._dl_iter: Any = None
        self._board: Board | None = None
        self._arena: Any = None
        self._supervisor: Supervisor | None = None
        self._round = 0  # resets of the current DataLoader iterator (streambuf._worker.Board)
        self._closed = False
        # the iteration handed out last (weak: one the caller dropped ends on its own)
        self._live: weakref.ref[Iterator[Any]] | None = None
        self._tracker = RunTracker(pipeline, num_workers=num_workers, in_order=self.in_order)
        if any(auto):  # once per Loader: what "auto" chose, and why
            _logger.info("%s", self.defaults.line())

    # -- the DataLoader ---------------------------------------------------------------
    def _dataloader(self) -> DataLoader[Any]:
        """The DataLoader, built on first use and again after a worker failure (a dead
        worker may hold the old credit lock)."""
        if self._dl is not None:
            return self._dl
        depth = self.tuner.depth if self.tuner else self.max_batches
        self._budget = CreditBudget(
            num_workers=self.num_workers,
            max_bytes=self.credit_bytes,
            max_batches=depth,
            pooled=not self.in_order,
            ctx=self._ctx,
            lock_timeout_s=min(10.0, self.timeout_s or 10.0),
        )
        self._board = Board(self._ctx)
        self._arena = self._make_arena()
        feed = Feed(
            self.pipeline,
            budget=self._budget,
            board=self._board,
            stage_bytes=self.stage_bytes,
            read_bytes=self.read_bytes,
            arena=self._arena,
        )
        self._dl = DataLoader(
            feed,
            batch_size=None,
            collate_fn=_identity,
            num_workers=self.num_workers,
            prefetch_factor=math.ceil(self.max_batches / self.num_workers) + 1,
            persistent_workers=self.persistent_workers,
            pin_memory=self.pin_memory,
            in_order=self.in_order,
            multiprocessing_context=self._ctx if self._ctx_name else None,
            timeout=0,  # the Supervisor bounds every wait (streambuf._supervise)
        )
        return self._dl

    def _make_arena(self) -> Any:
        from . import _arena

        if not self.use_arena or not _arena.available():
            return None
        slots = math.ceil(self.max_batches / self.num_workers)
        slot_bytes = self.credit_bytes // self.num_workers // slots
        if slot_bytes < 1 << 16:  # batches this small gain nothing from it
            return None
        return _arena.Arena(
            num_workers=self.num_workers,
            slots_per_worker=slots,
            slot_bytes=slot_bytes,
            ctx=self._ctx,
        )

    def _rank_world(self) -> tuple[int, int]:
        return self.pipeline.rank_world or current_rank_world()

    # -- iteration --------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (reaches persistent workers too).

        After ``load_state_dict``, only the epoch the state resumes is accepted (the
        saved epoch, or the next one when the state is complete): the usual loop, with
        ``loader.set_epoch(epoch)`` at the top of each epoch, keeps the resume. Another
        epoch raises ``ValueError`` (it would drop the loaded state, or run the wrong
        epoch)."""
        epoch = check_int(epoch, name="epoch")
        self._tracker.check_epoch(epoch)
        self._epoch = epoch

    @property
    def epoch(self) -> int:
        """The epoch of the next iteration: a loaded state's, else ``set_epoch``'s, else
        the pipeline's."""
        loaded = self._tracker.loaded_epoch()
        if loaded is not None:
            return loaded
        return self.pipeline.epoch if self._epoch is None else self._epoch

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise RuntimeError("this Loader was closed; build a new one")
        live: Iterator[Any] = self._iter_host()
        if self.device is not None and self.device.type != "cpu":
            live = iter(DevicePrefetcher(live, device=self.device, depth=self.device_depth))
        live = self._hand_over(live)
        self._live = weakref.ref(live)
        return live

    def _hand_over(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The loop's side of an iteration: a batch counts in ``state_dict()``
        (``RunTracker.handed``) right as it is yielded here, the outermost layer, and
        nothing runs between the two. What runs after a batch leaves the pipeline (the
        log sink, the depth tuner, a sizer, a device copy that runs batches ahead)
        cannot leave the state ahead of the loop or behind it, even when it raises."""
        try:
            for batch in batches:
                self._tracker.handed()
                yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:  # (close() or a break: the iteration ends here)
                close()

    def _iter_host(self) -> Iterator[Any]:
        self._iter_start = time.monotonic()
        self._iter_batches = self._iter_bytes = 0
        self._iter_wait = 0.0
        self._iter_first = self._iter_last = self._iter_first_wait = 0.0
        rank, world = self._rank_world()
        plan = self._tracker.start(epoch=self.epoch, rank=rank, world_size=world)
        self._epoch = plan.epoch
        if self.num_workers == 0:
            ctx = WorkerContext(rank, world, 0, 1, plan.epoch, self.pipeline.seed, self.read_bytes)
            it = self.pipeline._iterate(
                ctx, stage_bytes=self.stage_bytes, resume=plan.workers[0], progress=plan.progress
            )
            yield from self._count_local(it)
            return
        dl = self._dataloader()
        assert self._budget is not None and self._board is not None
        if self._arena is not None and self._dl_iter is None:
            self._arena.reclaim()  # no worker runs now: free what no batch view holds
        kept = getattr(dl, "_iterator", None) if self.persistent_workers else None
        self._round = 0 if kept is None else self._round + 1
        gen = self._budget.new_generation()
        self._board.publish(
            generation=gen,
            epoch=plan.epoch,
            rank=rank,
            world_size=world,
            rotation=plan.rotation,
            plan=plan.for_workers() if plan.resumes else None,
            round_=self._round,
        )
        failed = finished = False
        poll_s = min(POLL_S, self.timeout_s or POLL_S)
        try:
            if kept is not None:  # persistent workers: iter() resets them, a wait
                self._supervisor = Supervisor(kept, timeout_s=self.timeout_s, poll_s=poll_s)
                with self._supervisor.waiting():
                    self._dl_iter = iter(dl)
            else:
                with frozen_for_fork(self._ctx.get_start_method()):  # (workers fork here)
                    self._dl_iter = iter(dl)
                self._supervisor = Supervisor(
                    self._dl_iter, timeout_s=self.timeout_s, poll_s=poll_s
                )
            yield from self._count_workers(self._dl_iter, self._supervisor)
            finished = True
        except WorkerError:
            failed = True
            raise
        finally:
            self._end_iteration(failed=failed, early=not finished)

    # -- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank's run is: exactly the batches handed to the user so far, as
        plain data (JSON-serialisable; positions, never samples). Cheap, and never
        pauses the workers. Save one per rank; see ``load_state_dict``."""
        return self._tracker.state_dict(epoch=self.epoch, rank_world=self._rank_world())

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]], /) -> None:
        """Resume the next iteration where ``state`` left off (call before iterating).

        * The state of this rank, same ``num_workers`` and world size: the remaining
          batches of the epoch are exactly those of the uninterrupted run (with
          ``in_order=True``; exactly once in any order otherwise), then later epochs as
          if never interrupted.
        * Another ``num_workers`` or world size: pass the states of *all* old ranks (a
          list, e.g. gathered with ``all_gather_object`` or one file per rank); every
          remaining sample of the epoch is delivered exactly once over the new ranks.
        * A state saved at the very end of an epoch: the next iteration is the next
          epoch.
        * The shard list may have been rebuilt: shards are matched by name (the last
          path component, a URL's query string dropped), so a reordered list, the same
          files in another folder or bucket, or re-signed URLs resume exactly once;
          shards *appended* to the list are read whole in the rest of the epoch. (A
          reordered or extended list resumes like a new layout: with several ranks, pass
          the states of all of them.) Pipelines of plain items are matched by count.
        * ``set_epoch(e)`` afterwards: accepted when ``e`` is the epoch this state
          resumes (``loader.epoch``: the saved epoch, or the next one when the state is
          complete), so ``for epoch in range(start, n): loader.set_epoch(epoch); ...``
          works unchanged; another ``e`` raises ``ValueError``.

        The state is checked completely here, in this process, before anything uses it.

        Raises:
            ValueError: not a streambuf state; a field missing, of the wrong type or out
                of range (the message names its path, e.g.
                ``state["workers"][1]["next_worker"]``); a different pipeline (stages,
                seed); shards of the saved run missing from this list (removed or
                replaced, named) or names that are not unique where the list changed;
                another rank's state, or an incomplete set of ranks, for this layout.
        """
        self._tracker.load(state)

    def _end_iteration(self, *, failed: bool, early: bool = False) -> None:
        """Wake workers waiting for credits, then shut them down (or keep them, when
        persistent). After a worker failure: kill them all and drop this DataLoader (a
        killed worker may hold the budget's lock: the next iteration builds a new one).
        Left early (a stage's error, an error in the loop, a break) without persistent
        workers: torch's shutdown runs, and the workers still inside an item after
        ``EARLY_GRACE_S`` are killed (it waits 5 s for each: a stage's error reached the
        loop 15 s late with three workers in a long read). Its first step stops the
        pin-memory thread, so no worker is killed while that thread reads from it."""
        sup, self._supervisor = self._supervisor, None
        if sup is not None:
            sup.stop()
        dl_iter = self._dl_iter
        if failed:
            kill_workers(dl_iter)
        elif self._budget is not None:
            self._budget.new_generation()
        if early and not failed and not self.persistent_workers and sys.is_finalizing():
            # (a loop left by an exception that ends the program: the generator is closed
            # while the interpreter shuts down, where a new thread never runs: end them)
            kill_workers(dl_iter)
            failed = True
            self._shutdown(dl_iter)
        elif early and not failed and not self.persistent_workers and dl_iter is not None:
            ending = threading.Thread(
                target=self._shutdown, args=(dl_iter,), name="streambuf-shutdown", daemon=True
            )
            ending.start()
            ending.join(EARLY_GRACE_S)
            if ending.is_alive():
                kill_workers(dl_iter)
                failed = True
            ending.join(SHUTDOWN_JOIN_S)
        elif failed or not self.persistent_workers:
            self._shutdown(dl_iter)
        if failed:
            self._dl = None  # a fresh DataLoader and budget next time

    def _shutdown(self, dl_iter: Any) -> None:
        shutdown = getattr(dl_iter, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
            self.pipeline._workers_ended()  # killed workers never zeroed their gauges
        if self._dl is not None and getattr(self._dl, "_iterator", None) is dl_iter:
            self._dl._iterator = None
        self._dl_iter = None

    def close(self) -> None:
        """End the iteration in progress (its stages' threads and files, its workers),
        persistent workers, and release the DataLoader. Idempotent; the Loader cannot be
        iterated afterwards (an iterator still held ends: ``StopIteration``; one being
        iterated in another thread ends after the batch it is waiting for)."""
        self._closed = True
        live = self._live() if self._live is not None else None
        if live is not None:  # an iteration still held: it ends here, with its stages'
            try:  # threads and files (num_workers=0: they run in this process)
                live.close()  # type: ignore[attr-defined]
            except ValueError:  # running in another thread: num_workers=0 ends it at its
                pass  # next batch (``_count_local``), workers by the shutdown below
        if self._dl_iter is not None:
            self._shutdown(self._dl_iter)
        self._dl = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _count_local(self, it: Any) -> Iterator[Any]:
        batches = iter(it)
        try:
            while True:
                if self._closed:  # close() from another thread: end at this batch
                    return
                t0 = time.monotonic()
                try:
                    batch = next(batches)
                except StopIteration:
                    self._epoch_ended()
                    return
                self._account(t0, time.monotonic() - t0, nbytes(batch))
                self._tracker.taken(0, it.snapshot())
                yield batch
        finally:
            batches.close()

    def _count_workers(self, it: Iterator[Any], sup: Supervisor) -> Iterator[Any]:
        budget = self._budget
        assert budget is not None
        while True:
            # "found empty": no finished batch was waiting when the loop asked. Waiting
            # while one is in transit is transport cost, not starvation.
            empty = budget.held_bytes() <= 0
            t0 = time.monotonic()
            try:
                item = sup.next(it)
            except StopIteration:
                self._epoch_ended()
                return
            waited = time.monotonic() - t0
            if isinstance(item, Failure):
                if item.nbytes is not None:
                    budget.release(item.worker, item.nbytes)
                raise item.exception()
            assert isinstance(item, Tagged)
            budget.release(item.worker, item.nbytes)
            logical, snapshot = item.state
            if item.end:  # a share that ended without a batch: its state, nothing to yield
                self._tracker.taken(logical, snapshot, batch=False)
                continue
            if empty:
                self._empty_gets += 1
            if self.tuner is not None:
                self.tuner.observe(waited_s=waited if empty else 0.0, batch_bytes=item.nbytes)
                depth = self.tuner.update()
                if depth is not None:
                    budget.set_limits(max_batches=depth)
            self._account(t0, waited, item.nbytes)
            self._tracker.taken(logical, snapshot)
            yield item.batch

    def _account(self, t0: float, waited: float, size: int) -> None:
        self._wait_s += waited
        self._iter_wait += waited
        now = time.monotonic()
        if self._iter_batches < max(1, self.num_workers):  # start-up: each worker's first
            self._iter_first, self._iter_first_wait = now, self._iter_wait
        self._iter_last = now
        self._batches += 1
        self._iter_batches += 1
        self._iter_bytes += size
        self._bytes += size
        if self._log is not None and self._log.due(now):
            self._log.emit(self.stats())

    def _epoch_ended(self) -> None:
        """The iteration ran to its end: the last figures of the epoch to the log."""
        if self._log is not None and self._iter_batches:
            self._log.emit(self.stats())

    # -- introspection ----------------------------------------------------------------
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
        steady = (
            (self._iter_wait - self._iter_first_wait)
            / max(1e-9, self._iter_last - self._iter_first)
            if self._iter_batches > max(1, self.num_workers)
            else None
        )
        stages, found = self.pipeline._diagnose(wait_fraction=steady, workers=self.num_workers)
        return LoaderStats(
            batches=self._iter_batches,
            bytes=self._iter_bytes,
            wait_s=self._iter_wait,
            total_batches=self._batches,
            total_bytes=self._bytes,
            total_wait_s=self._wait_s,
            elapsed_s=elapsed,
            batches_per_s=self._iter_batches / elapsed,
            wait_fraction=self._iter_wait / elapsed,
            steady_wait_fraction=float("nan") if steady is None else steady,
            empty_gets=self._empty_gets,
            depth=depth,
            occupancy=(budget.in_flight_batches / depth) if budget is not None else 0.0,
            tuner_decisions=len(decisions),
            decisions=decisions[-16:],
            budget=budget,
            stage_bytes=self.stage_bytes,
            fixed_bytes=self.fixed_bytes,
            threads=self.pipeline.stats().threads,
            stages=stages,
            bottleneck="" if found is None else str(found),
        )

    def report(self) -> str:
        """Where the time goes: per stage (summed over the workers, this pipeline's
        runs so far) in the order data flows, then which stage limits throughput and
        the one change most likely to help; "the consumer" when batches were ready
        (after each worker's first batch, the loop waited less than 5% of the
        current iteration's time: ``stats().steady_wait_fraction``). ``print(loader.report())``
        after some batches, or at the end of an epoch."""
        steady = self.stats().steady_wait_fraction
        return self.pipeline.report(
            wait_fraction=None if math.isnan(steady) else steady, workers=self.num_workers
        )
