"""The batch arena (streambuf._arena): slots mapped once in every process; a batch you
keep keeps its slot and is never overwritten; dropping it frees the slot; fork and
spawn; a worker killed mid-batch leaves nothing in /dev/shm."""

from __future__ import annotations

import gc
import os
import signal
import time

import pytest
import torch

from streambuf import Loader, Pipeline, WorkerError
from tests.pipeline_data import quarter_mib, sleepy

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


def make(n=64, workers=2, mp_context=None, arena=True):
    pipe = Pipeline(list(range(n))).map(quarter_mib).batch(4)  # 1 MiB batches
    return Loader(
        pipe,
        num_workers=workers,
        max_batches=4,
        max_bytes=16 * MIB,
        adaptive=False,
        multiprocessing_context=mp_context,
        arena=arena,
        timeout_s=60,
    )


def in_arena(loader, t: torch.Tensor) -> bool:
    return (
        loader._arena is not None
        and loader._arena.contains(t.untyped_storage().data_ptr()) is not None
    )


@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_batches_come_from_the_arena_and_equal_the_plain_path(mp_context):
    loader = make(mp_context=mp_context)
    got = [b.clone() for b in loader]
    plain = [b for b in make(arena=False, mp_context=mp_context)]
    assert len(got) == 16 and all(torch.equal(a, b) for a, b in zip(got, plain))
    loader2 = make(mp_context=mp_context)
    it = iter(loader2)
    first = next(it)
    assert in_arena(loader2, first), "batches should be views of the arena"
    it.close()


def three_leaves(i: int) -> dict[str, torch.Tensor]:
    """A sample whose batch has three tensor leaves of different dtypes and sizes."""
    return {
        "x": torch.full((1000,), i, dtype=torch.int64),
        "mask": torch.full((7,), -i, dtype=torch.int32),
        "w": torch.full((3, 5), i / 2, dtype=torch.float16),
    }


def test_every_leaf_of_a_batch_is_its_own_part_of_the_slot():
    """A batch's leaves lie one after the other in one slot: each comes back as its own
    place (not the slot's start: the first leaf's bytes under another dtype)."""
    pipe = Pipeline(list(range(24))).map(three_leaves).batch(4)
    got = list(Loader(pipe, num_workers=2, max_batches=4, max_bytes=16 * MIB, timeout_s=60))
    assert len(got) == 6
    for b in got:
        ids = b["x"][:, 0]
        assert torch.equal(b["x"], ids[:, None].expand(4, 1000))
        assert torch.equal(b["mask"], (-ids).to(torch.int32)[:, None].expand(4, 7))
        assert torch.equal(b["w"], (ids / 2).to(torch.float16)[:, None, None].expand(4, 3, 5))


def labelled(i: int) -> dict[str, object]:
    return {"x": torch.full((16,), i), "label": i, "weight": i / 4, "even": i % 2 == 0}


def test_plain_numbers_travel_in_the_batch_slot():
    """int, float and bool fields of a sample are collated into the batch's arena slot
    (default_collate's dtypes and values), not each into a shared-memory segment of
    its own (a file and a descriptor per batch: half the rate of small batches)."""
    pipe = Pipeline(list(range(24))).map(labelled).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes=16 * MIB, timeout_s=60)
    n = arena = 0
    for b in loader:  # (each dropped before the next: a kept batch keeps its slot)
        n += 1
        ids = b["x"][:, 0]
        assert b["label"].dtype == torch.int64 and torch.equal(b["label"], ids)
        assert b["weight"].dtype == torch.float64 and torch.equal(b["weight"], ids / 4)
        assert b["even"].dtype == torch.bool and torch.equal(b["even"], ids % 2 == 0)
        slot = in_arena(loader, b["x"])  # (no free slot: the batch went the plain way)
        arena += slot
        for field in ("label", "weight", "even"):
            assert in_arena(loader, b[field]) == slot, f"{field} did not travel with x"
        del b, ids
    assert n == 6 and arena >= 2


def test_a_kept_batch_is_never_overwritten_and_dropping_it_frees_its_slot():
    loader = make(n=200)
    it = iter(loader)
    kept = next(it)  # batch 0 of worker 0
    expected = next(iter(make(n=200, arena=False))).clone()
    arena = loader._arena
    assert in_arena(loader, kept)
    rest = 0
    for b in it:  # many more batches than there are slots: they must not reuse kept's
        rest += 1
        del b
    assert rest == 49
    assert torch.equal(kept, expected), "a batch the user keeps was overwritten"
    view = kept[1:3]  # a view keeps the slot too
    del kept
    gc.collect()
    assert arena.in_use() >= 1
    assert torch.equal(view, expected[1:3])
    del view
    gc.collect()
    loader.close()
    assert arena.in_use() == 0


def test_workers_fall_back_when_the_user_keeps_every_slot():
    loader = make(n=120)
    kept = [b for b in loader]  # more batches than slots, all kept: no wait, no loss
    assert len(kept) == 30
    ids = sorted(int(x) for b in kept for x in b[:, 0])
    assert ids == list(range(120))
    assert sum(in_arena(loader, b) for b in kept) <= loader._arena.slots
    assert any(not in_arena(loader, b) for b in kept)


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.mark.serial
def test_worker_killed_mid_batch_leaves_no_shared_memory_behind():
    before = _shm_names()
    pipe = Pipeline(list(range(100_000))).map(sleepy).map(quarter_mib).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes=16 * MIB, timeout_s=10)
    it = iter(loader)
    next(it)
    os.kill(loader.worker_pids()[0], signal.SIGKILL)
    with pytest.raises(WorkerError):
        for _ in range(100_000):
            next(it)
    it.close()
    loader.close()
    del it, loader
    gc.collect()
    time.sleep(0.5)
    leaked = [n for n in _shm_names() - before if "streambuf" in n or n.startswith("torch_")]
    assert not leaked, leaked


def test_a_built_batch_that_is_not_sent_gives_its_slot_back():
    """A worker whose iteration was abandoned while its built batch waited for credits
    drops the batch: ``Arena.discard`` frees the slot its tensors live in (it stayed
    taken for good with persistent workers, which never reclaim)."""
    import multiprocessing as mp

    from streambuf._arena import Arena

    arena = Arena(num_workers=1, slots_per_worker=2, slot_bytes=1 << 16, ctx=mp.get_context("fork"))
    slot = arena.allocate(0, 4096)
    assert slot is not None
    rows = arena.tensor(slot, 0, torch.float32, (4, 8))
    arena.produced(slot)  # complete: on its way to the main process
    arena.release_unsent()
    assert arena.in_use() == 1  # a produced batch is not "unsent"
    arena.discard({"x": rows, "meta": ["a", 1], "other": torch.zeros(3)})
    assert arena.in_use() == 0
