"""Loader factories over tar shards for the checkpoint tests (module level: spawnable)."""

from __future__ import annotations

import streambuf as sb

FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=10)


def shard_loader(*, spec, workers=2, lanes=2, order="round_robin", shuffle=5, per_shard=20):
    pipe = sb.shards(spec, lanes=lanes, order=order, seed=5, samples_per_shard=per_shard, **FAST)
    if shuffle:
        pipe = pipe.shuffle(shuffle)
    return sb.Loader(
        pipe.batch(4),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="4MiB",
        timeout_s=60,
    )
