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


def plus_one(x: int) -> int:
    return x + 1


def not_cls_3(sample: dict) -> bool:
    return sample["label"] != 4  # cls 3, after plus_one


def tuple_keys(batch) -> list:  # type: ignore[no-untyped-def]
    """Sample identities of a collated (key, label, text) batch."""
    return [f"{k}:{int(v)}" for k, v in zip(batch[0], batch[1])]


def verbs_loader(*, spec, workers=2, shuffle=5):
    """The webdataset verbs in one pipeline: decode, rename, map_dict, select, to_tuple."""
    pipe = sb.shards(spec, lanes=2, seed=5, **FAST)
    if shuffle:
        pipe = pipe.shuffle(shuffle)
    pipe = (
        pipe.decode()
        .rename(label="cls", text="txt;text")
        .map_dict(label=plus_one)
        .select(not_cls_3)
        .to_tuple("__key__", "label", "text")
    )
    return sb.Loader(
        pipe.batch(4), num_workers=workers, max_batches=4, max_bytes="4MiB", timeout_s=60
    )
