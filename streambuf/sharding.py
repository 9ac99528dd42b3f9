"""Who reads what: epoch-seeded shard order, rank x worker split, equal batch counts.

A *slot* is one (rank, worker) pair: ``slot = rank * num_workers + worker``, ``slots =
world_size * num_workers``. Rules (each checked by tests; docs/design.md invariants 3 and 5):

* **Order.** With ``shuffle_shards`` the shard order is a permutation seeded by
  ``(seed, epoch)`` only, identical on every rank and worker.
* **Split, enough shards** (``n_shards >= slots``): slot ``s`` reads shards
  ``order[s::slots]``, each whole. Every shard is read by exactly one slot.
* **Split, fewer shards than slots**: slot ``s`` reads shard ``order[s % n_shards]`` and
  keeps the samples whose index ``i`` within that shard has ``i % m == s // n_shards``,
  where ``m`` is the number of slots sharing that shard. Every sample is still delivered
  exactly once; the shard's bytes are read ``m`` times (add shards to avoid that).
* **Equal batch counts** (``equalize``): with known sample counts, each slot's batch
  count is computed up front; ``"drop"`` trims every rank to the smallest rank's count,
  ``"pad"`` tops every rank up to the largest by repeating samples from the start of the
  slot's own stream. Trims and pads are spread over a rank's workers deterministically.

``Sharding`` is the one definition of the sharding arguments that ``Pipeline``,
``shards()`` and ``video.clips()`` take (shard shuffling, seed, samples per shard,
equalize, rank, world size), validated once when it is built.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ._units import check_bool, check_choice, check_int

__all__ = [
    "Assignment",
    "Equalize",
    "Sharding",
    "assign",
    "current_rank_world",
    "current_worker",
    "equal_batch_counts",
    "shard_order",
]

Equalize = Literal["drop", "pad"]


@dataclass(frozen=True)
class Assignment:
    """What one slot reads: shard indices, and (stride, offset) for sample-level splits."""

    shards: tuple[int, ...]
    stride: int = 1
    offset: int = 0

    def count(self, sizes: Sequence[int], progress: Any = None) -> int:
        """Samples this slot delivers, given per-shard sample counts (and, resuming at a
        new layout, minus those a ``streambuf._elastic.Progress`` says are done)."""
        if progress is None:
            return sum(len(range(self.offset, sizes[i], self.stride)) for i in self.shards)
        left = sum(progress.remaining(i, sizes[i], self.stride, self.offset) for i in self.shards)
        left += progress.routed(self.shards, self.stride, self.offset)
        # a partly delivered sample owes only its children not delivered yet
        return left - progress.delivered_children(self.shards, self.stride, self.offset)


@dataclass(frozen=True)
class Sharding:
    """Who reads what, as given to ``Pipeline`` (whose keyword arguments these fields
    are), ``shards()`` or ``video.clips()``; checked here, once, when it is built.

    Attributes:
        shuffle_shards: permute the shard order each epoch, seeded by (seed, epoch).
        seed: the base seed of the shard order and the shuffle stages.
        samples_per_shard: sample count of each shard (an int for all, or one per
            shard; kept as a tuple), for ``equalize``.
        equalize: None, ``"drop"`` or ``"pad"``: the same batch count on every rank.
        rank, world_size: both or neither; None: read from ``torch.distributed`` when an
            iteration starts.
        arg_names: how the entry point names a field in its error messages
            (``video.clips()``: ``shuffle_videos``, ``clips_per_video``); not compared.
    """

    shuffle_shards: bool = False
    seed: int = 0
    samples_per_shard: int | tuple[int, ...] | None = None
    equalize: Equalize | None = None
    rank: int | None = None
    world_size: int | None = None
    arg_names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        def name(f: str) -> str:
            return self.arg_names.get(f, f)

        check_choice(self.equalize, name=name("equalize"), choices=(None, "drop", "pad"))
        if (self.rank is None) != (self.world_size is None):
            raise ValueError(f"give both {name('rank')}= and {name('world_size')}=, or neither")
        if self.rank is not None and self.world_size is not None:
            check_int(self.world_size, name=name("world_size"), minimum=1)
            check_int(self.rank, name=name("rank"), maximum=self.world_size - 1)
        check_bool(self.shuffle_shards, name=name("shuffle_shards"))
        check_int(self.seed, name=name("seed"), minimum=-(1 << 63))
        sps = self.samples_per_shard
        if sps is not None:
            what = name("samples_per_shard")
            if not isinstance(sps, int | Sequence) or isinstance(sps, str | bytes):
                raise TypeError(f"{what}={sps!r} must be an int or one int per shard")
            for c in [sps] if isinstance(sps, int) else sps:
                check_int(c, name=what)
            if not isinstance(sps, int):
                object.__setattr__(self, "samples_per_shard", tuple(sps))

    @classmethod
    def pick(cls, kwargs: Mapping[str, Any], **arg_names: str) -> Sharding:
        """Build from the entries of ``kwargs`` that are fields (an entry point's
        ``locals()``; others are ignored)."""
        names = {f.name for f in fields(cls)} - {"arg_names"}
        return cls(**{k: v for k, v in kwargs.items() if k in names}, arg_names=arg_names)

    @property
    def rank_world(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` as given, or None (read from ``torch.distributed``)."""
        if self.rank is None or self.world_size is None:
            return None
        return self.rank, self.world_size

    def order(self, n_shards: int, epoch: int) -> list[int]:
        """The shard order of ``epoch`` (``shard_order`` with this seed and shuffling)."""
        return shard_order(n_shards, seed=self.seed, epoch=epoch, shuffle=self.shuffle_shards)


def current_rank_world() -> tuple[int, int]:
    """(rank, world_size) from ``torch.distributed`` when initialised, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # a broken/partial dist setup: behave as a single process
        pass
    return 0, 1


def current_worker() -> tuple[int, int]:
    """(worker_id, num_workers) inside a DataLoader worker, else (0, 1)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def shard_order(n_shards: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The epoch's shard order: a permutation seeded by (seed, epoch), or identity."""
    order = list(range(n_shards))
    if shuffle:
        random.Random(hash_seed(seed, epoch)).shuffle(order)
    return order


def hash_seed(*parts: int) -> int:
    """A stable 64-bit seed from integers (Python's hash() of ints is stable too, but
    tuples of them are salted nowhere; this keeps it explicit and platform-independent)."""
    h = 0xCBF29CE484222325
    for p in parts:
        for byte in int(p).to_bytes(8, "little", signed=True):
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def assign(n_shards: int, order: Sequence[int], slot: int, slots: int) -> Assignment:
    """The shards (and sample stride/offset) that ``slot`` of ``slots`` reads."""
    if not 0 <= slot < slots:
        raise ValueError(f"slot={slot} out of range for slots={slots}")
    if n_shards == 0:
        return Assignment(())
    if n_shards >= slots:
        return Assignment(tuple(order[slot::slots]))
    j = slot % n_shards
    m = len(range(j, slots, n_shards))
    return Assignment((order[j],), stride=m, offset=slot // n_shards)


def equal_batch_counts(
    sizes: Sequence[int],
    order: Sequence[int],
    *,
    world_size: int,
    num_workers: int,
    batch_size: int,
    drop_last: bool,
    mode: Equalize,
    progress: Any = None,
) -> list[list[int]]:
    """Batches each (rank, worker) must yield so that every rank yields the same total.

    Returns ``counts[rank][worker]``.

    Raises:
        ValueError: "pad" with a rank that has no samples at all (nothing to repeat).
    """
    slots = world_size * num_workers
    per_slot, whole, samples = [], [], []
    for s in range(slots):
        a = assign(len(sizes), order, s, slots)
        n = a.count(sizes, progress)
        samples.append(n)
        per_slot.append(n // batch_size if drop_last else math.ceil(n / batch_size))
        full = n if progress is None else a.count(sizes, None)
        whole.append(full // batch_size if drop_last else math.ceil(full / batch_size))
    counts = [per_slot[r * num_workers : (r + 1) * num_workers] for r in range(world_size)]
    totals = [sum(c) for c in counts]
    target = min(totals) if mode == "drop" else max(totals)
    if mode == "drop" and target == 0 and progress is None and any(totals):
        empty = totals.index(0)
        raise ValueError(
            f"equalize='drop': rank {empty} has no batch, so every rank would get none and "
            f"the whole epoch would be dropped ({sum(sizes)} samples for {world_size} ranks "
            f"x {num_workers} workers, batch_size={batch_size}"
            f"{', drop_last=True' if drop_last else ''}); "
            + (
                "use equalize='pad', fewer ranks or workers, or more data"
                if all(
                    sum(samples[r * num_workers : (r + 1) * num_workers]) for r in range(world_size)
                )
                else "use fewer ranks or workers, or more data (equalize='pad' needs a "
                "sample on every rank to repeat)"
            )
        )
    for r, row in enumerate(counts):
        diff = target - totals[r]
        if diff < 0:  # trim from the workers with most batches, lowest id first
            for _ in range(-diff):
                w = max(range(num_workers), key=lambda i: (row[i], -i))
                row[w] -= 1
        elif diff > 0:
            # a worker can pad only if one pass over its data yields a batch (its whole
            # share: after an elastic resume it may have nothing left, but repeats it)
            able = [w for w in range(num_workers) if whole[r * num_workers + w] > 0]
            if not able:
                raise ValueError(
                    f"equalize='pad': rank {r} has no samples to repeat ({sum(sizes)} samples "
                    f"for {world_size} ranks x {num_workers} workers, batch_size={batch_size}"
                    f"{', drop_last=True' if drop_last else ''}); use fewer ranks or workers, "
                    "or more data (equalize='drop' would give every rank no batch)"
                )
            for k in range(diff):  # spread pads round-robin over workers that have data
                row[able[k % len(able)]] += 1
    return counts
