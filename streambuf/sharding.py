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
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Assignment",
    "Equalize",
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
        return sum(progress.remaining(i, sizes[i], self.stride, self.offset) for i in self.shards)


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
    per_slot, whole = [], []
    for s in range(slots):
        a = assign(len(sizes), order, s, slots)
        n = a.count(sizes, progress)
        per_slot.append(n // batch_size if drop_last else math.ceil(n / batch_size))
        full = n if progress is None else a.count(sizes, None)
        whole.append(full // batch_size if drop_last else math.ceil(full / batch_size))
    counts = [per_slot[r * num_workers : (r + 1) * num_workers] for r in range(world_size)]
    totals = [sum(c) for c in counts]
    target = min(totals) if mode == "drop" else max(totals)
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
                    f"{', drop_last=True' if drop_last else ''}); use equalize='drop' or more "
                    "data"
                )
            for k in range(diff):  # spread pads round-robin over workers that have data
                row[able[k % len(able)]] += 1
    return counts
