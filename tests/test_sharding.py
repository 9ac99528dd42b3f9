from __future__ import annotations

import itertools

import pytest

from streambuf import Pipeline
from streambuf import pipeline as pipeline_mod
from streambuf.sharding import assign, equal_batch_counts, shard_order
from tests.pipeline_data import all_samples, ids_of, shard_samples, shard_size

pytestmark = pytest.mark.timeout(60)


def test_assign_covers_every_sample_once():
    for n_shards, slots in itertools.product(range(0, 8), range(1, 10)):
        sizes = [shard_size(s) for s in range(n_shards)]
        order = shard_order(n_shards, seed=1, epoch=2, shuffle=True)
        seen = []
        for slot in range(slots):
            a = assign(n_shards, order, slot, slots)
            for s in a.shards:
                seen += [(s, i) for i in range(a.offset, sizes[s], a.stride)]
        assert sorted(seen) == [(s, i) for s in range(n_shards) for i in range(sizes[s])]


def test_shard_order_is_seeded_by_seed_and_epoch():
    a = shard_order(50, seed=0, epoch=0, shuffle=True)
    assert a == shard_order(50, seed=0, epoch=0, shuffle=True)
    assert a != shard_order(50, seed=0, epoch=1, shuffle=True)
    assert a != shard_order(50, seed=1, epoch=0, shuffle=True)
    assert sorted(a) == list(range(50))
    assert shard_order(5, seed=0, epoch=3, shuffle=False) == [0, 1, 2, 3, 4]


def run_slot(pipe: Pipeline, rank: int, world: int, worker: int, workers: int, monkeypatch):
    monkeypatch.setattr(pipeline_mod, "current_worker", lambda: (worker, workers))
    p = Pipeline.__new__(Pipeline)
    p.__dict__.update(pipe.__dict__)
    p._rank_world = (rank, world)
    return [ids_of(b) for b in p]


def rank_without_data(n_shards, sizes, world, workers):
    order = list(range(n_shards))
    slots = world * workers
    for r in range(world):
        slots_r = range(r * workers, (r + 1) * workers)
        if all(assign(n_shards, order, s, slots).count(sizes) == 0 for s in slots_r):
            return True
    return False


@pytest.mark.parametrize("n_shards", [1, 2, 5, 6, 12])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("equalize", [None, "drop", "pad"])
def test_exactly_once_matrix(n_shards, shuffle, equalize, monkeypatch):
    """num_workers {0,1,2,3} x world {1,2,3}: union is the dataset, no duplicates;
    with equalize every rank yields the same number of batches."""
    expected = sorted(all_samples(n_shards))
    sizes = [shard_size(s) for s in range(n_shards)]
    for workers, world in itertools.product([0, 1, 2, 3], [1, 2, 3]):
        w = max(workers, 1)
        pipe = Pipeline(
            list(range(n_shards)),
            expand=shard_samples,
            shuffle_shards=shuffle,
            seed=7,
            samples_per_shard=sizes,
            equalize=equalize,
        )
        if shuffle:
            pipe = pipe.shuffle(4)
        pipe = pipe.batch(2)
        if equalize == "pad" and rank_without_data(n_shards, sizes, world, w):
            with pytest.raises(ValueError, match="no samples to repeat"):
                run_slot(pipe, 0, world, 0, w, monkeypatch)
            continue
        got: list[int] = []
        per_rank = []
        for rank in range(world):
            batches = [
                b
                for worker in range(w)
                for b in run_slot(pipe, rank, world, worker, w, monkeypatch)
            ]
            per_rank.append(len(batches))
            got += [x for b in batches for x in b]
        if equalize is None:
            assert sorted(got) == expected, (workers, world)
        else:
            assert len(set(per_rank)) == 1, (workers, world, per_rank)
            if equalize == "drop":
                assert len(got) == len(set(got)) and set(got) <= set(expected)
            else:
                assert set(got) == set(expected)


def test_equal_batch_counts_pad_needs_data():
    with pytest.raises(ValueError, match="no samples to repeat"):
        equal_batch_counts(
            [1], [0], world_size=2, num_workers=1, batch_size=1, drop_last=False, mode="pad"
        )


def test_equalize_needs_sizes_and_batch():
    pipe = Pipeline([0, 1], expand=shard_samples, equalize="drop").batch(2)
    with pytest.raises(ValueError, match="samples_per_shard"):
        list(pipe)
    with pytest.raises(ValueError, match="batch"):
        list(Pipeline([0, 1], equalize="drop"))


def test_stream_source_is_split_by_stride(monkeypatch):
    def gen():
        yield from range(10)

    got = []
    for worker in range(3):
        monkeypatch.setattr(pipeline_mod, "current_worker", lambda w=worker: (w, 3))
        got += list(Pipeline(gen(), rank=0, world_size=1))
    assert sorted(got) == list(range(10))


def test_fluent_methods_return_new_pipelines():
    base = Pipeline(list(range(10)))
    mapped = base.map(str)
    assert list(base) == list(range(10))
    assert list(mapped) == [str(i) for i in range(10)]
    with pytest.raises(ValueError, match=r"one \.batch"):
        base.batch(2).batch(3)
    with pytest.raises(ValueError, match="equalize"):
        Pipeline([1], equalize="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank"):
        Pipeline([1], rank=1)


class EpochFn:
    def __init__(self) -> None:
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, x):
        return (self.epoch, x)


def test_stage_set_epoch_and_flatten():
    fn = EpochFn()
    pipe = Pipeline([[1, 2], [3]]).flatten().map(fn)
    pipe.set_epoch(3)
    assert list(pipe) == [(3, 1), (3, 2), (3, 3)]
