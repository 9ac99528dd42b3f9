"""Sources and functions shared by the streambuf.nodes tests (import as tests.nodes_data)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import torch
from torchdata.nodes import BaseNode, Batcher, IterableWrapper, SamplerWrapper

import streambuf as sb


class Counting(BaseNode[dict[str, int]]):
    """Yields ``{"i": i, "resets": r}`` for i < n, where r counts ``reset(None)`` calls:
    a node that resets its source once too often, or restores it wrongly, changes the
    output (``nexts`` counts ``next()`` calls, all epochs)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.i = 0
        self.resets = 0
        self.nexts = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        if initial_state is None:
            self.i = 0
            self.resets += 1
        else:
            self.i, self.resets = initial_state["i"], initial_state["resets"]

    def next(self) -> dict[str, int]:
        self.nexts += 1
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return {"i": self.i - 1, "resets": self.resets}

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i, "resets": self.resets}


class Jitter:
    """Sleep a random 0..max_s (GIL released), return the item: uneven thread timing."""

    def __init__(self, max_s: float = 0.002, seed: int = 0) -> None:
        self.max_s = max_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def __call__(self, x: Any) -> Any:
        with self.lock:
            delay = self.rng.random() * self.max_s
        time.sleep(delay)
        return x


def ids(item: Any) -> Any:
    """A comparable identity of an item (lists of dicts, ints, tensors)."""
    if isinstance(item, torch.Tensor):
        return item.tolist()
    if isinstance(item, list | tuple):
        return [ids(x) for x in item]
    if isinstance(item, dict):
        return {k: ids(v) for k, v in item.items()}
    return item


def epoch_sampler(n: int) -> SamplerWrapper:
    """A sampler whose order depends on the epoch (SamplerWrapper advances it per reset)."""
    ds = list(range(n))
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
    return SamplerWrapper(sampler)


def as_tensor(x: Any) -> torch.Tensor:
    return torch.tensor([x["i"], x["resets"]] if isinstance(x, dict) else [x])


def pipeline(n: int = 240) -> sb.Pipeline:
    """A shuffled, threaded, batched pipeline (its state has pending items and a shuffle
    buffer, not just a count)."""
    return (
        sb.Pipeline(list(range(n)), shuffle_shards=True, seed=5)
        .map(Jitter(0.001), threads=2)
        .shuffle(8, seed=1)
        .batch(6)
    )


# node factories for the save/load harness: (name, factory, ordered)
def counting_batched_mapper_prefetcher() -> BaseNode:
    node = Batcher(Counting(200), batch_size=6, drop_last=False)
    node = sb.nodes.ParallelMapper(node, Jitter(), threads=4, max_bytes="1MiB")
    return sb.nodes.Prefetcher(node, max_items=8, max_bytes="1MiB")


def counting_prefetcher() -> BaseNode:
    return sb.nodes.Prefetcher(Counting(120), max_items=8, max_bytes=4096)


def iterable_mapper() -> BaseNode:
    return sb.nodes.ParallelMapper(
        IterableWrapper(range(100)), Jitter(), threads=3, max_items=6, max_bytes=4096
    )


def sampler_mapper_tensors() -> BaseNode:
    # tensors of 8 bytes against 64 bytes: the byte bound, not the count, limits depth
    return sb.nodes.ParallelMapper(epoch_sampler(90), torch.tensor, threads=4, max_bytes=64)


def sampler_prefetcher() -> BaseNode:
    return sb.nodes.Prefetcher(epoch_sampler(90), max_items=4, max_bytes=1024)


def iterable_mapper_unordered() -> BaseNode:
    return sb.nodes.ParallelMapper(
        IterableWrapper(range(100)), Jitter(), threads=4, max_bytes=4096, in_order=False
    )


def counting_mapper_unordered_prefetcher() -> BaseNode:
    node = sb.nodes.ParallelMapper(
        Counting(100), Jitter(), threads=4, max_bytes=1 << 16, in_order=False
    )
    return sb.nodes.Prefetcher(node, max_items=3, max_bytes=1 << 16)


def pipeline_node() -> BaseNode:
    return sb.nodes.PipelineNode(pipeline())


def pipeline_node_in_streambuf_nodes() -> BaseNode:
    node = sb.nodes.ParallelMapper(
        sb.nodes.PipelineNode(pipeline()), ids, threads=3, max_bytes="1MiB"
    )
    return sb.nodes.Prefetcher(node, max_items=4, max_bytes="1MiB")


FACTORIES = {
    "counting-batcher-mapper-prefetcher": (counting_batched_mapper_prefetcher, True),
    "counting-prefetcher": (counting_prefetcher, True),
    "iterable-mapper": (iterable_mapper, True),
    "sampler-mapper-tensors": (sampler_mapper_tensors, True),
    "sampler-prefetcher": (sampler_prefetcher, True),
    "iterable-mapper-unordered": (iterable_mapper_unordered, False),
    "counting-mapper-unordered-prefetcher": (counting_mapper_unordered_prefetcher, False),
    "pipeline": (pipeline_node, True),
    "pipeline-in-streambuf-nodes": (pipeline_node_in_streambuf_nodes, True),
}
