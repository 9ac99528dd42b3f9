"""The Loader's byte and batch bounds, measured *outside* the budget.

The budget reports its own peaks; a bug in its accounting (a missing lock, a reservation
never given back) would be invisible to a test reading them. Here the workers count the
batches they built and their bytes in shared memory (``tests.pipeline_data.BuiltLog``,
a stage after ``batch()``, one slot per worker), and the consumer counts what it
received, computing each batch's bytes itself. At each receipt, *built minus received*
is what is finished and not yet handed over: its credits are held (reserved before the
batch was built, released only at hand-over), so it can never pass the limit. And at the
end of every complete epoch, before the next one forgets everything, the budget's own
credits are exactly zero.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest

from streambuf import Loader, Pipeline
from tests.pipeline_data import BuiltLog, mib_sample, tensor_bytes

pytestmark = pytest.mark.timeout(150)

MIB = 1 << 20


def _drain(loader, log: BuiltLog, *, step_s: float = 0.0):
    """(ids, peak finished-not-received bytes, peak batches) over one epoch."""
    base_n, base_b = log.totals()  # what earlier (complete) epochs built
    received_n = received_b = 0
    peak_b = peak_n = 0
    ids = []
    for batch in loader:
        received_n += 1
        received_b += tensor_bytes(batch)
        built_n, built_b = (a - b for a, b in zip(log.totals(), (base_n, base_b)))
        peak_b = max(peak_b, built_b - received_b)  # this one's credits are back
        peak_n = max(peak_n, built_n - received_n)
        ids += [int(x) for x in (batch[:, 0] if batch.dim() == 2 else batch)]
        if step_s:
            time.sleep(step_s)
    return ids, peak_b, peak_n


@pytest.mark.parametrize("in_order", [True, False])
def test_bytes_in_flight_measured_outside_the_budget(in_order, capsys):
    """1 MiB batches, a slow consumer, 16 MiB: what the workers built and the consumer
    had not yet received (read at each receipt, after that batch's hand-over) stays
    within the limit and reaches most of it; the budget's own peak agrees."""
    ctx = multiprocessing.get_context("fork")
    log = BuiltLog(ctx, 2)
    pipe = Pipeline(list(range(60))).map(mib_sample).batch(1).map(log)
    loader = Loader(
        pipe, num_workers=2, max_batches=64, max_bytes=16 * MIB, in_order=in_order, adaptive=False
    )
    ids, peak_b, _ = _drain(loader, log, step_s=0.02)
    assert sorted(ids) == list(range(60))
    budget = loader.stats().budget
    limit = budget.max_bytes
    with capsys.disabled():
        print(
            f"\n  in_order={in_order}: measured peak {peak_b / MIB:.1f} MiB finished and not "
            f"received; budget's own peak {budget.peak_in_flight_bytes / MIB:.1f} MiB "
            f"(incl. batches being built); limit {limit / MIB:.1f} MiB"
        )
    assert 0.75 * limit <= peak_b <= limit
    assert peak_b <= budget.peak_in_flight_bytes <= limit


@pytest.mark.parametrize("persistent", [False, True])
def test_credits_are_exactly_zero_after_every_epoch_under_stress(persistent):
    """4 workers x 4 map threads, batches of one small tensor, 6 epochs (2 of them
    broken off early): the batch bound holds at every receipt (measured outside), and at
    the end of each complete epoch the budget holds nothing, reserved or finished."""
    ctx = multiprocessing.get_context("fork")
    log = BuiltLog(ctx, 4)
    pipe = Pipeline(list(range(400)), seed=3).shuffle(32).map(int, threads=4).batch(1).map(log)
    loader = Loader(
        pipe,
        num_workers=4,
        max_batches=8,
        max_bytes="64MiB",
        persistent_workers=persistent,
        adaptive=False,
    )
    with loader:
        ends = []
        loader._dataloader()
        budget = loader._budget
        forget = budget.new_generation

        def spy() -> int:  # the Loader forgets the credits here: look first
            s = budget.stats()
            ends.append((s.in_flight_bytes, s.in_flight_batches, budget.held_bytes()))
            return forget()

        budget.new_generation = spy  # type: ignore[method-assign]
        for epoch in range(6):
            loader.set_epoch(epoch)
            if epoch in (2, 4):  # broken off: the next start forgets what was in flight
                it = iter(loader)
                for _ in range(17):
                    next(it)
                it.close()
                continue
            ids, _, peak_n = _drain(loader, log)
            assert sorted(ids) == list(range(400))
            if epoch - 1 not in (2, 4):  # batches of a broken-off epoch may land late
                assert peak_n <= 8, (epoch, peak_n)
            assert ends[-1] == (0, 0, 0), (epoch, ends)
