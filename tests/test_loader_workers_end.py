"""A worker that ends is finished or dead, never confused (``streambuf._supervise``).

* Finished: the DataLoader received its end of stream; a non-persistent worker then
  exits with code 0. Other workers may take as long as they need (a video batch of
  several seconds): no ``WorkerError``, with ``timeout_s`` unset or set, fork and spawn,
  in order or as ready, and with idle workers (more workers than items).
* Dead: it exited before its end of stream (code 0 included), or with a non-zero code or
  a signal: ``WorkerError`` naming that worker, within about two seconds, in order or
  as ready, also while the other workers keep delivering batches.
* Persistent workers survive any number of ``break``/re-iterate cycles, with slow
  batches in flight and the CPU busy.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

import streambuf as sb
from streambuf import Loader, Pipeline, WorkerError
from tests.pipeline_data import (
    LookupFailed,
    chained_on_3,
    exit_three_on_5,
    exit_zero_on_5,
    mark_then_nap,
    nap,
    segfault_on_5,
    sleepy,
    slow_key,
)
from tests.sources.helpers import expected_keys, make_shards

# serial: slow workers and deaths detected within bounds (make pytest runs it alone)
pytestmark = [pytest.mark.timeout(180), pytest.mark.serial]


def _straggler_items(seconds: float) -> list[tuple[int, float]]:
    """Item 0 takes ``seconds``, item 1 is quick: with 3 workers one is idle from the
    start and one finishes at once, while the third straggles."""
    return [(0, seconds), (1, 0.0)]


def _ids(batches) -> list[int]:
    return sorted(int(x) for b in batches for x in b)


# CI: 2 s stragglers (twice the old 1 s poll) over the grid, spawn on its diagonal, one
# 5 s case; make test-long: every length over the whole grid
CASES = [
    (s, ctx, in_order, timeout_s)
    for s in (2.0,)
    for ctx in ("fork", "spawn")
    for in_order in (True, False)
    for timeout_s in (None, 30.0)
    if ctx == "fork" or in_order == (timeout_s is None)
]
SAMPLED = [(5.0, "fork", True, None)]
FULL = [
    (s, ctx, in_order, timeout_s)
    for s in (2.0, 5.0, 10.0)
    for ctx in ("fork", "spawn")
    for in_order in (True, False)
    for timeout_s in (None, 30.0)
    if (s, ctx, in_order, timeout_s) not in CASES + SAMPLED
]


@pytest.mark.parametrize(
    ("seconds", "ctx", "in_order", "timeout_s"),
    CASES + SAMPLED + [pytest.param(*c, marks=pytest.mark.long) for c in FULL],
)
def test_a_finished_worker_is_not_a_dead_one(seconds, ctx, in_order, timeout_s):
    pipe = Pipeline(_straggler_items(seconds)).map(nap).batch(1)
    loader = Loader(
        pipe,
        num_workers=3,
        max_batches=3,
        max_bytes="1MiB",
        in_order=in_order,
        timeout_s=timeout_s,
        multiprocessing_context=ctx,
    )
    t0 = time.monotonic()
    assert _ids(loader) == [0, 1]
    assert time.monotonic() - t0 >= seconds


def test_uneven_shares_with_slow_batches(tmp_path):
    """The issue's realistic case: 3 tar shards of 32 samples, 100 ms per sample,
    batches of 16 over 2 workers: worker 1 (one shard) ends while worker 0 (two shards)
    still needs 3.2 s per batch."""
    paths = make_shards(tmp_path, 3, 32, payload=100, random_payload=False)
    pipe = sb.shards([str(p) for p in paths]).map(slow_key).batch(16)
    loader = Loader(pipe, num_workers=2, max_batches=2, max_bytes="1MiB")
    keys = sorted(k for batch in loader for k in batch)
    assert keys == sorted(expected_keys(3, 32))


def _run_until_error(pipe, *, ctx="fork", in_order=True, timeout_s=None, workers=2):
    loader = Loader(
        pipe,
        num_workers=workers,
        max_batches=workers,
        max_bytes="1MiB",
        in_order=in_order,
        timeout_s=timeout_s,
        multiprocessing_context=ctx,
    )
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        for _ in loader:
            pass
    return str(info.value), time.monotonic() - t0


@pytest.mark.parametrize(
    ("fn", "how"),
    [
        (exit_zero_on_5, "exited with code 0 before its end of stream"),
        (exit_three_on_5, "exited with code 3"),
        (segfault_on_5, "SIGSEGV"),
    ],
)
@pytest.mark.parametrize("in_order", [True, False])
def test_a_worker_that_dies_is_reported_naming_it(fn, how, in_order):
    """Items 0..9 over 2 workers: item 5 is worker 1's (round robin by slot); the other
    worker keeps going slowly, so only the death can end the epoch early."""
    pipe = Pipeline(list(range(10))).map(fn).map(sleepy).batch(1)
    text, took = _run_until_error(pipe, in_order=in_order, timeout_s=10)
    assert took < 8, took  # worker start-up, then the death within a poll (1 s)
    assert how in text, text
    assert "worker 1 " in text and "worker 0 " not in text, text


def test_sigkill_of_one_worker_is_reported_within_two_seconds():
    items = [(i, 0.05) for i in range(400)]
    pipe = Pipeline(items).map(nap).batch(1)
    loader = Loader(pipe, num_workers=2, max_batches=2, max_bytes="1MiB")
    it = iter(loader)
    next(it)
    victim = loader.worker_pids()[1]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        for _ in it:
            pass
    assert time.monotonic() - t0 < 2.5
    text = str(info.value)
    assert f"worker 1 (pid {victim}) was killed by signal SIGKILL" in text, text


@pytest.mark.timeout(90)
@pytest.mark.parametrize("in_order", [True, False])
def test_a_dead_worker_is_reported_while_the_others_keep_delivering(in_order):
    """SIGKILL one of 3 workers while the other two keep delivering a batch every few
    milliseconds: the death is reported within seconds in order *and* as ready. As ready,
    batches of the survivors never stop arriving, so a check of the processes made only
    when a poll comes back empty saw the death only once their shares were done (here
    20 s each). Worker 1's items take a minute: it never has a batch queued that would
    expose its death when unpickled."""
    items = [(i, 60.0 if i % 3 == 1 else 0.02) for i in range(3000)]  # i % 3: its worker
    pipe = Pipeline(items).map(nap).batch(1)
    loader = Loader(pipe, num_workers=3, max_batches=6, max_bytes="1MiB", in_order=in_order)
    it = iter(loader)
    next(it)  # worker 0's first batch: all three workers run
    victim = loader.worker_pids()[1]
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    after = 0
    with pytest.raises(WorkerError) as info:
        for _ in it:
            after += 1
    took = time.monotonic() - t0
    assert took < 3.0, (took, after)  # the survivors' shares would take 20 s
    text = str(info.value)
    assert f"worker 1 (pid {victim}) was killed by signal SIGKILL" in text, text
    assert "worker 0" not in text and "worker 2" not in text, text


def test_a_stopped_worker_is_named_not_a_finished_one():
    """As ready: worker 1 finishes its share and exits 0, worker 0 is stopped: the
    timeout names worker 0 (the one the loop waits for), never worker 1."""
    items = [(i, 0.05 if i % 2 == 0 else 0.0) for i in range(200)]  # worker 0's: slow
    pipe = Pipeline(items).map(nap).batch(1)
    loader = Loader(
        pipe, num_workers=2, max_batches=2, max_bytes="1MiB", in_order=False, timeout_s=2
    )
    it = iter(loader)
    for _ in range(110):  # worker 1's 100 quick items, some of worker 0's
        next(it)
    pid0 = loader.worker_pids()[0]
    os.kill(pid0, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerError) as info:
            for _ in it:
                pass
    finally:
        try:
            os.kill(pid0, signal.SIGCONT)
        except ProcessLookupError:
            pass
    text = str(info.value)
    assert "timeout_s=2" in text and f"worker 0 (pid {pid0})" in text, text
    assert "worker 1" not in text, text


def _burn(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


@pytest.mark.parametrize("slow_s", [0.0, 1.5])
def test_persistent_workers_survive_break_and_iterate_again_under_load(slow_s):
    """Many break/re-iterate cycles, a busy CPU (two spinning processes, and the workers
    themselves), batches taking longer than the old 1 s DataLoader poll: every cycle
    starts and delivers, and the last full epoch is complete."""
    items = [(i, slow_s if i % 7 == 3 else 0.002) for i in range(60)]
    pipe = Pipeline(items).map(nap).batch(2)
    # the CPU busy: a spinning process per core (a thread here would only test the GIL)
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    burners = [ctx.Process(target=_burn, args=(stop,), daemon=True) for _ in range(2)]
    for b in burners:
        b.start()
    cycles = 4 if slow_s else 60
    try:
        with Loader(
            pipe, num_workers=2, max_batches=4, max_bytes="1MiB", persistent_workers=True
        ) as loader:
            for cycle in range(cycles):
                it = iter(loader)
                for _ in range(1 + cycle % 3):
                    next(it)
                it.close()  # break
            assert _ids(loader) == list(range(60))
            stats = loader._budget.stats()  # credits back to exactly zero
            assert stats.in_flight_batches == 0 and stats.in_flight_bytes == 0, stats
            assert loader._budget.held_bytes() == 0
    finally:
        stop.set()
        for b in burners:
            b.join(5)


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_a_persistent_worker_killed_between_epochs_is_named_at_the_next_start(timeout_s):
    """The reset of persistent workers at the start of an epoch is a wait like any
    other: a worker killed meanwhile is a ``WorkerError`` naming it within ~2 s (torch's
    own reset would raise a plain RuntimeError after 5 s, or time out)."""
    pipe = Pipeline(list(range(8))).map(sleepy).batch(2)
    with Loader(
        pipe,
        num_workers=2,
        max_batches=2,
        max_bytes="1MiB",
        persistent_workers=True,
        timeout_s=timeout_s,
    ) as loader:
        assert _ids(loader) == list(range(8))
        victim = loader.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as info:
            for _ in loader:
                pass
        assert time.monotonic() - t0 < 2.5
        assert f"worker 0 (pid {victim}) was killed by signal SIGKILL" in str(info.value)
        assert _ids(loader) == list(range(8))  # a fresh DataLoader after the failure


def test_a_batch_abandoned_mid_build_leaves_no_credits_in_the_next_epoch(tmp_path):
    """Break while worker 0 is building a batch (item 6 takes 1 s): it finishes it under
    the old generation. That late correction must not land in the next epoch's credits:
    once that epoch's every batch is delivered, nothing is held or reserved. Worker 0
    reads 0, 2, 4, 6, 8, ...: batch (0, 2) is made with item 4 as its lookahead, and item
    6 begins only once that batch's credit came back, i.e. after ``next`` returned it.
    The break waits until item 6 has begun (a marker file), so the build is in progress
    at the break however loaded the machine (a timed guess was not: a planted bug
    survived once in three runs)."""
    marker = tmp_path / "item-6-begun"
    items = [(i, 1.0 if i == 6 else 0.02, str(marker) if i == 6 else None) for i in range(16)]
    pipe = Pipeline(items).map(mark_then_nap).batch(2)
    with Loader(
        pipe, num_workers=2, max_batches=2, max_bytes="1MiB", persistent_workers=True
    ) as loader:
        it = iter(loader)
        next(it)  # worker 0's (0, 2); it then builds (4, 6) with 8 as its lookahead
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "worker 0 never began item 6"
            time.sleep(0.005)
        it.close()  # worker 0 is inside item 6 now
        it = iter(loader)
        got = [next(it) for _ in range(8)]  # the whole epoch, before its StopIteration
        assert _ids(got) == list(range(16))
        budget = loader._budget
        assert budget.held_bytes() == 0
        assert budget.stats().in_flight_bytes >= 0
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_an_exception_chain_crosses_from_the_worker_whole(ctx):
    """``raise X from Y`` in a worker: the loop gets X with Y as ``__cause__`` (its type,
    attributes and notes), Y's own suppressed context, and an implicit ``__context__``
    for an exception raised while handling another."""
    for item, check in ((3, "explicit"), (4, "implicit")):
        pipe = Pipeline([item]).map(chained_on_3).batch(1)
        loader = Loader(
            pipe, num_workers=1, max_batches=1, max_bytes="1MiB", multiprocessing_context=ctx
        )
        with pytest.raises(Exception) as info:
            list(loader)
        exc = info.value
        if check == "explicit":
            assert type(exc) is ValueError and str(exc) == "cannot read sample 3"
            cause = exc.__cause__
            assert type(cause) is LookupFailed and cause.key == 3, repr(cause)
            assert "looked in the index" in cause.__notes__
            assert exc.__suppress_context__ is True and exc.__context__ is cause
            assert cause.__suppress_context__ is True
            assert type(cause.__context__) is KeyError
        else:
            assert type(exc) is RuntimeError and exc.__cause__ is None
            assert type(exc.__context__) is ZeroDivisionError
            assert exc.__suppress_context__ is False
        assert any("raised in DataLoader worker 0" in n for n in exc.__notes__)


def test_a_worker_iteration_belongs_to_the_round_it_was_made_for(monkeypatch):
    """The mechanism behind persistent workers' hangs after ``break``: torch makes a
    worker's fetcher (``iter(feed)``) at the worker's start and at each reset, but a
    worker slow to start, or tasks of an abandoned iteration still queued before the
    reset, run a fetcher made for an iteration the main process already left. Such a
    fetcher must yield nothing, never produce under the new plan (it would take the new
    iteration's credits for batches the reset discards, and block before acknowledging
    the reset)."""
    import multiprocessing

    import torch.utils.data

    import streambuf._worker
    from streambuf._worker import Board, Feed
    from streambuf.budget import CreditBudget

    info = torch.utils.data._utils.worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
    # in this process, not a worker: no parent watch (a thread for good), no mallopt
    monkeypatch.setattr(streambuf._worker, "watch_parent", lambda: None)
    monkeypatch.setattr(streambuf._worker, "fix_malloc_thresholds", lambda: None)
    ctx = multiprocessing.get_context("fork")
    budget = CreditBudget(num_workers=1, max_bytes=1 << 20, max_batches=2, pooled=False, ctx=ctx)
    board = Board(ctx)
    pipe = Pipeline(list(range(4))).batch(2)

    def drain(it) -> list[int]:
        got = []
        for tagged in it:  # consumed as the main process does: credits released
            budget.release(tagged.worker, tagged.nbytes)
            got.extend(int(x) for x in tagged.batch)
        return got

    # made for round 0, started only after the loop broke and began round 1
    feed = Feed(pipe, budget=budget, board=board, stage_bytes=None)
    board.publish(generation=budget.new_generation(), epoch=0, rank=0, world_size=1)
    old = iter(feed)
    board.publish(generation=budget.new_generation(), epoch=0, rank=0, world_size=1, round_=1)
    assert drain(old) == []
    assert drain(iter(feed)) == [0, 1, 2, 3]  # the reset's fetcher: round 1
    # a worker slow to start: its first fetcher is made when the board is at round 1
    late = Feed(pipe, budget=budget, board=board, stage_bytes=None)
    assert drain(iter(late)) == []
    assert drain(iter(late)) == [0, 1, 2, 3]
    assert budget.stats().in_flight_batches == 0
