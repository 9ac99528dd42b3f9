"""The saved state of a run, and what a run resumes from it.

A state (``Loader.state_dict()``, ``Pipeline.state_dict()``) is plain data (JSON-safe):

    {"version": 1, "kind": "streambuf.state",
     "epoch": e, "seed": s, "shards": n, "fingerprint": "...",
     "layout": {"rank": r, "world_size": W, "num_workers": w, "in_order": bool},
     "workers": [snapshot | None, ...],     # per worker: streambuf._iteration snapshot
     "next_worker": k,                      # in-order: the worker whose batch is next
     "complete": bool,                      # every worker delivered its whole stream
     "before": progress | None}             # carried over from an elastic resume

``plan(pipe, states)`` decides how the next iteration resumes:

* ``complete``: the next iteration is the *next* epoch, from its start;
* this rank's own state, same world size and workers (alone, or in the list of all
  ranks' states): each worker resumes its own snapshot (``mode="exact"``): the
  remainder is identical to the uninterrupted run's with ``in_order=True``, and exactly
  once in any case;
* otherwise (``mode="elastic"``): the states of *all* old ranks are needed; what they
  delivered becomes a ``streambuf._elastic.Progress`` and every new slot reads its new
  share of what is left: every remaining sample exactly once, order re-derived.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._elastic import Progress
from .sharding import assign, shard_order

if TYPE_CHECKING:
    from ._iteration import Iteration
    from .pipeline import Pipeline, WorkerContext

__all__ = ["check_loadable", "pipeline_state", "plan_pipeline", "run_state", "worker_plan"]

VERSION = 1
KIND = "streambuf.state"


def fingerprint(pipe: Pipeline) -> str:
    """What must not change between save and load: the shard count and the stages."""
    stages = ",".join(s.name for s in pipe._stages)
    mixed = pipe._mix.fingerprint() if pipe._mix is not None else ""
    return f"{pipe.num_shards()}|{int(pipe._shuffle_shards)}|{pipe._equalize}|{stages}{mixed}"


_HAS_DATA: weakref.WeakKeyDictionary[Any, dict[tuple[int, int, int], bool]] = (
    weakref.WeakKeyDictionary()
)


def _slot_has_data(pipe: Pipeline, epoch: int, slot: int, slots: int) -> bool:
    if pipe._mix is not None:
        return True  # its sources' shares: known only by running them
    known = _HAS_DATA.setdefault(pipe, {})
    key = (epoch, slot, slots)
    if key not in known:  # a state is taken per batch: compute the order once per epoch
        n = pipe.num_shards() or 0
        order = shard_order(n, seed=pipe.seed, epoch=epoch, shuffle=pipe._shuffle_shards)
        known[key] = bool(assign(n, order, slot, slots).shards)
    return known[key]


def run_state(
    pipe: Pipeline,
    *,
    epoch: int,
    rank: int,
    world_size: int,
    num_workers: int,
    in_order: bool,
    workers: Sequence[dict[str, Any] | None],
    next_worker: int,
    before: Progress | None,
) -> dict[str, Any]:
    """The state dict of one rank (see the module docstring)."""
    if pipe.num_shards() is None:
        raise ValueError(
            "a pipeline over a one-shot iterable has no state to save; give it a sequence "
            "(a list of shards or items) to make it resumable"
        )
    complete = all(
        (snap is not None and snap["last"])
        or (
            snap is None
            and not _slot_has_data(pipe, epoch, rank * num_workers + w, world_size * num_workers)
        )
        for w, snap in enumerate(workers)
    )
    return {
        "version": VERSION,
        "kind": KIND,
        "epoch": epoch,
        "seed": pipe.seed,
        "shards": pipe.num_shards(),
        "fingerprint": fingerprint(pipe),
        "layout": {
            "rank": rank,
            "world_size": world_size,
            "num_workers": num_workers,
            "in_order": in_order,
        },
        "workers": list(workers),
        "next_worker": next_worker,
        "complete": complete,
        "before": before.to_data() if before is not None else None,
    }


def pipeline_state(pipe: Pipeline, it: Iteration | None) -> dict[str, Any]:
    """``Pipeline.state_dict()``: the in-process iteration as a one-slot run."""
    ctx = it.ctx if it is not None else pipe.context()
    workers: list[dict[str, Any] | None] = [None] * ctx.num_workers
    if it is not None:
        workers[ctx.worker] = it.snapshot()
    return run_state(
        pipe,
        epoch=ctx.epoch,
        rank=ctx.rank,
        world_size=ctx.world_size,
        num_workers=ctx.num_workers,
        in_order=True,
        workers=workers,
        next_worker=0,
        before=it.progress if it is not None else None,
    )


def _check_one(pipe: Pipeline, state: Any) -> dict[str, Any]:
    if not isinstance(state, dict) or state.get("kind") != KIND:
        raise ValueError(
            "load_state_dict() needs a state from streambuf's state_dict() (a dict with "
            f"kind={KIND!r}); got {type(state).__name__}"
        )
    if state.get("version") != VERSION:
        raise ValueError(f"state version {state.get('version')!r}; this streambuf reads {VERSION}")
    if state["fingerprint"] != fingerprint(pipe) or state["seed"] != pipe.seed:
        raise ValueError(
            "this state was saved by a different pipeline (shards, stages or seed differ: "
            f"saved {state['fingerprint']!r} seed {state['seed']}, this one "
            f"{fingerprint(pipe)!r} seed {pipe.seed}); resume with the same pipeline"
        )
    return state


def check_loadable(pipe: Pipeline, state: Any) -> dict[str, Any]:
    """Validate a state or the states of all ranks of one run; returns the plan input."""
    states = [state] if isinstance(state, dict) else list(state)
    if not states:
        raise ValueError("load_state_dict() got no state")
    states = sorted((_check_one(pipe, s) for s in states), key=lambda s: s["layout"]["rank"])
    head = states[0]
    for s in states[1:]:
        if (s["epoch"], s["layout"]["world_size"], s["layout"]["num_workers"]) != (
            head["epoch"],
            head["layout"]["world_size"],
            head["layout"]["num_workers"],
        ):
            raise ValueError("these states come from different runs (epoch or layout differ)")
    ranks = [s["layout"]["rank"] for s in states]
    if not isinstance(state, dict) and ranks != list(range(head["layout"]["world_size"])):
        raise ValueError(
            f"load_state_dict() got the states of ranks {ranks} of a world of "
            f"{head['layout']['world_size']}: pass all of them (one per old rank)"
        )
    return {
        "epoch": head["epoch"],
        "complete": all(s["complete"] for s in states) if len(states) > 1 else head["complete"],
        "states": states,
    }


def worker_plan(
    pipe: Pipeline, plan: dict[str, Any], *, rank: int, world_size: int, num_workers: int
) -> tuple[int, str, list[dict[str, Any] | None] | None, Progress | None, int]:
    """How rank ``rank``'s workers resume: (epoch, mode, snapshots, progress, next_worker)
    with mode "fresh", "exact" or "elastic"."""
    if plan["complete"]:
        return plan["epoch"] + 1, "fresh", None, None, 0
    states = plan["states"]
    mine = [
        s
        for s in states
        if (s["layout"]["rank"], s["layout"]["world_size"], s["layout"]["num_workers"])
        == (rank, world_size, num_workers)
    ]
    if mine and (len(states) == 1 or len(states) == world_size):  # this rank's own state
        state = mine[0]
        before = state.get("before")
        progress = Progress.from_data(before) if before is not None else None
        return plan["epoch"], "exact", state["workers"], progress, state["next_worker"]
    if len(states) == 1:
        layout = states[0]["layout"]
        if layout["world_size"] != 1:
            raise ValueError(
                f"the saved run had world_size={layout['world_size']}; to resume at "
                f"world_size={world_size}, pass the states of all its ranks to load_state_dict()"
            )
    if pipe._mix is not None:
        raise ValueError(
            "a mix() pipeline resumes only at the layout it was saved at (same world size "
            "and num_workers)"
        )
    return plan["epoch"], "elastic", None, Progress.of_states(pipe, states), 0


def plan_pipeline(
    pipe: Pipeline, ctx: WorkerContext, plan: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, Progress | None, WorkerContext]:
    """For an in-process iteration: (this slot's snapshot, progress, context)."""
    from dataclasses import replace

    if plan is None:
        return None, None, ctx
    epoch, mode, workers, progress, _ = worker_plan(
        pipe, plan, rank=ctx.rank, world_size=ctx.world_size, num_workers=ctx.num_workers
    )
    pipe.set_epoch(epoch)
    ctx = replace(ctx, epoch=epoch)
    if mode == "exact":
        assert workers is not None
        return workers[ctx.worker], progress, ctx
    return None, progress, ctx
