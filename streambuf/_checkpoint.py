"""``RunTracker``: the main process's record of where each worker is, for checkpoints.

Each batch arrives with its worker's snapshot (``streambuf._iteration``), taken right
after the worker built it; the tracker keeps, per worker, the snapshot of the last batch
*handed to the user*, and which worker is due next in order. That is all
``Loader.state_dict()`` needs: it never asks or pauses a worker, and batches that workers
produced but the user has not received are not in it (they are re-derived on resume).

Taken is not handed over: a batch is ``taken`` when it leaves the pipeline (its snapshot
waits, in order, with the shares' ends), and counts only when the Loader's outermost
layer hands it to the loop (``handed``, right at its ``yield``). Whatever runs between
the two (the log sink, the depth tuner, a sizer, a device copy that runs batches ahead)
may raise or hold batches back without leaving the state ahead of the loop or behind it.

``start()`` turns a loaded state (``streambuf._state``) into this iteration's plan: the
epoch, the round-robin rotation (an in-order resume must continue with the worker that
was due), and per worker what to resume from.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _state
from ._elastic import Progress

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = ["IterationPlan", "RunTracker"]


def _dist_rank_world() -> tuple[int, int] | None:
    """(rank, world) when torch.distributed is initialised, else None (unknown yet)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None


@dataclass
class IterationPlan:
    """What the workers of one iteration start from (``workers[w]``: logical worker w)."""

    epoch: int
    rotation: int = 0
    workers: list[dict[str, Any] | None] = field(default_factory=list)
    progress: Progress | None = None

    @property
    def resumes(self) -> bool:
        return self.progress is not None or any(w is not None for w in self.workers)

    def for_workers(self) -> dict[str, Any]:
        """As plain data for the workers (``streambuf._worker.Board``)."""
        return {
            "workers": self.workers,
            "progress": self.progress.to_data() if self.progress is not None else None,
        }


class RunTracker:
    """See the module docstring."""

    def __init__(self, pipe: Pipeline, *, num_workers: int, in_order: bool) -> None:
        self.pipe = pipe
        self.num_workers = max(1, num_workers)
        self.in_order = in_order
        self._loaded: dict[str, Any] | None = None
        self._epoch: int | None = None
        self._rank_world: tuple[int, int] | None = None
        self._snaps: list[dict[str, Any] | None] = [None] * self.num_workers
        self._next = 0
        self._before: Progress | None = None
        # taken, not yet handed over, in order: (worker, snapshot, is a batch)
        self._taken: deque[tuple[int, dict[str, Any] | None, bool]] = deque()

    def load(self, state: Any) -> None:
        loaded = _state.check_loadable(self.pipe, state)
        known = self.pipe.rank_world or _dist_rank_world()
        if known is not None:  # check the plan now, not at the first iteration
            _state.worker_plan(
                self.pipe, loaded, rank=known[0], world_size=known[1], num_workers=self.num_workers
            )
        self._loaded = loaded

    def loaded_epoch(self) -> int | None:
        """The epoch the loaded, not yet started state resumes (None: nothing loaded)."""
        return None if self._loaded is None else _state.next_epoch(self._loaded)

    def check_epoch(self, epoch: int) -> None:
        """``set_epoch(epoch)``: refused unless it is the loaded state's epoch."""
        if self._loaded is not None:
            _state.check_set_epoch(self._loaded, epoch)

    def start(self, *, epoch: int, rank: int, world_size: int) -> IterationPlan:
        """The plan of an iteration starting now (consumes a loaded state)."""
        plan = IterationPlan(epoch=epoch, workers=[None] * self.num_workers)
        if self._loaded is not None:
            e, mode, snaps, progress, nxt = _state.worker_plan(
                self.pipe,
                self._loaded,
                rank=rank,
                world_size=world_size,
                num_workers=self.num_workers,
            )
            self._loaded = None
            plan.epoch, plan.progress = e, progress
            if mode == "exact":
                assert snaps is not None
                plan.workers = list(snaps)
                plan.rotation = nxt if self.in_order else 0
        self._epoch, self._rank_world = plan.epoch, (rank, world_size)
        self._snaps = list(plan.workers)
        self._next = plan.rotation
        self._before = plan.progress
        self._taken.clear()  # (what an iteration left early took and never handed over)
        return plan

    def taken(self, worker: int, snapshot: dict[str, Any] | None, *, batch: bool = True) -> None:
        """A batch of (logical) ``worker`` with this snapshot left the pipeline; it counts
        when ``handed`` over. ``batch=False``: the worker's share ended without a batch,
        which counts as soon as every batch taken before it was handed over."""
        self._taken.append((worker, snapshot, batch))
        self._settle()

    def handed(self) -> None:
        """The user received the oldest batch taken and not yet handed over."""
        self._settle()
        if self._taken:  # (empty only where a state was loaded during the iteration)
            worker, snapshot, _ = self._taken.popleft()
            self._delivered(worker, snapshot)
            self._settle()

    def _settle(self) -> None:
        """Count the shares' ends that no batch still on its way precedes."""
        while self._taken and not self._taken[0][2]:
            worker, snapshot, _ = self._taken.popleft()
            self._delivered(worker, snapshot)

    def _delivered(self, worker: int, snapshot: dict[str, Any] | None) -> None:
        self._snaps[worker] = snapshot
        self._next = (worker + 1) % self.num_workers

    def state_dict(self, *, epoch: int, rank_world: tuple[int, int]) -> dict[str, Any]:
        """This rank's state (``epoch``/``rank_world``: used before any iteration)."""
        if self._loaded is not None:  # loaded, not started: the plan it would run
            rank, world = rank_world
            plan = self.start(epoch=epoch, rank=rank, world_size=world)
            self._loaded = _state.check_loadable(self.pipe, self._state(plan.epoch))
            return self._state(plan.epoch)
        if self._epoch is None:
            self._epoch, self._rank_world = epoch, rank_world
        return self._state(self._epoch)

    def _state(self, epoch: int) -> dict[str, Any]:
        """This rank's state, with its digest (``_state.digest``: a Loader's state may be
        saved by a checkpointer that assembles values; a pipeline's own, taken per
        batch by a StatefulDataLoader or per item by the nodes, goes without)."""
        rank, world = self._rank_world or (0, 1)
        return _state.with_digest(
            _state.run_state(
                self.pipe,
                epoch=epoch,
                rank=rank,
                world_size=world,
                num_workers=self.num_workers,
                in_order=self.in_order,
                workers=self._snaps,
                next_worker=self._next,
                before=self._before,
            )
        )
