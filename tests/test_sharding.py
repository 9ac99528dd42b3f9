from __future__ import annotations

import itertools

import pytest

from streambuf import Pipeline
from streambuf import pipeline as pipeline_mod
from streambuf.sharding import assign, equal_batch_counts, shard_order
from tests.helpers import slot_batches
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


def rank_without_batches(n_shards, sizes, world, workers, drop_last, shuffle):
    """True if a rank's data makes no batch at all while another's does (then "pad" has
    nothing to repeat on that rank)."""
    order = shard_order(n_shards, seed=7, epoch=0, shuffle=shuffle)
    slots = world * workers
    least = 2 if drop_last else 1
    able = [
        any(
            assign(n_shards, order, s, slots).count(sizes) >= least
            for s in range(r * workers, (r + 1) * workers)
        )
        for r in range(world)
    ]
    return any(able) and not all(able)


def make_pipe(n_shards, *, shuffle, equalize, drop_last=False):
    sizes = [shard_size(s) for s in range(n_shards)]
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
    return pipe.batch(2, drop_last=drop_last)


def per_slot(pipe, world, workers):
    return [
        [
            [ids_of(b) for b in slot_batches(pipe, rank=r, world=world, worker=w, workers=workers)]
            for w in range(workers)
        ]
        for r in range(world)
    ]


def check_equalized(natural, got, mode, owned):
    """``got`` (equalized) against ``natural`` (the same pipeline without equalize), slot by
    slot. drop: every rank yields the smallest rank's batch count, each slot a prefix of its
    own stream. pad: the largest rank's count, each slot its whole stream, then batches
    repeated from its own samples ``owned[r][w]`` (sizes cycling through its batch sizes)."""
    totals = [sum(len(s) for s in rank) for rank in natural]
    target = min(totals) if mode == "drop" else max(totals)
    for r, (nat_rank, got_rank) in enumerate(zip(natural, got)):
        assert sum(len(s) for s in got_rank) == target, (r, mode)
        for w, (nat, eq) in enumerate(zip(nat_rank, got_rank)):
            if mode == "drop":
                assert eq == nat[: len(eq)], (r, w, "drop must keep a prefix")
                continue
            assert eq[: len(nat)] == nat, (r, w, "pad must deliver the whole stream first")
            extra = eq[len(nat) :]
            if extra:
                own = {x for b in owned[r][w] for x in b}
                assert [len(b) for b in extra] == [
                    len(nat[i % len(nat)]) for i in range(len(extra))
                ], (r, w)
                assert {x for b in extra for x in b} <= own, (r, w, "pads from its own data")


@pytest.mark.parametrize("n_shards", [1, 2, 5, 6, 12])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(
    ("equalize", "drop_last"),
    [(None, False), ("drop", False), ("drop", True), ("pad", False), ("pad", True)],
)
def test_exactly_once_matrix(n_shards, shuffle, equalize, drop_last):
    """num_workers {0,1,2,3} x world {1,2,3}: without equalize, the union is the dataset
    with no duplicates; with equalize, exact batch counts and contents (check_equalized)."""
    expected = sorted(all_samples(n_shards))
    sizes = [shard_size(s) for s in range(n_shards)]
    for workers, world in itertools.product([0, 1, 2, 3], [1, 2, 3]):
        w = max(workers, 1)
        natural = per_slot(
            make_pipe(n_shards, shuffle=shuffle, equalize=None, drop_last=drop_last), world, w
        )
        pipe = make_pipe(n_shards, shuffle=shuffle, equalize=equalize, drop_last=drop_last)
        if equalize is not None and rank_without_batches(
            n_shards, sizes, world, w, drop_last, shuffle
        ):
            # pad: nothing to repeat; drop: every rank would get no batch (it gave every
            # rank none, silently: the whole epoch dropped)
            match = "no samples to repeat" if equalize == "pad" else "whole epoch would be dropped"
            with pytest.raises(ValueError, match=match):
                slot_batches(pipe, rank=0, world=world, worker=0, workers=w)
            continue
        got = per_slot(pipe, world, w)
        flat = [x for rank in got for slot in rank for b in slot for x in b]
        if equalize is None:
            assert sorted(flat) == expected, (workers, world)
            continue
        owned = natural
        if drop_last:  # a repeated pass may drop other samples than the first one did
            owned = per_slot(make_pipe(n_shards, shuffle=shuffle, equalize=None), world, w)
        check_equalized(natural, got, equalize, owned)
        if equalize == "drop":
            assert len(flat) == len(set(flat))
            if drop_last:
                n_batches = sum(len(s) for rank in got for s in rank)
                assert len(flat) == 2 * n_batches
        else:
            assert set(flat) == set(expected) or drop_last


def test_equal_batch_counts_pad_needs_data():
    with pytest.raises(ValueError, match=r"no samples to repeat.*fewer ranks or workers"):
        equal_batch_counts(
            [1], [0], world_size=2, num_workers=1, batch_size=1, drop_last=False, mode="pad"
        )


def test_equal_batch_counts_drop_refuses_to_drop_the_whole_epoch():
    kw = dict(num_workers=1, batch_size=2, drop_last=False, mode="drop")
    # a rank without a sample: pad cannot help either
    with pytest.raises(ValueError, match=r"rank 2 has no batch.*fewer ranks.*'pad' needs"):
        equal_batch_counts([2], [0], world_size=3, **kw)
    # every rank has a sample, one has no full batch with drop_last: pad can help
    with pytest.raises(ValueError, match=r"whole epoch would be dropped.*use equalize='pad'"):
        equal_batch_counts([1, 3], [0, 1], world_size=2, **dict(kw, drop_last=True))
    # enough data for every rank: counts as before
    assert equal_batch_counts([2, 2], [0, 1], world_size=2, **kw) == [[1], [1]]


def test_equalize_needs_sizes_and_batch():
    with pytest.raises(ValueError, match="samples_per_shard"):  # at build, not in a worker
        Pipeline([0, 1], expand=shard_samples, equalize="drop")
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


# -- equalize with stages that change the number of samples --------------------------------
def _twice(x):
    return [x, x + 1000]


class _Windows3(__import__("streambuf").Stage):
    """Samples three at a time, one output each (n -> 1)."""

    holds_samples = True

    def iterate(self, samples, state):
        held = []
        for x in samples:
            held.append(x)
            if len(held) == 3:
                yield sum(held)
                held = []


def _counting(mode, tail):
    pipe = Pipeline(list(range(24)), equalize=mode, samples_per_shard=1, world_size=1, rank=0)
    return tail(pipe).batch(2, collate=list)


@pytest.mark.parametrize("mode", ["pad", "drop"])
@pytest.mark.parametrize(
    ("what", "tail"),
    [
        ("flatten", lambda p: p.map(_twice).flatten()),
        ("_Windows3", lambda p: p.compose(_Windows3())),
    ],
)
def test_equalize_refuses_a_stage_that_changes_the_sample_count(mode, what, tail):
    """equalize counts batches from the samples per shard: a stage making more samples
    than it was given (a flatten of two per sample: half of them were dropped) or fewer
    (a window of three: every sample was delivered three times) is refused, naming it."""
    with pytest.raises(ValueError, match=rf"equalize.*{what}.*(more|fewer)"):
        list(_counting(mode, tail))


def test_equalize_takes_a_group_flattened_back_to_its_samples():
    """A stage's group of n samples flattened back into n keeps the count."""
    from tests.test_custom_stage import Pairs

    got = list(_counting("drop", lambda p: p.compose(Pairs()).flatten()))
    assert sorted(x for b in got for x in b) == list(range(24))


def test_equalize_drop_refuses_to_repeat_what_a_filter_dropped():
    """'drop' keeps a prefix of each slot's stream: a filter that makes a slot short of
    its count is an error, not its stream read again (repeated samples)."""
    pipe = Pipeline(list(range(24)), equalize="drop", samples_per_shard=1, world_size=1, rank=0)
    with pytest.raises(ValueError, match=r"equalize='drop'.*stream ended after 6.*repeat"):
        list(pipe.filter(lambda x: x % 2).batch(2, collate=list))
    padded = Pipeline(list(range(24)), equalize="pad", samples_per_shard=1, world_size=1, rank=0)
    assert len(list(padded.filter(lambda x: x % 2).batch(2, collate=list))) == 12  # by design
