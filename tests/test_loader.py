from __future__ import annotations

import itertools
import os
import time

import pytest
import torch

from streambuf import Loader, Pipeline
from tests.helpers import merged_batches
from tests.pipeline_data import (
    all_samples,
    big_sample,
    fail_on_13,
    ids_of,
    shard_samples,
    shard_size,
    sleepy,
    slow_in_worker_1,
)

pytestmark = pytest.mark.timeout(120)


def make_pipe(n_shards, *, shuffle=False, equalize=None, rank=0, world=1, batch=2, seed=3):
    pipe = Pipeline(
        list(range(n_shards)),
        expand=shard_samples,
        shuffle_shards=shuffle,
        seed=seed,
        samples_per_shard=[shard_size(s) for s in range(n_shards)],
        equalize=equalize,
        rank=rank,
        world_size=world,
    )
    if shuffle:
        pipe = pipe.shuffle(5)
    return pipe.batch(batch)


@pytest.mark.parametrize("n_shards", [2, 7])
@pytest.mark.parametrize("equalize", [None, "drop", "pad"])
def test_real_workers_match_the_reference(n_shards, equalize):
    """Through real worker processes, every rank's batches equal the in-process reference
    (each worker's stream, merged round robin); the reference itself is checked for
    exactly-once and exact equalize counts in tests/test_sharding.py."""
    expected = sorted(all_samples(n_shards))
    for workers, world in itertools.product([0, 1, 3], [1, 2, 3]):
        got, counts = [], []
        for rank in range(world):
            pipe = make_pipe(n_shards, shuffle=True, equalize=equalize, rank=rank, world=world)
            loader = Loader(
                pipe, num_workers=workers, max_batches=max(workers, 1) * 2, max_bytes="1MiB"
            )
            batches = [ids_of(b) for b in loader]
            ref = merged_batches(pipe, rank=rank, world=world, workers=workers)
            assert batches == [ids_of(b) for b in ref], (workers, world, rank)
            counts.append(len(batches))
            got += [x for b in batches for x in b]
        if equalize is None:
            assert sorted(got) == expected, (workers, world)
        else:
            assert len(set(counts)) == 1, (workers, world, counts)


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_reach_workers(persistent):
    def run(seed):
        pipe = make_pipe(6, shuffle=True, seed=seed)
        loader = Loader(
            pipe, num_workers=2, max_batches=4, max_bytes="1MiB", persistent_workers=persistent
        )
        orders = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            orders.append([x for b in loader for x in ids_of(b)])
        return orders

    e0, e1 = run(seed=11)
    assert sorted(e0) == sorted(e1) == sorted(all_samples(6))
    assert e0 != e1
    assert run(seed=11) == [e0, e1]


@pytest.mark.parametrize("in_order", [True, False])
def test_byte_budget_accounting_big_batches(in_order):
    # 8 MiB batches (8 x 1 MiB samples), budget 24 MiB, slow consumer
    pipe = Pipeline(list(range(96))).map(big_sample, threads=2).batch(8)
    loader = Loader(pipe, num_workers=2, max_batches=8, max_bytes="24MiB", in_order=in_order)
    seen = []
    for b in loader:
        seen += [int(x) for x in b[:, 0]]
        time.sleep(0.02)
        assert loader.stats().budget.in_flight_bytes <= 24 << 20
    s = loader.stats().budget
    assert sorted(seen) == list(range(96))
    assert s.peak_in_flight_bytes <= 24 << 20
    assert 8 << 20 <= s.peak_batch_bytes_held <= s.peak_in_flight_bytes
    assert s.oversize == 0 and s.overshoot == 0
    assert s.in_flight_bytes == 0 and s.in_flight_batches == 0


@pytest.mark.parametrize("in_order", [True, False])
def test_deadlock_hunt_slow_worker_and_one_credit_each(in_order):
    pipe = Pipeline(list(range(60))).map(slow_in_worker_1).batch(3)
    loader = Loader(
        pipe, num_workers=2, max_batches=2, max_bytes=64, in_order=in_order, timeout_s=30
    )
    got = sorted(x for b in loader for x in ids_of(b))
    assert got == list(range(60))


@pytest.mark.parametrize("in_order", [True, False])
def test_deadlock_hunt_item_larger_than_budget(in_order):
    pipe = Pipeline(list(range(16))).map(big_sample).batch(4)  # 4 MiB batches
    loader = Loader(
        pipe, num_workers=2, max_batches=4, max_bytes="1MiB", in_order=in_order, timeout_s=30
    )
    got = sorted(int(x) for b in loader for x in b[:, 0])
    assert got == list(range(16))
    s = loader.stats().budget
    assert s.oversize >= 1
    assert max(s.per_worker_peak_bytes) <= 4 * (1 << 20) + 1024  # alone, never two at once


def test_stage_exception_in_worker_names_stage_and_sample():
    pipe = Pipeline(list(range(40))).map(fail_on_13).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=30)
    with pytest.raises(ValueError, match="cannot decode sample 13") as info:
        for _ in loader:
            pass
    notes = "\n".join(info.value.__notes__)
    assert "map(fail_on_13)" in notes and "on 13" in notes and "DataLoader worker" in notes


def test_break_out_stops_workers():
    pipe = Pipeline(list(range(10_000))).map(sleepy, threads=4).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB")
    it = iter(loader)
    next(it)
    workers = list(loader._dl_iter._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    it.close()  # what `break` does once the generator is dropped
    deadline = time.monotonic() + 5
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in workers)


def test_num_workers_zero_and_stats():
    pipe = Pipeline(list(range(10))).batch(5)
    loader = Loader(pipe, num_workers=0, max_batches=1, max_bytes="1MiB")
    assert [ids_of(b) for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    s = loader.stats()
    assert s.batches == 2 and s.budget is None and s.as_dict()["batches"] == 2


def test_bad_arguments():
    pipe = Pipeline([1, 2])
    with pytest.raises(ValueError, match="max_batches"):
        Loader(pipe, num_workers=4, max_batches=2, max_bytes="1MiB")
    with pytest.raises(TypeError, match="Pipeline"):
        Loader([1, 2], num_workers=0, max_batches=2, max_bytes="1MiB")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        Loader(pipe, num_workers=0, max_batches=2, max_bytes=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_device_prefetch_cuda():
    pipe = Pipeline(list(range(64))).batch(8)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", device="cuda")
    out = [b for b in loader]
    assert all(b.is_cuda for b in out)
    assert sorted(int(x) for b in out for x in b.cpu()) == list(range(64))


def test_device_cpu_passthrough():
    pipe = Pipeline(list(range(8))).batch(4)
    loader = Loader(pipe, num_workers=0, max_batches=1, max_bytes="1MiB", device="cpu")
    assert [ids_of(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("persistent", [False, True])
def test_spawn_workers_exactly_once_and_epochs(persistent):
    pipe = make_pipe(5, shuffle=True, seed=4)
    loader = Loader(
        pipe,
        num_workers=2,
        max_batches=4,
        max_bytes="1MiB",
        multiprocessing_context="spawn",
        persistent_workers=persistent,
        timeout_s=60,
    )
    orders = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        orders.append([x for b in loader for x in ids_of(b)])
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(all_samples(5))
    assert orders[0] != orders[1]
    fork = Loader(
        make_pipe(5, shuffle=True, seed=4), num_workers=2, max_batches=4, max_bytes="1MiB"
    )
    fork.set_epoch(1)
    assert [x for b in fork for x in ids_of(b)] == orders[1]  # same order under fork and spawn


def test_loader_does_not_modify_its_pipeline():
    import copy

    pipe = make_pipe(6, shuffle=True).map(sleepy, threads=2)
    counts = ("_epoch", "_meter")  # shared counters, written by every run by design
    before = {k: copy.copy(v) for k, v in pipe.__dict__.items() if k not in counts}
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB")
    loader.set_epoch(3)
    assert sorted(x for b in loader for x in ids_of(b)) == sorted(all_samples(6))
    after = {k: v for k, v in pipe.__dict__.items() if k not in counts}
    assert after.keys() == before.keys()
    assert all(after[k] == before[k] for k in before), "the Loader changed its pipeline"
    assert pipe.epoch == 0 and pipe.rank_world == (0, 1)
    # a second Loader on the same pipeline, in another world, is not affected by the first
    other = Loader(
        make_pipe(6, shuffle=True, rank=1, world=2), num_workers=0, max_batches=1, max_bytes="1MiB"
    )
    assert len([b for b in other]) < len([b for b in loader])


def _long_read_unless_worker_0(i: int) -> int:
    """Worker 0 fails on its first item; the others are inside a 20 s read."""
    info = torch.utils.data.get_worker_info()
    if info is not None and info.id == 0:
        raise ValueError(f"cannot decode sample {i}")
    time.sleep(20)
    return i


class _QuickThenLong:
    """While ``flag`` exists, items past the 8th are a 20 s read each."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __call__(self, i: int) -> int:
        if i >= 8 and os.path.exists(self.flag):
            time.sleep(20)
        return i


def test_a_stage_error_reaches_the_loop_without_waiting_for_busy_workers():
    """torch's shutdown waits 5 s for each worker still inside an item: with two of three
    workers in a long read the error reached the loop 10-15 s after it was raised. An
    iteration left early without persistent workers ends them at once."""
    pipe = Pipeline(list(range(30))).map(_long_read_unless_worker_0).batch(1)
    loader = Loader(pipe, num_workers=3, max_batches=3, max_bytes="1MiB", timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="cannot decode sample"):
        list(loader)
    assert time.monotonic() - t0 < 8.0


def test_a_break_returns_without_waiting_for_busy_workers(tmp_path):
    flag = tmp_path / "slow"
    flag.touch()
    pipe = Pipeline(list(range(40))).map(_QuickThenLong(str(flag))).batch(2)
    loader = Loader(pipe, num_workers=2, max_batches=2, max_bytes="1MiB", timeout_s=60)
    it = iter(loader)
    next(it)
    time.sleep(0.5)  # the workers are inside their long reads now
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 4.0
    # the next epoch runs whole on fresh workers and a fresh budget
    flag.unlink()
    assert sorted(x for b in loader for x in b.tolist()) == list(range(40))
    assert loader.stats().budget.in_flight_bytes == 0


def test_a_plan_a_worker_cannot_run_comes_through_streambufs_error_path():
    """An error building a worker's iteration (here equalize='pad' with a rank that has
    no sample to repeat) keeps its type and message and gets the worker's note, like an
    error in a stage (it came as torch's "Caught ValueError in DataLoader worker process
    0" wrapper, the worker's traceback inside the message)."""
    loader = Loader(
        make_pipe(1, equalize="pad", rank=2, world=3),
        num_workers=2,
        max_batches=2,
        max_bytes="1MiB",
        timeout_s=60,
    )
    with pytest.raises(ValueError, match=r"^equalize='pad': rank \d has no samples") as info:
        list(loader)
    assert "Caught ValueError" not in str(info.value)
    assert any("DataLoader worker" in n for n in getattr(info.value, "__notes__", []))
