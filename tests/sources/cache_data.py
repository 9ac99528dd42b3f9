"""Loader factories and rank runners for the cache tests (module level: spawnable)."""

from __future__ import annotations

import dataclasses
from typing import Any

import streambuf as sb
from streambuf.sources import shard_stats

FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=10)


def cache_loader(
    *, spec, cache_dir, cache_limit="1GiB", workers=2, lanes=2, shuffle=5, per_shard=20
):
    """A Loader over ``spec`` with the cache on (for the checkpoint harness)."""
    pipe = sb.shards(
        spec,
        lanes=lanes,
        seed=5,
        samples_per_shard=per_shard,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        **FAST,
    )
    if shuffle:
        pipe = pipe.shuffle(shuffle)
    return sb.Loader(
        pipe.batch(4),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="4MiB",
        timeout_s=60,
    )


def run_rank(rank: int, kw: dict[str, Any], barrier: Any, out: Any) -> None:
    """One simulated rank (2 DataLoader workers): epochs 0 and 1, with a barrier before
    each (as DDP's collectives keep ranks in step); puts (rank, keys per epoch, cache
    stats) on ``out``, or (rank, "error", repr)."""
    try:
        pipe = sb.shards(
            kw["spec"],
            lanes=2,
            seed=3,
            rank=rank,
            world_size=2,
            cache_dir=kw["cache_dir"],
            cache_limit=kw["cache_limit"],
            **FAST,
        ).batch(5)
        loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="4MiB", timeout_s=60)
        keys = []
        for epoch in (0, 1):
            barrier.wait(timeout=120)
            loader.set_epoch(epoch)
            keys.append([k for b in loader for k in b["__key__"]])
        loader.close()
        out.put((rank, keys, dataclasses.asdict(shard_stats(pipe).cache)))
    except BaseException as exc:
        out.put((rank, "error", repr(exc)))
        raise
