"""The Loader's credits bind where they should, at fine grain (1 MiB batches, a high
``max_batches``, ``adaptive=False``, a slow consumer): the peak reaches at least 90% of
the limit the Loader applies and never passes it; the same for the batch count with
tiny batches; and the 1/4 stage share is what ``stats()`` says.
"""

from __future__ import annotations

import time

import pytest

from streambuf import Loader, Pipeline
from tests.pipeline_data import ids_of, mib_sample

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20


def drain_slowly(loader, step_s=0.02):
    seen = []
    for batch in loader:
        seen += [int(x) for x in batch[:, 0]] if batch.dim() == 2 else ids_of(batch)
        time.sleep(step_s)
    return seen


@pytest.mark.parametrize("in_order", [True, False])
def test_byte_credits_bind_at_fine_grain(in_order):
    pipe = Pipeline(list(range(60))).map(mib_sample).batch(1)  # no stage buffers
    loader = Loader(
        pipe, num_workers=2, max_batches=64, max_bytes=16 * MIB, in_order=in_order, adaptive=False
    )
    assert sorted(drain_slowly(loader)) == list(range(60))
    s = loader.stats()
    limit = s.budget.max_bytes
    assert s.stage_bytes is None and limit == 16 * MIB  # no stage share to take
    assert s.budget.oversize == 0 and s.budget.overshoot == 0
    assert 0.9 * limit <= s.budget.peak_in_flight_bytes <= limit, s.budget
    if in_order:  # sharded: each worker within its half
        assert all(p <= limit // 2 for p in s.budget.per_worker_peak_bytes)
    assert s.budget.in_flight_bytes == 0


def test_stage_share_is_a_quarter_and_credits_bind_at_the_rest():
    pipe = Pipeline(list(range(60))).map(mib_sample, threads=2).batch(1)
    loader = Loader(pipe, num_workers=2, max_batches=64, max_bytes=16 * MIB, adaptive=False)
    assert sorted(drain_slowly(loader)) == list(range(60))
    s = loader.stats()
    assert s.stage_bytes == 16 * MIB // 4 // 2  # per worker
    assert s.budget.max_bytes == 16 * MIB - 16 * MIB // 4
    assert 0.9 * s.budget.max_bytes <= s.budget.peak_in_flight_bytes <= s.budget.max_bytes


@pytest.mark.parametrize("in_order", [True, False])
def test_batch_credits_bind_with_tiny_batches(in_order):
    pipe = Pipeline(list(range(200))).batch(2)
    loader = Loader(
        pipe, num_workers=2, max_batches=6, max_bytes="1GiB", in_order=in_order, adaptive=False
    )
    assert sorted(drain_slowly(loader, 0.01)) == list(range(200))
    s = loader.stats().budget
    assert s.max_batches == 6
    assert s.peak_in_flight_batches == 6, s
    if in_order:
        assert s.per_worker_peak_batches == (3, 3)


def outlier_sample(i: int):
    """16 KiB samples; every 20th 1 MiB (a long clip among short ones)."""
    import torch

    t = torch.zeros((1 << 20) if i % 20 == 19 else (16 << 10), dtype=torch.uint8)
    t[0] = i % 251
    return t


@pytest.mark.parametrize("in_order", [True, False])
def test_a_batch_larger_than_its_reservation_waits_for_room(in_order):
    """A batch that outgrows its reservation is reserved again at its size: credits stay
    within the budget (a slice, in order) but for that batch held alone (it was added on
    top of the worker's held batches: 10 MiB over seven others in a 1 MiB slice)."""
    pipe = Pipeline(list(range(80))).map(outlier_sample).batch(1)
    loader = Loader(
        pipe,
        num_workers=2,
        max_batches=16,
        max_bytes="256KiB",
        in_order=in_order,
        adaptive=False,
        timeout_s=20,  # (a batch waiting on credits it holds itself: stuck, named)
    )
    n = 0
    for _ in loader:
        n += 1
        time.sleep(0.005)  # a slow consumer: the workers fill their credits
    s = loader.stats().budget
    assert n == 80
    assert s.oversize == 4, s  # the four 1 MiB batches, each held alone: no more
    if in_order:
        slice_b = max(s.per_worker_limit_bytes)
        for peak in s.per_worker_peak_bytes:
            assert peak <= max(slice_b, MIB), s
    else:
        assert s.peak_in_flight_bytes <= MIB, s


def test_one_large_batch_does_not_shrink_the_depth_for_the_rest_of_the_epoch():
    """A worker reserves the largest of its last few batches, not of the epoch: after one
    1 MiB batch among 16 KiB ones, it holds several batches again (it held one at a time
    for good, every reservation then counted as larger than the slice)."""
    pipe = Pipeline([19] + [0] * 59).map(outlier_sample).batch(1)  # one 1 MiB, then small
    loader = Loader(
        pipe, num_workers=1, max_batches=8, max_bytes="512KiB", adaptive=False, timeout_s=60
    )
    held = []
    for k, _ in enumerate(loader):
        time.sleep(0.01)
        if k >= 20:
            held.append(loader.stats().budget.in_flight_batches)
    assert sum(held) / len(held) >= 4, held
