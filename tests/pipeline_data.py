"""Picklable datasets and functions for pipeline/loader tests (spawn needs module level)."""

from __future__ import annotations

import os
import time

import torch


def shard_samples(shard: int) -> list[int]:
    """Shard ``s`` holds samples ``s*100 .. s*100 + size(s) - 1``; sizes vary (3..7)."""
    return [shard * 100 + i for i in range(shard_size(shard))]


def shard_size(shard: int) -> int:
    return 3 + (shard * 7) % 5


def all_samples(n_shards: int) -> list[int]:
    return [x for s in range(n_shards) for x in shard_samples(s)]


def ids_of(batch) -> list[int]:
    return [int(x) for x in batch]


def sleepy(x: int) -> int:
    time.sleep(0.002)
    return x


def big_sample(i: int) -> torch.Tensor:
    """A 1 MiB sample whose first element is its id (touches the memory)."""
    t = torch.ones(1 << 18, dtype=torch.float32)
    t[0] = i
    return t


def fail_on_13(x: int) -> int:
    if x == 13:
        raise ValueError(f"cannot decode sample {x}")
    return x


def slow_in_worker_1(x: int) -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None and info.id == 1:
        time.sleep(0.02)
    return x


def pid_sample(x: int) -> tuple[int, int]:
    return (x, os.getpid())
