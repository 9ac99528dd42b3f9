from __future__ import annotations

import gc
import threading
import time
import traceback
import weakref

import pytest
import torch

from streambuf import ThreadPrefetcher, prefetch
from streambuf.stages import prefetch_items
from tests.helpers import wait_for_threads

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("no_thread_leak")]


def test_plain_and_ordered_with_threads():
    assert list(prefetch(range(100), max_items=4, max_bytes="1MiB")) == list(range(100))
    out = list(prefetch(range(100), max_items=5, max_bytes="1MiB", threads=5, fn=lambda x: -x))
    assert out == [-x for x in range(100)]


def test_ordered_despite_uneven_latency():
    def slow_evens(x):
        time.sleep(0.01 if x % 2 == 0 else 0)
        return x

    out = list(prefetch(range(40), max_items=4, max_bytes="1MiB", threads=4, fn=slow_evens))
    assert out == list(range(40))


def test_unordered_delivers_everything_once():
    out = list(
        prefetch(
            range(200), max_items=4, max_bytes="1MiB", threads=3, fn=lambda x: x, ordered=False
        )
    )
    assert sorted(out) == list(range(200))


@pytest.mark.serial
def test_threads_give_concurrency():
    def io(x):
        time.sleep(0.02)
        return x

    t0 = time.monotonic()
    list(prefetch(range(40), max_items=8, max_bytes="1MiB", threads=1, fn=io))
    one = time.monotonic() - t0
    t0 = time.monotonic()
    list(prefetch(range(40), max_items=8, max_bytes="1MiB", threads=8, fn=io))
    eight = time.monotonic() - t0
    assert eight < one / 2.5  # ideal 8x; generous for a noisy 2-core CI machine


def test_byte_bound_with_tensors():
    items = (torch.zeros(1024, dtype=torch.uint8) for _ in range(50))
    p = prefetch(items, max_items=100, max_bytes=4096, threads=2)
    for _ in p:
        time.sleep(0.001)
    s = p.stats()
    assert s.peak_bytes <= 4096 and s.gets == 50


def test_producer_exception_reraised_with_traceback_and_note():
    def boom(x):
        if x == 7:
            raise KeyError(f"bad item {x}")
        return x

    got = []
    with pytest.raises(KeyError) as info:
        for x in prefetch(range(100), max_items=2, max_bytes="1MiB", threads=2, fn=boom):
            got.append(x)
    assert got == list(range(len(got))) and len(got) <= 7
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "map(boom)" in notes and "item #7" in notes
    tb = "".join(traceback.format_exception(info.value))
    assert "in boom" in tb  # the original frame survives the thread hop


def test_source_exception_names_source():
    def gen():
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone") as info:
        list(prefetch(gen(), max_items=2, max_bytes="1MiB", name="reader"))
    assert "reader" in "".join(info.value.__notes__)


def test_early_break_stops_threads():
    started = time.monotonic()
    for x in prefetch(iter(range(10**9)), max_items=3, max_bytes="1MiB", threads=3):
        if x == 10:
            break
    assert wait_for_threads(timeout_s=1.0) == []
    assert time.monotonic() - started < 5


def test_an_owned_source_is_closed_at_the_stop_even_from_inside_a_read():
    """``close_source=True`` (a pipeline's stages): the source iterator is closed when the
    stage stops, also when a producer is inside it (a read that blocks) at that moment:
    that thread closes it when the read returns. ``prefetch()`` leaves a caller's
    iterator open."""
    entered, closed = threading.Event(), threading.Event()

    def source():
        try:
            yield 0
            entered.set()
            time.sleep(0.5)  # a read in progress while the consumer stops
            yield 1
            yield 2
        finally:
            closed.set()

    pf = ThreadPrefetcher(
        source(), max_items=1, max_bytes="1MiB", close_source=True, join_timeout_s=0.1
    )
    it = iter(pf)
    assert next(it) == 0
    assert entered.wait(5)
    it.close()  # the producer holds the source: the stop cannot close it now
    assert closed.wait(5), "the source stayed open after the read returned"

    def users():
        yield from range(100)

    for helper in (prefetch, prefetch_items):
        mine = users()
        for x in helper(mine, max_items=2, max_bytes="1MiB"):
            if x == 3:
                break
        assert wait_for_threads(timeout_s=1.0) == []
        assert mine.gi_frame is not None, helper  # not closed: the caller's to close


@pytest.mark.parametrize("threads", [4, "auto"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_a_closed_stage_is_freed_by_reference_counting(threads, adaptive):
    """Once closed, nothing of a stage points back at it in a cycle (the lane runner's
    gate, the tuner's room callback): it and what it holds are freed when the last
    reference goes, not at a garbage collection that a worker may run rarely."""
    gc.collect()
    gc.disable()
    try:
        p = ThreadPrefetcher(
            range(1000), max_items=8, max_bytes="1MiB", threads=threads, fn=abs, adaptive=adaptive
        )
        it = iter(p)
        for _ in range(20):
            next(it)
        it.close()
        gone = weakref.ref(p)
        del p, it
        assert gone() is None, "a cycle keeps the closed stage alive"
    finally:
        gc.enable()


def test_close_twice_and_context_manager():
    p = ThreadPrefetcher(range(10**6), max_items=2, max_bytes="1MiB", threads=2)
    it = iter(p)
    assert next(it) == 0
    p.close()
    p.close()
    assert wait_for_threads(timeout_s=1.0) == []
    with ThreadPrefetcher(range(10**6), max_items=2, max_bytes="1MiB") as p2:
        assert next(iter(p2)) == 0
    assert wait_for_threads(timeout_s=1.0) == []


def test_consumer_exception_stops_threads():
    def consume():
        for x in prefetch(range(10**6), max_items=2, max_bytes="1MiB", threads=2):
            if x == 3:
                raise RuntimeError("consumer failed")

    with pytest.raises(RuntimeError, match="consumer failed"):
        consume()
    assert wait_for_threads(timeout_s=1.0) == []


def test_iterating_twice_is_an_error():
    p = ThreadPrefetcher(range(3), max_items=2, max_bytes="1MiB")
    assert list(p) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="only once"):
        list(p)


def test_bad_arguments():
    # one pool: fewer slots than threads is fine (it once had to be >= threads)
    assert list(prefetch(range(9), max_items=2, max_bytes="1MiB", threads=4, fn=abs)) == list(
        range(9)
    )
    with pytest.raises(ValueError, match="threads"):
        prefetch(range(3), max_items=2, max_bytes="1MiB", threads=0)


def test_stuck_thread_is_daemon_and_close_is_bounded():
    release = threading.Event()

    def stuck(x):
        release.wait(10)
        return x

    p = ThreadPrefetcher(range(5), max_items=2, max_bytes="1MiB", fn=stuck, join_timeout_s=0.2)
    got: list[int] = []
    consumer = threading.Thread(target=lambda: got.extend(p), daemon=True)
    consumer.start()
    time.sleep(0.1)  # the consumer waits, both producers are stuck in fn
    t0 = time.monotonic()
    p.close()  # from another thread: bounded although the producers cannot be stopped
    assert time.monotonic() - t0 < 2
    consumer.join(2)
    assert not consumer.is_alive() and got == []
    release.set()


def test_items_being_made_count_against_the_bound():
    started = []
    lock = threading.Lock()

    def make(x):
        with lock:
            started.append(x)
        time.sleep(0.002)
        return x

    consumed = 0
    worst = 0
    for _ in prefetch(range(60), max_items=4, max_bytes="1MiB", threads=4, fn=make):
        consumed += 1
        time.sleep(0.01)  # slow consumer: producers would run ahead if they could
        with lock:
            worst = max(worst, len(started) - consumed)
    assert worst <= 4  # made or being made, not yet taken: never more than max_items


def _pulled_while_the_consumer_waits(threads: int, max_items: int | None) -> int:
    """Items a threaded map has pulled once its consumer took one and stopped."""
    from streambuf import Pipeline

    calls: list[int] = []
    pipe = Pipeline(range(200)).map(
        calls.append, threads=threads, adaptive=False, max_items=max_items
    )
    it = iter(pipe)
    next(it)
    seen, deadline = -1, time.monotonic() + 10
    while seen != len(calls) and time.monotonic() < deadline:  # until it stops pulling
        seen = len(calls)
        time.sleep(0.3)
    for _ in it:  # drain: the threads end with the source
        pass
    return seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [2, 4])
def test_a_threaded_map_holds_two_items_a_thread_while_the_consumer_works(threads):
    """The consumer's own work between two items it takes (a batch's collate, its
    hand-off) must not stall every thread at once: by default a threaded map holds two
    items a thread (one made, one being made). With one, all threads stopped whenever
    the consumer was busy (the seed workload ran at 0.88-0.92 of ``threads / latency``
    with 8 threads a worker, 0.95 with two, in three side-by-side runs)."""
    default = _pulled_while_the_consumer_waits(threads, None)
    assert default == _pulled_while_the_consumer_waits(threads, 2 * threads)
    assert default == _pulled_while_the_consumer_waits(threads, threads) + threads
    assert wait_for_threads(timeout_s=5.0) == []
