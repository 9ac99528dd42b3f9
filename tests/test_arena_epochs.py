"""Arena lifetimes across epochs: a batch the user keeps from epoch 0 keeps its slot
through ``set_epoch(1)`` and a whole epoch 1 (shuffled, so epoch 1 writes other content
into the arena than epoch 0 did: an overwrite shows), with workers restarted (fork,
spawn) or persistent. ``tests/test_arena.py`` keeps batches within one epoch only."""

from __future__ import annotations

import gc

import pytest
import torch

from streambuf import Loader, Pipeline
from tests.pipeline_data import quarter_mib

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
N = 48  # 12 batches of 4 x 256 KiB (1 MiB) per epoch, over 2 workers


def make(*, mp_context: str, persistent: bool) -> Loader:
    pipe = Pipeline(list(range(N)), shuffle_shards=True, seed=5).map(quarter_mib).batch(4)
    return Loader(
        pipe,
        num_workers=2,
        max_batches=4,
        max_bytes=16 * MIB,  # slots of 4 MiB: every 1 MiB batch can be built in the arena
        adaptive=False,
        multiprocessing_context=mp_context,
        persistent_workers=persistent,
        timeout_s=60,
    )


def in_arena(loader: Loader, t: torch.Tensor) -> bool:
    arena = loader._arena
    return arena is not None and arena.contains(t.untyped_storage().data_ptr()) is not None


def ids(batch: torch.Tensor) -> list[int]:
    return [int(x) for x in batch[:, 0]]


@pytest.mark.parametrize(
    ("mp_context", "persistent"),
    [("fork", False), ("spawn", False), ("fork", True), ("spawn", True)],
    ids=["fork", "spawn", "fork-persistent", "spawn-persistent"],
)
def test_a_batch_kept_from_epoch_0_survives_epoch_1(mp_context, persistent):
    loader = make(mp_context=mp_context, persistent=persistent)
    assert loader._make_arena() is not None  # slots >= 64 KiB: the arena is in use
    try:
        loader.set_epoch(0)
        kept: list[torch.Tensor] = []
        copies: list[torch.Tensor] = []
        order0 = []
        for i, batch in enumerate(loader):
            order0.append(ids(batch))
            if i < 2:  # the first batch of each worker: slots epoch 1 would reuse first
                assert in_arena(loader, batch), "the kept batch must be an arena view"
                kept.append(batch)
                copies.append(batch.clone())
            del batch
        assert len(order0) == N // 4
        loader.set_epoch(1)
        order1 = []
        arena_batches = 0
        for batch in loader:
            order1.append(ids(batch))
            arena_batches += in_arena(loader, batch)
            del batch
        gc.collect()
        assert sorted(i for b in order1 for i in b) == list(range(N))
        assert order1 != order0, "epoch 1 must differ from epoch 0 (else an overwrite hides)"
        assert arena_batches > 0, "epoch 1 must have used the arena too"
        same = [torch.equal(k, c) for k, c in zip(kept, copies)]
        assert all(same), f"batches kept from epoch 0 were overwritten in epoch 1: {same}"
        arena = loader._arena
        assert arena.in_use() >= len(kept)  # the kept batches still hold their slots
    finally:
        loader.close()
    del kept
    gc.collect()
    assert arena.in_use() == 0
