"""``DistributedState``: a ``Loader``'s state as one value that every rank shares, for
``torch.distributed.checkpoint`` (DCP) and other checkpoints saved once for all ranks.

Why not ``dcp.save({"loader": loader})``: ``Loader.state_dict()`` is *this rank's* state,
different on every rank, and DCP treats a non-tensor value saved under one key by several
ranks as replicated: it keeps one copy of each leaf, picked leaf by leaf, so every rank
would load a state assembled from several ranks' (samples lost and repeated). Streambuf
refuses such a state when it can tell (``_state``: each state carries a digest of its
content), and this wrapper avoids it:

* ``state_dict()`` gathers every rank's ``Loader.state_dict()`` (``all_gather_object``: a
  collective, so every rank calls it, as ``dcp.save`` and ``dcp.load`` do) and returns
  ``{"streambuf_states": <JSON text of the list>}``: one value, the same on every rank.
* ``load_state_dict()`` hands the list to ``Loader.load_state_dict``: at the same world
  size and ``num_workers`` each rank resumes its own state exactly; at another, every
  remaining sample of the epoch is delivered once over the new ranks (elastic).

Without an initialised process group (one process, or loading a multi-rank checkpoint
in a single process) the list is this process's state alone.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loader import Loader

__all__ = ["DistributedState", "check_ranks"]

KEY = "streambuf_states"


def _agreement(loader: Loader) -> dict[str, Any]:
    """What decides each rank's share, which every rank must agree on for the shares to
    cover the data once: the shard list (count, and names and order where the shards
    are named), the seed where it orders the shards (``shuffle_shards``), ``equalize``
    and its counts, and ``num_workers`` (the slots). Not the stages, the seed of a
    pipeline that does not shuffle its shards, nor ``in_order``: a rank may configure
    those for itself (a device, a per-rank augmentation seed) without moving a sample."""
    from ._state import data_identity

    pipe = loader.pipeline
    sharding = pipe._sharding
    return {
        "shard list": data_identity(pipe),
        "seed (shuffle_shards)": pipe.seed if sharding.shuffle_shards else None,
        "equalize": [sharding.equalize, sharding.samples_per_shard],
        "num_workers": loader.num_workers,
    }


def _disagreement(agreements: list[dict[str, Any]]) -> str | None:
    """The fields on which the ranks' agreements differ, by rank, or None."""
    head = agreements[0]
    lines = []
    for key in head:
        values = [a.get(key) for a in agreements]
        if any(v != values[0] for v in values):
            by_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            lines.append(f"{key} ({by_rank})")
    if not lines:
        return None
    return (
        "the ranks' loaders disagree on " + "; ".join(lines) + ": each rank computes its "
        "share of the shards from its own values, so samples are lost and repeated (and "
        "ranks may run different batch counts); give every rank the same shard list in the "
        "same order (sort a listing; list it once and share it), the same seed when "
        "shuffle_shards=True, the same equalize and the same num_workers "
        "(num_workers='auto' follows each rank's CPU affinity: pin a number)"
    )


def check_ranks(loader: Loader, *, group: Any = None) -> None:
    """Raise ``ValueError`` on every rank if the ranks' loaders disagree on what splits
    the data between them (the shard list and its order, the seed of a shard shuffle,
    ``equalize``, ``num_workers``): such ranks lose and repeat samples without any other
    sign. A collective over ``group`` (every rank calls it: once, after building the
    loader, before the first epoch; with NCCL, set the CUDA device first, as for any
    ``all_gather_object``); without a process group it does nothing. ``DistributedState``
    checks the same at every save."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, _agreement(loader), group=group)
    problem = _disagreement(out)
    if problem is not None:
        raise ValueError(problem)


def _gather(state: dict[str, Any], group: Any, agreement: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``state`` (this one alone without a process group), one per data
    rank: ranks that hold the same data rank (tensor or pipeline parallelism within a
    data-parallel replica) gave the same state; the first of each is kept."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [state]
    if dist.get_world_size(group) == 1:
        return [state]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, (state, agreement), group=group)
    problem = _disagreement([a for _, a in out])
    if problem is not None:
        raise ValueError(problem)
    seen: dict[Any, dict[str, Any]] = {}
    for s, _ in out:  # (their pending lists may differ with thread timing: either is exact)
        layout = s.get("layout") if isinstance(s, dict) else None
        seen.setdefault(layout.get("rank") if isinstance(layout, dict) else id(s), s)
    return list(seen.values())


class DistributedState:
    """Wraps ``loader`` for ``torch.distributed.checkpoint`` (see the module docstring).

    Example::

        import torch.distributed.checkpoint as dcp
        dcp.save({"model": model_state, "loader": sb.DistributedState(loader)},
                 checkpoint_id=path)
        ...
        dcp.load({"model": model_state, "loader": sb.DistributedState(loader)},
                 checkpoint_id=path)   # then iterate the loader: it resumes

    The wrapper holds no state of its own: make one whenever it is needed.
    ``group``: gather over this process group (the data-parallel one under tensor or
    pipeline parallelism; ranks holding the same data rank give one state, kept once).
    """

    def __init__(self, loader: Loader, *, group: Any = None) -> None:
        self.loader = loader
        self.group = group  # the process group to gather over (None: the default group)

    def state_dict(self) -> dict[str, Any]:
        """All ranks' states as JSON text. A collective over ``group``: every rank of it
        calls it (``dcp.save``/``dcp.load`` do; called on one rank alone, it waits for
        the others forever, as any collective does). With NCCL, set the CUDA device first
        (``all_gather_object``'s rule)."""
        states = _gather(self.loader.state_dict(), self.group, _agreement(self.loader))
        return {KEY: json.dumps(states, separators=(",", ":"))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume ``loader`` from all ranks' states (see ``Loader.load_state_dict``).

        Raises:
            ValueError: not a ``DistributedState`` value, or what ``Loader.load_state_dict``
                refuses.
        """
        text = state_dict.get(KEY) if isinstance(state_dict, dict) else None
        if not isinstance(text, str):
            raise ValueError(
                f"DistributedState.load_state_dict() needs the dict its state_dict() made "
                f"(a {KEY!r} string); got {type(state_dict).__name__}"
                + (f" with keys {sorted(state_dict)[:5]}" if isinstance(state_dict, dict) else "")
            )
        try:
            states = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"DistributedState: {KEY!r} is not the JSON it wrote: {exc}") from None
        self.loader.load_state_dict(states)
