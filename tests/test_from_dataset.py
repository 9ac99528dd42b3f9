"""Map-style datasets as pipelines (``Pipeline.from_dataset``, ``Pipeline(dataset)``):
each index ``0 .. len - 1`` read once per epoch over all ranks and workers, never one past
the end (the datasets here never raise ``IndexError``), through real Loaders with real
worker processes; exact and elastic resume; the errors for what is not a dataset.

Reads are counted in a log file that every ``__getitem__`` call appends its index to
(worker processes included)."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import streambuf as sb
from streambuf._dataset import DatasetItems
from tests.resume_harness import check_save_load, counted_once, resume_and_finish, save_after

pytestmark = pytest.mark.timeout(60)

N = 37  # not a multiple of any split or batch size here
BATCH = 4


class Counted(Dataset):
    """``n`` items; item ``i`` is ``i`` for ANY ``i`` (past the end too: it never raises
    ``IndexError``); each call appends ``i`` to ``log`` when one is given."""

    def __init__(self, n: int = N, log: str | None = None) -> None:
        self.n, self.log = n, log

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{int(i)}\n")
        return int(i)


def reads(log: Path) -> Counter[int]:
    """How often each index was read (``Counted``'s log)."""
    return Counter(int(x) for x in log.read_text().split()) if log.exists() else Counter()


def loader_of(pipe: sb.Pipeline, workers: int) -> sb.Loader:
    return sb.Loader(
        pipe.batch(BATCH),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="1MiB",
        timeout_s=30,
    )


def ids_of(batch: torch.Tensor) -> list[int]:
    return [int(x) for x in batch]


def run_capped(loader: sb.Loader, n: int = N) -> list[int]:
    """The indices a loader delivers, read up to a few batches past ``n`` items (a
    pipeline that read on forever fails the count instead of hanging the test)."""
    cap = -(-n // BATCH) + 2 * max(loader.num_workers, 1) + 2
    try:
        return [x for b in itertools.islice(loader, cap) for x in ids_of(b)]
    finally:
        loader.close()


def dataset_loader(*, workers=2, shuffle=True, threads=1, rank=None, world=None, n=N):
    """A Loader over ``from_dataset`` (module level: the resume harness builds it again)."""
    kw = {} if rank is None else {"rank": rank, "world_size": world}
    pipe = sb.Pipeline.from_dataset(Counted(n), shuffle=shuffle, seed=5, threads=threads, **kw)
    return loader_of(pipe, workers)


# -- each index read once ------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 4, "auto"])
@pytest.mark.parametrize("workers", [0, 2])
def test_from_dataset_reads_each_index_once_over_ranks_and_workers(tmp_path, workers, threads):
    log = tmp_path / "reads"
    per_rank = []
    for rank in range(2):
        ds = Counted(N, str(log))
        pipe = sb.Pipeline.from_dataset(ds, threads=threads, rank=rank, world_size=2)
        per_rank.append(run_capped(loader_of(pipe, workers)))
    assert not set(per_rank[0]) & set(per_rank[1]), "two ranks delivered the same index"
    counted_once(per_rank[0] + per_rank[1], range(N))
    assert reads(log) == Counter(range(N)), "an index was read twice, or one past the end"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pipeline_over_a_map_style_dataset_reads_each_index_once(tmp_path, workers):
    """``Pipeline(dataset)`` reads by index, not by iterating it in every worker: no
    index twice, none past the end (the dataset would answer any index)."""
    log = tmp_path / "reads"
    got = run_capped(loader_of(sb.Pipeline(Counted(N, str(log))), workers))
    counted_once(got, range(N))
    assert reads(log) == Counter(range(N))


def test_a_dataset_that_never_raises_index_error_ends_after_len_items():
    ds = Counted(N)
    for pipe in (
        sb.Pipeline(ds),
        sb.Pipeline.from_dataset(ds),
        sb.Pipeline.from_dataset(ds, threads=3),
    ):
        assert list(itertools.islice(pipe, N + 10)) == list(range(N))
    assert list(itertools.islice(sb.Pipeline(Counted(0)), 5)) == []


def test_the_dataset_view_checks_bounds_as_a_sequence_does():
    items = DatasetItems(Counted(5))
    assert len(items) == 5 and list(itertools.islice(items, 10)) == [0, 1, 2, 3, 4]
    assert items[-1] == 4 and items[-5] == 0 and items[1:4] == [1, 2, 3]
    assert items[::-2] == [4, 2, 0] and 3 in items and 5 not in items
    for bad in (5, 6, -6, 10**9):
        with pytest.raises(IndexError):
            items[bad]
    with pytest.raises(TypeError):
        items["1"]


def test_other_sources_are_read_as_before():
    """A list, a dict (its keys) and an IterableDataset are not read by index."""
    assert list(sb.Pipeline([3, 1, 2])) == [3, 1, 2]
    assert list(sb.Pipeline({"a": 1, "b": 2})) == ["a", "b"]
    assert list(sb.Pipeline(_Stream())) == [7, 8]
    # an object indexed by label, not position (a pandas.Series' shape): iterated
    assert list(sb.Pipeline(_ByLabel())) == ["first", "second"]


class _ByLabel:
    """``__len__`` and ``__getitem__`` by label (``x[0]`` is no item), and ``__iter__``."""

    data: ClassVar[dict[str, str]] = {"a": "first", "b": "second"}

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: str) -> str:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data.values())


class _Stream(IterableDataset):
    def __iter__(self):
        return iter([7, 8])


# -- threads and shuffling -----------------------------------------------------------------
class _Meet(Dataset):
    """Items 0 and 1 wait for each other: they can only be read on two threads at once."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=5)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i < 2:
            self.barrier.wait()  # BrokenBarrierError when read one at a time
        return i


def test_threads_read_items_concurrently_in_index_order():
    assert list(sb.Pipeline.from_dataset(_Meet(), threads=4)) == list(range(8))


def test_shuffle_permutes_the_indices_by_seed_and_epoch():
    """The order of ``shuffle=True`` is ``shuffle_shards`` over a list of as many items:
    a permutation seeded by (seed, epoch), another each epoch; without it, index order."""

    def order(pipe, epoch):
        pipe.set_epoch(epoch)
        return list(pipe)

    for threads in (1, 3):
        pipe = sb.Pipeline.from_dataset(Counted(N), shuffle=True, seed=9, threads=threads)
        ref = sb.Pipeline(list(range(N)), shuffle_shards=True, seed=9)
        e0, e1 = order(pipe, 0), order(pipe, 1)
        assert e0 == order(ref, 0) and e1 == order(ref, 1)
        assert sorted(e0) == list(range(N)) and e0 != list(range(N)) and e0 != e1
    assert list(sb.Pipeline.from_dataset(Counted(N), seed=9)) == list(range(N))


# -- resume --------------------------------------------------------------------------------
@pytest.mark.parametrize(("workers", "threads"), [(0, 1), (2, 1), (2, 4)])
def test_exact_resume_equals_the_uninterrupted_shuffled_run(workers, threads):
    """Stopped after k batches, resumed in a fresh Loader: before + after is the
    uninterrupted epoch (the shuffled order included), every index once, and the next
    epoch is the uninterrupted next epoch."""
    kw = {"workers": workers, "threads": threads}
    ref = check_save_load(dataset_loader, kw, [3], ids=ids_of)
    counted_once([x for b in ref[0] for x in b], range(N))
    assert [x for b in ref[0] for x in b] != list(range(N))  # shuffled


def test_elastic_resume_two_ranks_to_one_reads_every_index_once():
    delivered, states = [], []
    for rank in range(2):
        kw = {"workers": 2, "rank": rank, "world": 2, "threads": 2}
        first, state = save_after(dataset_loader, kw, 2, ids=ids_of)
        delivered += [x for b in first for x in b]
        states.append(state)
    rest, _ = resume_and_finish(dataset_loader, {"workers": 2, "threads": 2}, states, ids=ids_of)
    counted_once(delivered + [x for b in rest for x in b], range(N))


def test_elastic_resume_two_workers_to_three_reads_every_index_once():
    first, state = save_after(dataset_loader, {"workers": 2}, 3, ids=ids_of)
    rest, _ = resume_and_finish(dataset_loader, {"workers": 3}, state, ids=ids_of)
    counted_once([x for b in first + rest for x in b], range(N))


# -- what is not a dataset -----------------------------------------------------------------
class _NoLen:
    def __getitem__(self, i):
        return i


class _Len(Dataset):
    def __init__(self, n) -> None:
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize(
    ("dataset", "error", "match"),
    [
        (object(), TypeError, r"__len__ and __getitem__.*no __len__ or __getitem__"),
        (_NoLen(), TypeError, r"object with __len__ and __getitem__.*has no __len__"),
        ((x for x in range(3)), TypeError, r"for an iterable .*use sb\.Pipeline\(iterable\)"),
        (_Stream(), TypeError, r"IterableDataset _Stream.*sb\.Pipeline\(iterable\)"),
        ("abc", TypeError, "not a string"),
        (_Len(-1), ValueError, r"len\(dataset\) must be an int >= 0 .*_Len"),
        (_Len("3"), TypeError, r"len\(dataset\) must be an int >= 0"),
        (_Len(2.5), TypeError, r"len\(dataset\) must be an int >= 0"),
    ],
    ids=[
        "object",
        "no-len",
        "generator",
        "iterable-dataset",
        "str",
        "negative",
        "str-len",
        "float-len",
    ],
)
def test_what_is_not_a_map_style_dataset_is_refused_with_what_it_needs(dataset, error, match):
    with pytest.raises(error, match=match):
        sb.Pipeline.from_dataset(dataset)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"threads": 0}, ValueError, "threads=0"),
        ({"threads": "many"}, ValueError, "threads='many'"),
        ({"shuffle": "yes"}, TypeError, "shuffle="),
        ({"seed": 1.5}, TypeError, "seed="),
        ({"rank": 0}, ValueError, "world_size"),
        ({"rank": 2, "world_size": 2}, ValueError, "rank"),
        ({"equalize": "trim"}, ValueError, "equalize"),
    ],
)
def test_bad_options_are_refused_when_the_pipeline_is_built(kwargs, error, match):
    with pytest.raises(error, match=match):
        sb.Pipeline.from_dataset(Counted(4), **kwargs)


def test_a_pipeline_over_a_dataset_with_a_bad_length_says_so():
    with pytest.raises(ValueError, match=r"len\(dataset\) must be an int >= 0"):
        sb.Pipeline(_Len(-2))
