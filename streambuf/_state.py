"""The saved state of a run, and what a run resumes from it.

A state (``Loader.state_dict()``, ``Pipeline.state_dict()``) is plain data (JSON-safe):

    {"version": 1, "kind": "streambuf.state",
     "epoch": e, "seed": s, "shards": n, "fingerprint": "...",   # see shape()
     "names": [...] | None,                 # shard identities (streambuf._identity)
     "layout": {"rank": r, "world_size": W, "num_workers": w, "in_order": bool},
     "workers": [snapshot | None, ...],     # per worker: streambuf._iteration snapshot
     "next_worker": k,                      # in-order: the worker whose batch is next
     "complete": bool,                      # every worker delivered its whole stream
     "before": progress | None,             # carried over from an elastic resume
     "digest": "..."}                       # of the fields above but names (digest())

``check_loadable(pipe, state)`` validates a state completely before anything uses it
(``streambuf._state_schema``: shape, types, ranges, each fault a ``ValueError`` naming
the field's path), then the pipeline (``shape``, seed) and the shard list
(``streambuf._identity.remap``: the same list, or one that was reordered, moved,
re-signed or extended; removed, replaced or ambiguous shards are refused by name).

``worker_plan`` decides how the next iteration resumes:

* ``complete``: the next iteration is the *next* epoch, from its start;
* this rank's own state, same world size and workers, the same shard list and the same
  source lanes (``lanes=``, ``order=``: each lane's cursor is restored) (alone, or in
  the list of all ranks' states): each worker resumes its own snapshot (``mode="exact"``): the
  remainder is identical to the uninterrupted run's with ``in_order=True``, and exactly
  once in any case;
* otherwise (``mode="elastic"``, also when the shard list was reordered or extended, or
  the source's ``lanes=``/``order=`` changed):
  the states of *all* old ranks are needed; what they delivered becomes a
  ``streambuf._elastic.Progress`` (its shard indices mapped to the new list) and every
  new slot reads its new share of what is left: every remaining sample exactly once
  (appended shards whole), order re-derived.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._elastic import Progress
from ._identity import remap, state_names
from ._state_schema import validate
from .sharding import assign, shard_order
from .stages import Shuffle, reordered_then_grouped, stateful_then_reordered

if TYPE_CHECKING:
    from ._contracts import PipelineView, WorkerContext
    from ._iteration import Iteration

__all__ = [
    "check_loadable",
    "check_set_epoch",
    "next_epoch",
    "pipeline_state",
    "plan_pipeline",
    "run_state",
    "worker_plan",
]

VERSION = 1
KIND = "streambuf.state"


def shape(pipe: PipelineView) -> str:
    """What must not change between save and load (the state's ``fingerprint``): shard
    shuffling, equalize, the stages and what the Source adds (a mix's sources). The shard
    list is checked on its own, by identity (``streambuf._identity``), so that it may be
    reordered."""
    stages = ",".join(_stage_id(s) for s in pipe._stages)
    source = pipe._src.fingerprint()  # "" for a list of shards; a mix: its sources'
    sharding = pipe._sharding
    return f"{int(sharding.shuffle_shards)}|{sharding.equalize}|{stages}{source}"


def _stage_id(stage: Any) -> str:
    """A stage in ``shape``: its name, and a shuffle's own ``seed=`` when one is given
    (it decides the rest of the order as much as the pipeline's seed does); a user
    stage (``streambuf.Stage``) by its ``fingerprint()``: class and configuration."""
    if isinstance(stage, Shuffle) and stage.seed is not None:
        return f"{stage.name}:{stage.seed}"
    fingerprint = getattr(stage, "fingerprint", None)
    if callable(fingerprint):
        return str(fingerprint())
    return str(stage.name)


def stage_keys(pipe: PipelineView) -> tuple[str, ...]:
    """The stages whose state a snapshot holds: shuffles and user stages that own
    state."""
    return tuple(
        str(k)
        for k, s in enumerate(pipe._stages)
        if isinstance(s, Shuffle) or getattr(s, "owns_state", False)
    )


def fingerprint(pipe: PipelineView) -> str:
    """``shape`` plus the exact shard list (count and names): a mix's sources, which
    resume only as saved. Computed once per pipeline object."""
    digest = _DIGESTS.get(pipe)
    if digest is None:
        names = state_names(pipe)
        digest = hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16] if names else ""
        _DIGESTS[pipe] = digest
    return f"{pipe.num_shards()}{digest}|{shape(pipe)}"


def data_identity(pipe: PipelineView) -> str:
    """The data a pipeline reads and its order, without its stages: the shard count and
    names (``fingerprint``'s head) and what the Source adds (``Source.identity``: a
    sequence's items, e.g. ``token_files``' files and block counts; a mix's sources,
    each by its own). Ranks whose identities differ split the data differently
    (``checkpointing.check_ranks``)."""
    return fingerprint(pipe).split("|", 1)[0] + pipe._src.identity()


_DIGESTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_ITEMS = re.compile(r";items\[[^\]]*\]")  # a sequence of items' identity, in a shape
_HAS_DATA: weakref.WeakKeyDictionary[Any, dict[tuple[int, int, int], bool]] = (
    weakref.WeakKeyDictionary()
)


def _changed_sources(saved: str, head: str, fps: list[str]) -> list[int]:
    """The positions of a mix's sources (fingerprints ``fps``, in order) that the saved
    fingerprint does not have where they are: it lists them after ``head`` (``mix[stop;``),
    joined by ``,`` and closed by ``]``, so each one is read at its place, not searched
    for anywhere (a source of 8 unnamed shards is a substring of one of 18, and swapped
    sources are each found somewhere). A source not at its place is changed, and the
    next one is looked for after it. []: the saved mix is not read this way (another
    ``stop``, or no mix): the caller's general message."""
    at = saved.find(head)
    if at < 0:
        return []
    pos, changed = at + len(head), []
    for i, fp in enumerate(fps):
        end = "]" if i == len(fps) - 1 else ","
        if saved.startswith(fp + end, pos):
            pos += len(fp) + 1
            continue
        changed.append(i)
        if i + 1 < len(fps):  # the next source begins after a "," further on, if unchanged
            nxt = fps[i + 1] + ("]" if i + 2 == len(fps) else ",")
            found = saved.find("," + nxt, pos)
            if found >= 0:
                pos = found + 1
    return changed


def _slot_has_data(pipe: PipelineView, epoch: int, slot: int, slots: int) -> bool:
    known = _HAS_DATA.setdefault(pipe, {})
    key = (epoch, slot, slots)
    if key not in known:  # a state is taken per batch: compute the order once per epoch
        known[key] = pipe._src.has_data(pipe._sharding, epoch, slot, slots)
    return known[key]


def run_state(
    pipe: PipelineView,
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
    refused = pipe._src.state_refusal()
    if refused is not None:
        raise ValueError(refused)
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
        "fingerprint": shape(pipe),
        "names": state_names(pipe),
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


def with_digest(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its ``digest`` (none when a user stage's state has no stable
    form to hash: such a state loads unchecked, as before digests)."""
    d = digest(state)
    if d is not None:
        state["digest"] = d
    return state


_PLAIN = frozenset((int, float, str, bool, type(None)))  # exact types JSON keeps as they are


def _canonical(v: Any) -> Any:
    """``v`` as JSON would bring it back: dict keys as text, sorted; tuples as lists;
    what JSON cannot hold by its ``repr`` (a user stage's state). A list of plain
    scalars (exact types: cursors, pending positions, most of a state) is copied at once,
    the same output as element by element (the digest is most of ``state_dict()``)."""
    if isinstance(v, dict):
        return [[str(k), _canonical(x)] for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))]
    if isinstance(v, list | tuple):
        if _PLAIN.issuperset(map(type, v)):
            return list(v)
        out = []
        for x in v:  # (a pending position: two ints and a byte range)
            t = type(x)
            if t in _PLAIN:
                out.append(x)
            elif (t is list or t is tuple) and _PLAIN.issuperset(map(type, x)):
                out.append(list(x))
            else:
                out.append(_canonical(x))
        return out
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return repr(v)


def digest(state: dict[str, Any]) -> str | None:
    """A hash of what one rank's state says (every field but ``names``, the same on
    every rank, and the digest itself), stable through JSON and pickle round trips. A
    state whose fields came from several states (a checkpointer that keeps one copy of
    each leaf saved under one key by several ranks, as ``torch.distributed.checkpoint``
    does) or were edited no longer matches. None when the state cannot be hashed."""
    body = {k: v for k, v in state.items() if k not in ("names", "digest")}
    try:
        text = json.dumps(_canonical(body), separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pipeline_state(pipe: PipelineView, it: Iteration | None) -> dict[str, Any]:
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


def _check_one(pipe: PipelineView, state: Any, path: str) -> dict[str, Any]:
    if not isinstance(state, dict) or state.get("kind") != KIND:
        raise ValueError(
            "load_state_dict() needs a state from streambuf's state_dict() (a dict with "
            f"kind={KIND!r}); got {type(state).__name__}"
        )
    if state.get("version") != VERSION:
        raise ValueError(f"state version {state.get('version')!r}; this streambuf reads {VERSION}")
    validate(state, stage_keys=stage_keys(pipe), mix=pipe._src.state_kind == "mix", path=path)
    if state["seed"] != pipe.seed:
        raise ValueError(
            f"this state was saved by a pipeline with seed={state['seed']}, this one has "
            f"seed={pipe.seed}: the shard order and the shuffles would differ, so the "
            "saved positions mean other samples; resume with the same seed (or start the "
            "epoch without load_state_dict())"
        )
    saved_shape, now_shape = state["fingerprint"], shape(pipe)
    if saved_shape != now_shape and _ITEMS.sub("", saved_shape) == _ITEMS.sub("", now_shape):
        if saved_shape == _ITEMS.sub("", now_shape):  # saved before items had identities
            warnings.warn(
                "this state predates the identity of its items (token_files' files and "
                "their order): it loads, but that the files are listed as they were when "
                "it was saved cannot be checked",
                stacklevel=4,
            )
        else:
            raise ValueError(
                f"this state was saved over other items ({_ITEMS.findall(saved_shape)}, "
                f"this pipeline has {_ITEMS.findall(now_shape)}): a saved position is an "
                "item's number, which means the same item only in the same list; "
                "token_files numbers its blocks through its files in the order given, so "
                "list the same files in the saved order (a glob is sorted; sort a list "
                "you build)"
            )
    elif saved_shape != now_shape:
        sources = getattr(pipe._src, "pipelines", ())  # (a mix's)
        if sources:
            changed = _changed_sources(
                state["fingerprint"],
                f"mix[{getattr(pipe._src, 'stop', '')};",
                [fingerprint(source) for source in sources],
            )
            if changed:
                raise ValueError(
                    f"this state was saved by a mix whose source(s) {changed} differed from "
                    "this one's: a mix's sources resume only as saved (the same shards in "
                    "the same order, the same stages; a reordered or extended list is not "
                    "remapped inside a mix, as it is for a pipeline alone): restore them, "
                    "or start the epoch without load_state_dict()"
                )
        raise ValueError(
            "this state was saved by a different pipeline (stages, a shuffle's seed, shard "
            f"shuffling, equalize or mixed sources differ: saved {state['fingerprint']!r}, "
            f"this one {shape(pipe)!r}); resume with the same pipeline"
        )
    if "digest" in state and digest(state) not in (state["digest"], None):
        raise ValueError(
            f"{path} does not match its digest: a value in it was changed after "
            "state_dict() took it (every field is valid, so the digest cannot say which; "
            "resume from the state as saved), or it was assembled from several ranks' "
            "states: torch.distributed.checkpoint keeps one copy of a value that several "
            "ranks save under one key, leaf by leaf, so save "
            "streambuf.DistributedState(loader) instead of the loader (or one "
            "loader.state_dict() per rank, e.g. torch.save to a file per rank)"
        )
    return state


def check_loadable(pipe: PipelineView, state: Any) -> dict[str, Any]:
    """Validate a state or the states of all ranks of one run, completely (shape, types,
    ranges, pipeline, shard identities: ``ValueError`` naming the field or the shards);
    returns the plan input: ``{"epoch", "complete", "states", "remap"}`` where ``remap``
    is None (positions as saved) or the old -> new shard index list."""
    one = isinstance(state, dict)
    if not one and not isinstance(state, list | tuple):
        raise ValueError(
            "load_state_dict() needs a state from state_dict() or a list of the states of "
            f"all ranks; got {type(state).__name__}"
        )
    states = [state] if one else list(state)
    if not states:
        raise ValueError("load_state_dict() got no state")
    checked = [
        _check_one(pipe, s, "state" if one else f"states[{i}]") for i, s in enumerate(states)
    ]
    states = sorted(checked, key=lambda s: s["layout"]["rank"])
    head = states[0]
    for s in states[1:]:
        if (s["epoch"], s["layout"]["world_size"], s["layout"]["num_workers"]) != (
            head["epoch"],
            head["layout"]["world_size"],
            head["layout"]["num_workers"],
        ) or (s["shards"], s["names"]) != (head["shards"], head["names"]):
            raise ValueError(
                "these states come from different runs (epoch, layout or shards differ)"
            )
    ranks = [s["layout"]["rank"] for s in states]
    if not one and ranks != list(range(head["layout"]["world_size"])):
        raise ValueError(
            f"load_state_dict() got the states of ranks {ranks} of a world of "
            f"{head['layout']['world_size']}: pass all of them (one per old rank)"
        )
    complete = all(s["complete"] for s in states) if len(states) > 1 else head["complete"]
    unresumable = stateful_then_reordered(pipe._stages)
    if unresumable is not None and not complete:
        # (refused here, not when saved: a StatefulDataLoader or a node takes a state at
        # every batch or item, and iterating such a pipeline is fine)
        raise ValueError(
            f"{unresumable}; this state was saved mid-epoch and would resume the stage "
            "wrong (a state saved at an epoch's end loads: the stage starts afresh)"
        )
    regrouped = reordered_then_grouped(pipe._stages)
    if regrouped is not None and not complete and _holds_groups(states):
        raise ValueError(
            f"{regrouped}; this state was saved with such a group (a state saved at an "
            "epoch's end, or between groups, loads)"
        )
    return {
        "epoch": head["epoch"],
        "complete": complete,
        "states": states,
        "remap": remap(head["names"], head["shards"], pipe),
    }


def _holds_groups(value: Any) -> bool:
    """Whether a (validated) state names a partly delivered group anywhere."""
    if isinstance(value, dict):
        return bool(value.get("groups")) or any(_holds_groups(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_groups(v) for v in value)
    return False


def next_epoch(plan: dict[str, Any]) -> int:
    """The epoch the next iteration runs under a loaded plan."""
    return int(plan["epoch"]) + 1 if plan["complete"] else int(plan["epoch"])


def check_set_epoch(plan: dict[str, Any], epoch: int) -> None:
    """``set_epoch(epoch)`` after ``load_state_dict``: the epoch the state resumes is
    kept (a training loop calls ``set_epoch`` at the top of every epoch); any other
    epoch would silently drop the loaded state or run the wrong epoch: ``ValueError``."""
    want = next_epoch(plan)
    if epoch == want:
        return
    saved = int(plan["epoch"])
    if plan["complete"]:
        why = (
            f"the loaded state is the end of epoch {saved} (complete), so the next "
            f"iteration is epoch {want}"
        )
    else:
        why = (
            f"the loaded state is in the middle of epoch {saved}, so the next iteration finishes it"
        )
    raise ValueError(
        f"set_epoch({epoch}) after load_state_dict(): {why}; call set_epoch({want}) (or "
        "not at all) to resume, or build the loader again without load_state_dict() to "
        f"start epoch {epoch} from its beginning"
    )


def worker_plan(
    pipe: PipelineView, plan: dict[str, Any], *, rank: int, world_size: int, num_workers: int
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
    mapping = plan.get("remap")
    lanes_changed = _lanes_changed(pipe, mine[0]) if mine else None
    if (
        mine
        and mapping is None
        and lanes_changed is None
        and (len(states) == 1 or len(states) == world_size)
    ):
        state = mine[0]  # this rank's own state, same layout, shards and lanes
        before = state.get("before")
        progress = Progress.from_data(before) if before is not None else None
        return plan["epoch"], "exact", state["workers"], progress, state["next_worker"]
    if len(states) == 1 and states[0]["layout"]["world_size"] != 1:
        raise ValueError(
            _one_rank_message(
                states[0]["layout"], rank, world_size, num_workers, mapping, lanes_changed
            )
        )
    refused = pipe._src.elastic_refusal()
    if refused is not None:
        raise ValueError(refused)
    progress = Progress.of_states(pipe, states)
    if mapping is not None:
        progress = progress.remapped(mapping)
    return plan["epoch"], "elastic", None, progress, 0


def _lanes_changed(pipe: PipelineView, state: dict[str, Any]) -> str | None:
    """Why ``state``'s lane cursors do not fit this pipeline's source (another
    ``lanes=`` or ``order=`` than saved), or None when they fit (or cannot be known: a
    mix, a reader that does not say). An exact resume restores each lane's cursor, so
    it needs the same lanes; a changed one resumes elastically (docs/design.md)."""
    now = pipe._src.lanes()
    if now is None:
        return None
    lanes, order = now
    layout = state["layout"]
    workers = max(1, layout["num_workers"])
    slots = layout["world_size"] * workers
    n = state["shards"]
    shard_list = shard_order(
        n, seed=state["seed"], epoch=state["epoch"], shuffle=pipe._sharding.shuffle_shards
    )
    for w, snap in enumerate(state["workers"]):
        cursor = snap.get("source") if snap is not None else None
        if not isinstance(cursor, dict) or "lanes" not in cursor:
            continue  # not opened yet: nothing to restore
        saved_order = "first_ready" if "seen" in cursor else "round_robin"
        if saved_order != order:
            return f"the state was saved with order={saved_order!r}, this source has {order!r}"
        a = assign(n, shard_list, layout["rank"] * workers + w, slots)
        want = max(1, min(lanes, len(a.shards)))
        if len(cursor["lanes"]) != want:
            return (
                f"worker {w}'s state has {len(cursor['lanes'])} lane cursors, this source "
                f"reads its shards with {want} (lanes={lanes})"
            )
    return None


def _one_rank_message(
    layout: dict[str, Any],
    rank: int,
    world_size: int,
    num_workers: int,
    mapping: Any,
    lanes_changed: str | None = None,
) -> str:
    saved = (
        f"this state was saved by rank {layout['rank']} of a run with "
        f"world_size={layout['world_size']}, num_workers={layout['num_workers']}"
    )
    here = (
        f"it is being loaded by rank {rank} of world_size={world_size}, num_workers={num_workers}"
    )
    everyone = (
        f"the list of the states of all its ranks (all {layout['world_size']} of them, e.g. "
        "gathered with torch.distributed.all_gather_object or one file per rank)"
    )
    if mapping is not None:
        return (
            f"{saved}, and the shard list changed since (reordered or extended), which "
            f"resumes by re-splitting what is left over every rank: pass {everyone}"
        )
    if lanes_changed is not None:
        return (
            f"{saved}, and the source's lanes changed since ({lanes_changed}), which "
            f"resumes by re-splitting what is left over every rank: pass {everyone}"
        )
    if (layout["world_size"], layout["num_workers"]) == (world_size, num_workers):
        return f"{saved}; {here}: pass this rank's own state (the one rank {rank} saved), or {everyone}"
    return f"{saved}; {here}: to resume at another layout, pass {everyone}"


def plan_pipeline(
    pipe: PipelineView, ctx: WorkerContext, plan: dict[str, Any] | None
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
