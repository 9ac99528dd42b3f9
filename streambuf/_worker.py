"""The worker side of a ``Loader``: the dataset the DataLoader runs in each worker.

Per iteration the main process publishes a *plan* on a ``Board`` (shared memory, so
persistent workers see it too): the generation, epoch, rank and world size resolved in
the main process when the iteration started. A worker never asks ``torch.distributed``
itself (its process group may not exist there) and never relies on attributes of the
user's ``Pipeline`` set after the workers started.

``Feed.__iter__`` (in each worker):

1. starts, once per process, a thread that watches the parent: when the main process is
   gone (SIGKILL, OOM killer) the worker exits within ``PARENT_POLL_S``, wherever its
   other threads are blocked (credit wait, buffer put, lane threads, a stuck read);
2. runs its slot of the pipeline (``streambuf._iteration``) as logical worker
   ``(id + rotation) % num_workers`` from the plan's resume data, if any;
3. reserves credits *before* building each batch (the batch under construction counts),
   adjusts them to the true size, and yields ``Tagged(worker, nbytes, batch, state)``
   with the slot's snapshot just after that batch (``state = (logical, snapshot)``);
4. turns an exception of the pipeline into a ``Failure`` message (its type, attributes and
   notes survive the process boundary, see ``streambuf._transport``) and ends.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset

from ._transport import Failure, Tagged
from .budget import CreditBudget
from .sizing import nbytes

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = ["PARENT_POLL_S", "Board", "Feed", "watch_parent"]

PARENT_POLL_S = 0.5
RECENT_BATCHES = 4  # a worker's reservation: the largest of its last this many batches
_GEN, _EPOCH, _RANK, _WORLD, _ROTATION, _PLAN, _ROUND = range(7)


class Board:
    """The per-iteration plan, in shared memory (written by the main process only).

    The integers (generation, epoch, rank, world size, rotation) live in a shared array;
    resume data, when there is some, in a file ``plan-<generation>.pkl`` of a private
    folder made here (persistent workers see both; a file has no size limit and needs no
    reader thread). The folder is removed with the board in the main process.
    """

    def __init__(self, ctx: BaseContext) -> None:
        self._raw: Any = ctx.RawArray("q", 7)
        self.folder = tempfile.mkdtemp(prefix="streambuf-plan-")
        self._owner = os.getpid()
        weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)

    def publish(
        self,
        *,
        generation: int,
        epoch: int,
        rank: int,
        world_size: int,
        rotation: int = 0,
        plan: Any = None,
        round_: int = 0,
    ) -> None:
        """``round_``: how many times the current DataLoader iterator was reset before
        this iteration (0 for a fresh one; persistent workers count up)."""
        for old in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, old))
        if plan is not None:
            path = os.path.join(self.folder, f"plan-{generation}.pkl")
            with open(path + ".tmp", "wb") as f:
                pickle.dump(plan, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(path + ".tmp", path)
        r = self._raw
        r[_EPOCH], r[_RANK], r[_WORLD], r[_ROTATION] = epoch, rank, world_size, rotation
        r[_PLAN] = plan is not None
        r[_ROUND] = round_
        r[_GEN] = generation

    def round(self) -> int:
        return int(self._raw[_ROUND])

    def read(self) -> tuple[int, int, int, int, int, Any]:
        """(generation, epoch, rank, world_size, rotation, plan or None)."""
        r = self._raw
        gen = int(r[_GEN])
        plan = None
        if r[_PLAN]:
            with open(os.path.join(self.folder, f"plan-{gen}.pkl"), "rb") as f:
                plan = pickle.load(f)
        return gen, int(r[_EPOCH]), int(r[_RANK]), int(r[_WORLD]), int(r[_ROTATION]), plan

    def __getstate__(self) -> dict[str, Any]:
        return {"_raw": self._raw, "folder": self.folder, "_owner": self._owner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # a worker's copy: no finalizer, the owner cleans up


_watched_pid: int | None = None


def watch_parent(poll_s: float = PARENT_POLL_S) -> None:
    """In a worker: exit the process once its parent has died (once per process)."""
    global _watched_pid
    if _watched_pid == os.getpid():
        return
    _watched_pid = os.getpid()
    parent = os.getppid()

    def run() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:  # re-parented: the main process is gone
                os._exit(1)

    threading.Thread(target=run, name="streambuf-parent-watch", daemon=True).start()


_malloc_fixed = False


def _env_bytes(name: str, default: int) -> int:
    """An environment variable holding a whole number >= 0 (``default`` when unset)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{name}={raw!r} must be a whole number >= 0 (bytes for the threshold, a count "
            "for ARENA_MAX); unset it for the default"
        )
    return value


def fix_malloc_thresholds() -> None:
    """In a worker: fix glibc's mmap/trim thresholds at 1 MiB (once per process).

    glibc raises its mmap threshold each time a large mmapped block is freed (up to
    32 MiB), after which big samples come from thread heaps that keep freed memory:
    worker memory then grows past any budget. A fixed threshold keeps blocks from 1 MiB
    up in mmap, returned to the system on free, while smaller samples are reused from
    the heaps instead of being mapped, faulted in and unmapped each time (measured, seed
    workload of 600 KB samples, 4 workers x 8 threads: 36-50 batches/s at a 32 KiB
    threshold, 83 at 1 MiB; 64 KiB samples: 73-82 -> 92). The price is what each
    thread's heap keeps of freed samples under 1 MiB (a few per thread).
    ``STREAMBUF_MMAP_THRESHOLD`` (bytes; 0 = leave glibc alone) and
    ``STREAMBUF_ARENA_MAX`` override. No-op where glibc is not the allocator.
    """
    global _malloc_fixed
    if _malloc_fixed:
        return
    _malloc_fixed = True
    threshold = _env_bytes("STREAMBUF_MMAP_THRESHOLD", 1 << 20)
    if threshold <= 0:
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, threshold)  # M_TRIM_THRESHOLD
        arenas = _env_bytes("STREAMBUF_ARENA_MAX", 0)
        if arenas > 0:
            libc.mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


class Feed(IterableDataset[Any]):
    """What the DataLoader iterates in each worker: the pipeline under credits.

    Holds configuration and shared memory only (picklable for spawn); never mutates the
    pipeline. ``stage_bytes`` is each worker's grant for its stage buffers,
    ``read_bytes`` what the Loader charged for its source's read buffers (None: none).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        budget: CreditBudget,
        board: Board,
        stage_bytes: int | None,
        read_bytes: int | None = None,
        arena: Any = None,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.budget = budget
        self.board = board
        self.stage_bytes = stage_bytes
        self.read_bytes = read_bytes
        self.arena = arena  # streambuf._arena.Arena, or None
        self._made = 0  # in a worker: the iterations torch asked this process for

    def __iter__(self) -> Iterator[Tagged | Failure]:
        """Not a generator: which iteration this one is, is decided *here*, when torch
        makes the worker's fetcher: at the worker's start (round 0) and at each reset of
        persistent workers (rounds 1, 2, ...). A worker counts the fetchers it was
        asked to make; when the board is at another round, this fetcher belongs to an
        iteration the main process already left (a worker slow to start, tasks of an
        abandoned iteration still queued before the reset) and yields nothing. Bound
        later (a generator reads the board at its first ``next``), such a fetcher would
        run the *new* plan, take its credits for batches the reset discards, and block
        before acknowledging the reset: a hang."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            raise RuntimeError("streambuf.Loader's dataset runs only in DataLoader workers")
        mine, self._made = self._made, self._made + 1
        if self.board.round() != mine:
            return iter(())
        return self._run(info, self.board.read())

    def _run(
        self, info: Any, read: tuple[int, int, int, int, int, Any]
    ) -> Iterator[Tagged | Failure]:
        from ._contracts import WorkerContext

        worker = info.id
        watch_parent()
        fix_malloc_thresholds()
        from . import _arena

        _arena.activate(self.arena, worker)
        gen, epoch, rank, world, rotation, plan = read
        logical = (worker + rotation) % info.num_workers  # an in-order resume's rotation
        ctx = WorkerContext(
            rank, world, logical, info.num_workers, epoch, self.pipeline.seed, self.read_bytes
        )
        resume, progress = None, None
        if plan is not None:
            from ._elastic import Progress

            resume = plan["workers"][logical]
            if plan["progress"] is not None:
                progress = Progress.from_data(plan["progress"])
        budget = self.budget
        estimate = budget.slice_bytes(worker)  # first batch: its whole slice (size unknown)
        first = True
        recent: deque[int] = deque(maxlen=RECENT_BATCHES)  # the last batches' sizes
        try:  # (a plan this worker cannot run, e.g. equalize's: streambuf's error path)
            it = self.pipeline._iterate(
                ctx, stage_bytes=self.stage_bytes, resume=resume, progress=progress
            )
            batches = iter(it)
        except Exception as exc:
            yield Failure.of(exc, worker=worker)
            return
        try:
            while True:
                if not budget.reserve(worker, estimate, generation=gen):
                    return  # the main process abandoned this iteration
                try:
                    batch = next(batches)
                except StopIteration:
                    if first:  # no batch carried a snapshot: say where the share ended
                        budget.adjust(worker, -estimate, batch_bytes=0, generation=gen)
                        yield Tagged(worker, 0, None, (logical, it.snapshot()), end=True)
                    else:
                        budget.cancel(worker, estimate, generation=gen)
                    return
                except Exception as exc:
                    budget.cancel(worker, estimate, generation=gen)
                    yield Failure.of(exc, worker=worker)
                    return
                size = nbytes(batch)
                if size > estimate:  # reserved again at its real size: it fits, or alone
                    budget.cancel(worker, estimate, generation=gen)
                    if not budget.reserve(worker, size, generation=gen, first=True):
                        if self.arena is not None and self.arena.usable:
                            self.arena.discard(batch)  # abandoned: never sent
                        return
                    budget.adjust(worker, 0, batch_bytes=size, overshoot=True, generation=gen)
                else:
                    budget.adjust(worker, size - estimate, batch_bytes=size, generation=gen)
                recent.append(size)
                # the next reservation: the largest of the last batches (one outlier does
                # not shrink the depth for the rest of the epoch; a larger batch reserves
                # again at its size)
                estimate = max(max(recent), 1)
                first = False
                yield Tagged(worker, size, batch, (logical, it.snapshot()))
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            if self.arena is not None and self.arena.usable:
                self.arena.release_unsent()
