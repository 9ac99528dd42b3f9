"""A worker whose share ends without a single batch (a filter drops all of it, a shared
shard leaves it no sample, a stage keeps nothing): the checkpoint still knows that
share is done. Before, such a worker never sent a state, so a state saved at the end of
the epoch was "incomplete" and resuming it gave an empty epoch instead of the next one."""

from __future__ import annotations

import json

import pytest

import streambuf as sb
from tests.resume_harness import check_save_load

pytestmark = pytest.mark.timeout(120)


def is_even(x: int) -> bool:
    return x % 2 == 0


def twice(shard: int) -> list[int]:
    return [shard]  # one sample per shard: a shared shard leaves the other slot nothing


def evens_only(workers: int = 2, in_order: bool = True) -> sb.Loader:
    # no shard shuffle: worker 1 of 2 reads the odd items only, and the filter drops them
    pipe = sb.Pipeline(list(range(30))).filter(is_even).batch(3)
    return sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="1MiB", in_order=in_order)


def one_sample(workers: int = 2, in_order: bool = True) -> sb.Loader:
    pipe = sb.Pipeline([0], expand=twice).batch(1)
    return sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="1MiB", in_order=in_order)


def ids(batch) -> list[int]:
    return [int(x) for x in batch]


@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_a_full_epoch_state_is_complete_and_resumes_into_the_next(workers, in_order):
    for make in (evens_only, one_sample):
        loader = make(workers, in_order)
        first = [ids(b) for b in loader]
        state = json.loads(json.dumps(loader.state_dict()))
        assert state["complete"] is True, (make.__name__, state["workers"])
        stats = loader._budget.stats() if loader._budget is not None else None
        assert stats is None or (stats.in_flight_batches, stats.in_flight_bytes) == (0, 0)
        resumed = make(workers, in_order)
        resumed.load_state_dict(state)
        assert sorted(x for b in resumed for x in ids(b)) == sorted(x for b in first for x in b)


def test_the_harness_passes_with_an_empty_share():
    check_save_load(evens_only, {"workers": 2}, [1, 3, "end"], ids=ids)
