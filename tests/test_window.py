"""The one window (``streambuf.window.Window``) under the one runner (``LaneRunner``), in
its three orders, with random item sizes (some larger than the whole bound), lane counts,
lane lengths, producer and consumer speeds.

An observer runs under the window's lock after every reservation, admission and removal
and checks the one pool: reservations + admitted results <= ``max_items`` and their bytes
<= ``max_bytes``, unless one is held alone (oversize, which must then be counted), and
no count ever negative (room given back twice, or never taken). The
consumer checks the order (round robin: lanes in turn from ``start_lane``, skipping
finished lanes; sequence: by number; first ready: nothing lost or repeated) and that
nothing hangs (every run ends within its deadline).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import streambuf._lanes as lanes_mod
import streambuf.window as window_mod
from streambuf._lanes import LaneRunner
from streambuf.errors import BufferClosed
from streambuf.window import Window

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_thread_leak")]

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Checker:
    def __init__(self) -> None:
        self.violations: list[str] = []

    def __call__(self, w: Window) -> None:
        n, nbytes = w._held, w._bytes
        if min(n, nbytes, w._reserved) < 0:  # a count given back twice, or never taken
            self.violations.append(f"negative counts: {n} held, {nbytes} B, {w._reserved} res")
        if n > 1 and (n > w.max_items or nbytes > w.max_bytes):
            self.violations.append(f"{n} held ({nbytes} B) > {w.max_items}, {w.max_bytes} B")
        if nbytes > w.max_bytes and w._oversize == 0:
            self.violations.append(f"oversize {nbytes} B alone, not counted")


def round_robin_reference(lengths: list[int], start: int) -> list[tuple[int, int]]:
    """(lane, i) in round-robin order from ``start``, finished lanes skipped."""
    out, k = [], len(lengths)
    for r in range(max(lengths, default=0)):
        for j in range(k):
            lane = (start + j) % k
            if r < lengths[lane]:
                out.append((lane, r))
    return out


def run(runner: LaneRunner, deadline_s: float = 10.0) -> list:
    got: list = []
    failure: list[BaseException] = []

    def consume() -> None:
        try:
            for item in runner:
                got.append(item)
                time.sleep(consume_delay[0] * random.random())
        except BaseException as exc:
            failure.append(exc)

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    th.join(deadline_s)
    hung = th.is_alive()
    runner.close()
    th.join(5)
    assert not hung, f"a hang: {len(got)} items delivered in {deadline_s} s"
    if failure:
        raise failure[0]
    return got


consume_delay = [0.0]

case = st.fixed_dictionaries(
    {
        "order": st.sampled_from(["round_robin", "sequence", "first_ready"]),
        "lanes": st.integers(1, 4),
        "max_items": st.integers(1, 6),
        "max_bytes": st.integers(20, 300),
        "lengths": st.lists(st.integers(0, 12), min_size=4, max_size=4),
        "big": st.floats(0, 0.3),
        "size": st.one_of(st.none(), st.integers(1, 300)),  # every item this size
        "delay": st.sampled_from([0.0, 0.0, 0.001, 0.004]),
        "consumer_delay": st.sampled_from([0.0, 0.0005, 0.002]),
        "start": st.integers(0, 3),
        "seed": st.integers(0, 1000),
        "chunk": st.sampled_from([1, 1, 3, 16]),  # items per hand-off (not in sequence order)
        "threads": st.sampled_from([None, None, 1, 2]),  # round robin: threads over lanes
        # how soon a waiting consumer takes what a lane holds of its chunk (``hold``)
        "poll": st.sampled_from([0.01, 0.0002]),
    }
)


def stalling_chunks(order: str, start: int = 0) -> dict:
    """A case whose lanes stall mid-chunk (every other item) while the consumer waits:
    it takes what they hold (``Window.hold``) almost at once."""
    return {
        "order": order,
        "lanes": 3,
        "max_items": 40,
        "max_bytes": 1000,
        "lengths": [12, 12, 12, 0],
        "big": 0.0,
        "size": 5,
        "delay": 0.004,
        "consumer_delay": 0.0,
        "start": start,
        "seed": 3,
        "chunk": 16,
        "threads": None,
        "poll": 0.0002,
    }


@SETTINGS
@given(case)
@example(  # the head lane is slow while another fills the pool: it must reserve outside
    {
        "order": "round_robin",
        "lanes": 2,
        "max_items": 2,
        "max_bytes": 300,
        "lengths": [6, 12, 0, 0],
        "big": 0.0,
        "size": None,
        "delay": 0.001,
        "consumer_delay": 0.0,
        "start": 0,
        "seed": 1,
    }
)
@example(  # results larger than the first estimate (a share): each waits for room
    {
        "order": "first_ready",
        "lanes": 4,
        "max_items": 6,
        "max_bytes": 250,
        "lengths": [10, 10, 10, 10],
        "big": 0.0,
        "size": 100,
        "delay": 0.004,
        "consumer_delay": 0.0,
        "start": 0,
        "seed": 2,
    }
)
@example(stalling_chunks("round_robin", start=1))  # (a consumer quick to take what they hold)
@example(stalling_chunks("first_ready"))  # the consumer takes from any lane that holds
def test_bounds_order_and_no_hang(c) -> None:
    rng = random.Random(c["seed"])
    lanes = c["lanes"]
    lengths = c["lengths"][:lanes]
    sizes = {
        (t, i): c["size"]
        if c["size"] is not None
        else rng.randrange(400)
        if rng.random() < c["big"]
        else rng.randrange(40)
        for t in range(lanes)
        for i in range(lengths[t])
    }
    check = Checker()
    window: Window = Window(
        lanes=lanes,
        max_items=c["max_items"],
        max_bytes=c["max_bytes"],
        order=c["order"],
        start_lane=c["start"],
    )
    window._observer = check
    consume_delay[0] = c["consumer_delay"]
    delay = c["delay"]
    numbered = c["order"] != "round_robin"
    shared = iter([(t, i) for t in range(lanes) for i in range(lengths[t])])
    lock = threading.Lock()
    counter = [0]

    def work(t: int) -> Iterator:
        if not numbered:  # its own items
            for i in range(lengths[t]):
                if delay and (t + i) % 2 == 0:  # lane 0's first item slow: the head
                    time.sleep(delay * (3 if t == 0 else 1))
                yield (t, i)
            return
        while True:  # producers sharing one source: number after the pull
            with lock:
                item = next(shared, None)
                if item is None:
                    return
                seq = counter[0]
                counter[0] += 1
            if delay:
                time.sleep(delay * (0.5 + rng.random()))
            yield seq, item

    runner = LaneRunner(
        [lambda t=t: work(t) for t in range(lanes)],
        window=window,
        numbered=numbered,
        sizeof=lambda item: sizes[item],
        name="test",
        chunk=1 if numbered else c.get("chunk", 1),
        threads=c.get("threads") if c["order"] == "round_robin" else None,
        first_lane=c["start"] % lanes,  # threads take their lanes in delivery order
    )
    saved = window_mod.HOLD_POLL_S
    window_mod.HOLD_POLL_S = c.get("poll", saved)
    try:
        got = run(runner)
    finally:
        window_mod.HOLD_POLL_S = saved
    every = sorted(sizes)
    if c["order"] == "round_robin":
        assert got == round_robin_reference(lengths, c["start"] % lanes)
    elif c["order"] == "sequence":
        assert got == [(t, i) for t in range(lanes) for i in range(lengths[t])]
    else:
        assert sorted(got) == every
    assert check.violations == []
    st_ = window.stats()
    assert st_.puts == st_.gets == len(every)


def test_a_round_robin_head_waits_outside_the_count_and_is_counted_so() -> None:
    # lane 1's items are small and quick, lane 0's large and slow: lane 1 runs ahead and
    # fills the pool with items the consumer takes only after lane 0's next one, whose
    # reservation (the largest size so far) then finds no room: the consumer waits on
    # lane 0, so lane 0 reserves outside the count instead of waiting behind lane 1
    window: Window = Window(lanes=2, max_items=100, max_bytes=100, order="round_robin")
    check = Checker()
    window._observer = check

    def lane0() -> Iterator:
        for i in range(6):
            time.sleep(0.01)
            yield ("a", i, 80)

    def lane1() -> Iterator:
        for i in range(60):
            yield ("b", i, 10)

    runner = LaneRunner([lane0, lane1], window=window, sizeof=lambda item: item[2], name="test")
    got = run(runner, deadline_s=10)
    assert got == round_robin_items(6, 60)
    st_ = window.stats()
    assert st_.peak_bytes <= 100
    assert check.violations == []  # outside reservations (if any) were never counted


def grown_window(*, lane1_ends: bool) -> tuple[Window, Checker]:
    """Lane 1's result grew past its room and fills the window after a0 and b0 were
    taken: lane 0's next reservation (the largest size so far, 80) finds no room."""
    w: Window = Window(lanes=2, max_items=10, max_bytes=100, order="round_robin")
    check = Checker()
    w._observer = check
    w.reserve(1, 10)
    w.reserve(0, 10)
    w.commit(0, "a0", 10)
    w.commit(1, "b0", 10)
    w.reserve(1, 10)
    w.commit(1, "b1", 80)  # larger than its room; it fits, so it is admitted
    if lane1_ends:
        w.finish(1)
    assert [w.get(), w.get()] == ["a0", "b0"]
    return w, check


def race(w: Window, lane0) -> list:  # type: ignore[no-untyped-def]
    """Lane 0 starts and waits for room; then the consumer asks for one item."""
    got: list = []
    producer = threading.Thread(target=lane0, daemon=True)
    consumer = threading.Thread(target=lambda: got.append(w.get()), daemon=True)
    producer.start()
    time.sleep(0.05)
    consumer.start()
    consumer.join(5)
    producer.join(5)
    hung = consumer.is_alive() or producer.is_alive()
    w.close()
    assert not hung, "a hang"
    return got


def test_the_awaited_item_reserves_outside_when_sizes_grew_since_room_was_left() -> None:
    # the consumer waits for exactly lane 0's next item: it must reserve outside the
    # count (else a deadlock)
    w, check = grown_window(lane1_ends=False)

    def lane0() -> None:
        w.reserve(0, 80)  # 80 held + 80 > 100: no room
        w.commit(0, "a1", 80)
        w.finish(0)

    assert race(w, lane0) == ["a1"]
    assert w.stats().outside == 1 and check.violations == []


def test_an_outside_reservation_given_back_was_never_counted() -> None:
    # as above, but lane 0's stream ends instead: its outside reservation is released
    w, check = grown_window(lane1_ends=True)

    def lane0() -> None:
        w.reserve(0, 80)  # granted outside once the consumer waits for it
        w.release(0)  # its stream ended: nothing made
        w.finish(0)

    assert race(w, lane0) == ["b1"]
    assert w.stats().outside == 1 and check.violations == []


def test_round_robin_keeps_room_for_the_items_delivered_first() -> None:
    # room for three 10-byte items: lane 1 made b0 and wants room for b1, but a0 and a1
    # (lane 0, not reserved yet) are delivered before b1: it must leave them room
    w: Window = Window(lanes=2, max_items=10, max_bytes=30, order="round_robin")
    check = Checker()
    w._observer = check
    w.reserve(1, 10)
    w.commit(1, "b0", 10)
    reserved = threading.Event()
    th = threading.Thread(target=lambda: (w.reserve(1, 10), reserved.set()), daemon=True)
    th.start()
    time.sleep(0.05)
    assert not reserved.is_set()  # 10 held + room for b1, a0, a1 > 30
    w.reserve(0, 10)
    w.commit(0, "a0", 10)
    assert [w.get(), w.get()] == ["a0", "b0"]
    assert reserved.wait(5)  # now only a1 comes first: 10 + 20 <= 30
    w.close()
    th.join(5)
    assert w.stats().outside == 0 and check.violations == []


def round_robin_items(a: int, b: int) -> list:
    out = []
    for i in range(max(a, b)):
        if i < a:
            out.append(("a", i, 80))
        if i < b:
            out.append(("b", i, 10))
    return out


def test_an_error_reaches_the_consumer_with_a_note_naming_the_lane() -> None:
    window: Window = Window(lanes=2, max_items=4, max_bytes=1000, order="round_robin")

    def good() -> Iterator:
        yield from range(100)

    def bad() -> Iterator:
        yield 1
        raise ValueError("boom")

    runner = LaneRunner([good, bad], window=window, sizeof=lambda _: 1, name="two")
    with pytest.raises(ValueError, match="boom") as info:
        run(runner)
    assert any("stage 'two' on lane 1" in n for n in info.value.__notes__)


def test_window_refuses_misuse_clearly() -> None:
    with pytest.raises(ValueError, match="order"):
        Window(lanes=1, max_items=1, max_bytes=10, order="lifo")  # type: ignore[arg-type]
    w: Window = Window(lanes=1, max_items=2, max_bytes=10, order="sequence")
    with pytest.raises(RuntimeError, match="without a reservation"):
        w.commit(0, "x", 1, seq=0)
    w.reserve(0, 1)
    with pytest.raises(RuntimeError, match="reserved twice"):
        w.reserve(0, 1)
    w.commit(0, "x", 1, seq=0)
    assert w.get() == "x"
    w.reserve(0, 1)
    with pytest.raises(RuntimeError, match="not a new number"):
        w.commit(0, "y", 1, seq=0)  # already delivered
    w.finish(0)
    w.close()
    with pytest.raises(BufferClosed):
        w.get()


def test_a_sharded_buffer_speaks_the_window_protocol_within_its_slices() -> None:
    # shard and video lanes run on ShardedBuffer through the same protocol: a result
    # larger than its reservation must wait for room in its lane's slice, not be put
    # into the reservation's place (here: 10 then 45 bytes in a 50-byte slice)
    from streambuf.buffer import ShardedBuffer

    buf: ShardedBuffer = ShardedBuffer(lanes=2, max_items=8, max_bytes=100, order="round_robin")

    def lane(t: int) -> Iterator:
        yield (t, 0, 10)
        yield (t, 1, 45)
        yield (t, 2, 5)

    runner = LaneRunner(
        [lambda t=t: lane(t) for t in range(2)], window=buf, sizeof=lambda it: it[2], name="t"
    )
    runner.start()
    time.sleep(0.2)  # both lanes made what fits; the consumer starts late
    got = run(runner, deadline_s=10)
    assert got == [(t, i, s) for i, s in enumerate((10, 45, 5)) for t in range(2)]
    lanes = buf.stats().lanes
    assert all(ln.peak_bytes <= ln.max_bytes for ln in lanes), lanes


# -- chunks: one reservation, one commit and one get for a run of items -------------------


class _ChunkSpy:
    """Counts the items of each ``commit_many`` (chunks really formed, or a test of them
    proves nothing)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        real = Window.commit_many

        def spy(w: Window, lane: int, items: list, sizes: list[int]) -> None:
            self.sizes.append(len(items))
            real(w, lane, items, sizes)

        monkeypatch.setattr(Window, "commit_many", spy)


@pytest.mark.parametrize("sizes", ["equal", "uneven"])
def test_chunks_fill_the_byte_bound_and_never_pass_it(
    sizes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three lanes making items in microseconds hand them over in chunks to a slow
    consumer: each chunk's items are counted one by one, so the pool fills to within one
    item of ``max_bytes`` (here >= 90%) and never passes it, in round-robin order."""
    spy = _ChunkSpy(monkeypatch)
    rng = random.Random(7)
    lengths = [60, 60, 60]
    size = {
        (t, i): 1000 if sizes == "equal" else rng.randrange(500, 1001)
        for t in range(3)
        for i in range(60)
    }
    check = Checker()
    window: Window = Window(lanes=3, max_items=64, max_bytes=10_500, order="round_robin")
    window._observer = check
    runner = LaneRunner(
        [lambda t=t: iter([(t, i) for i in range(lengths[t])]) for t in range(3)],
        window=window,
        sizeof=lambda item: size[item],
        name="chunks",
        chunk=16,
    )
    consume_delay[0] = 0.004  # a slow consumer: the lanes run ahead until the bound holds them
    try:
        got = run(runner, deadline_s=30)
    finally:
        consume_delay[0] = 0.0
    assert got == round_robin_reference(lengths, 0)
    assert check.violations == []
    stats = window.stats()
    assert 0.9 * 10_500 <= stats.peak_bytes <= 10_500, stats
    assert stats.oversize == 0 and stats.outside == 0
    assert max(spy.sizes) > 1, spy.sizes  # chunks formed


def test_a_chunk_leaves_room_for_the_items_delivered_before_its_last() -> None:
    """Round robin over 2 lanes with room for 8: lane 0 asking for 8 at once gets 4 (its
    4th is delivered after lane 1's first 3, which it must leave room for)."""
    w: Window = Window(lanes=2, max_items=8, max_bytes=10_000, order="round_robin")
    assert w.reserve(0, 10, 8) == 4
    assert w.held() == (4, 40)
    assert w.reserve(1, 10, 8) == 4  # nothing owed before lane 1's 4th but lane 0's, reserved
    w.close()


def test_get_many_lends_what_it_took_until_the_next_get() -> None:
    """A chunk's unused room is given back at commit; the items ``get_many`` returns after
    the first stay counted until the consumer's next get (it still holds them)."""
    w: Window = Window(lanes=1, max_items=4, max_bytes=1000, order="round_robin")
    assert w.reserve(0, 100, 4) == 4
    w.commit_many(0, ["a", "b", "c"], [100, 90, 80])
    assert w.held() == (3, 270)  # the 4th unit given back
    assert w.get_many(4) == ["a", "b", "c"]
    assert w.held() == (2, 170)  # "b" and "c" lent
    assert w.reserve(0, 100, 4) == 2  # room for 2 more, not 4
    w.release(0)
    w.finish(0)
    with pytest.raises(BufferClosed):
        w.get_many(4)
    assert w.held() == (0, 0)  # the lent items came back with the next get


def test_only_the_last_item_of_a_chunk_may_outgrow_its_room() -> None:
    w: Window = Window(lanes=1, max_items=8, max_bytes=1000, order="first_ready")
    assert w.reserve(0, 100, 3) == 3
    with pytest.raises(RuntimeError, match="only the last item"):
        w.commit_many(0, ["a", "b"], [150, 10])
    w.commit_many(0, ["a", "b"], [10, 150])  # the last one waits for room at its size
    assert w.held() == (2, 160)
    with pytest.raises(RuntimeError, match="sequence"):
        seq: Window = Window(lanes=1, max_items=8, max_bytes=1000, order="sequence")
        seq.reserve(0, 10, 2)
        seq.commit_many(0, ["x"], [1])
    w.close()


@pytest.mark.parametrize("order", ["round_robin", "first_ready"])
def test_a_lane_that_slowed_down_gives_back_its_chunk_room(
    order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane makes 40 items at once, its chunks growing 1, 2, 4, 8, 16 (room for 64:
    the window never limits them), then each item takes longer than ``FLUSH_S``. The
    chunk where it slowed down is handed over at its slow item (the 10th it made) and
    its unused room given back; the next reserves only what that one made (10), hands
    over its one slow item and gives the other 9 back; from then on the lane reserves
    room for the one item it is making: the window counts no more than that for it, so
    its room is there for the other lanes and the consumer. The lane's clock is the
    test's (a busy machine changes nothing); each item reads the window's own count of
    reserved room (``held`` less the admitted items) when the lane starts making it."""
    clock = [0.0]
    monkeypatch.setattr(lanes_mod, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    window: Window = Window(lanes=1, max_items=64, max_bytes=1 << 20, order=order)
    check = Checker()
    window._observer = check
    reserved: dict[int, int] = {}

    def work() -> Iterator[int]:
        for i in range(46):
            reserved[i] = window.held()[0] - window.stats().items  # (the only lane's)
            if i >= 40:
                clock[0] += 1.0  # a slow item: longer than FLUSH_S
            yield i

    runner = LaneRunner([work], window=window, sizeof=lambda x: 8, name="slow", chunk=16)
    assert run(runner) == list(range(46))
    assert reserved[0] == 1 and reserved[1] == 2 and reserved[15] >= 8  # the chunks grew
    assert reserved[41] == 10, reserved  # what the last chunk made, not the 16 it wanted
    assert [reserved[i] for i in range(42, 46)] == [1] * 4, reserved
    assert window.held() == (0, 0) and window.stats().items == 0
    assert check.violations == []


@pytest.mark.parametrize("order", ["round_robin", "first_ready"])
def test_a_waiting_consumer_takes_what_a_stalled_lane_holds(order: str) -> None:
    """A lane makes 41 items in microseconds (its chunk grows to 16), then its next read
    stalls for a second: the consumer, waiting for an item the lane holds in its chunk,
    takes the items made so far itself (``Window.hold``) instead of waiting for the
    stall to end; nothing is delivered twice, the order is kept."""
    consume_delay[0] = 0.0
    window: Window = Window(lanes=1, max_items=64, max_bytes=1 << 20, order=order)
    check = Checker()
    window._observer = check
    t0 = time.monotonic()
    at: dict[int, float] = {}

    def work() -> Iterator:
        yield from range(41)
        time.sleep(1.0)  # the next network read stalls
        yield 41

    runner = LaneRunner([work], window=window, sizeof=lambda x: 8, name="stall", chunk=16)

    def stamp() -> Iterator:
        for x in runner:
            at[x] = time.monotonic() - t0
            yield x

    got = []
    th = threading.Thread(target=lambda: got.extend(stamp()), daemon=True)
    th.start()
    th.join(10)
    runner.close()
    assert not th.is_alive(), "a hang"
    assert got == list(range(42))
    assert at[40] < 0.5 <= at[41], at  # only the stalled read's item waits for it
    assert check.violations == []
    assert window.stats().puts == 42


@pytest.mark.parametrize("order", ["round_robin", "first_ready"])
def test_a_consumer_waiting_before_the_hold_takes_what_a_stalled_lane_holds(order: str) -> None:
    """The consumer is already asleep (nothing held, nothing made) when a lane reserves a
    chunk, holds it, makes an item and stalls in its next read: ``hold`` wakes it, so it
    polls and takes the item after ``HOLD_POLL_S``, not after the stall (a window that
    was full leads here: the consumer gives back lent room and sleeps before the lane
    it woke can hold its next chunk; found by review)."""
    window: Window = Window(lanes=1, max_items=64, max_bytes=1 << 20, order=order)
    got: list = []
    t0 = time.monotonic()
    th = threading.Thread(
        target=lambda: got.extend([window.get_many(16), time.monotonic() - t0]), daemon=True
    )
    th.start()
    time.sleep(0.05)  # the consumer sleeps now: nothing is held yet
    assert window.reserve(0, 8, 16) == 16
    items: list = []
    sizes: list = []
    window.hold(0, items, sizes)
    sizes.append(8)
    items.append("a")
    th.join(0.5)  # (the stall: 10 ms + a wake-up is all it may take)
    late = th.is_alive()
    sizes.append(8)
    items.append("b")
    window.commit_many(0, items, sizes)
    th.join(10)
    assert not late, "the item made before the stall waited for it"
    assert got[0] == ["a"] and got[1] < 0.5, got
    assert window.get_many(16) == ["b"]  # the rest, once, from commit_many
    window.close()


def test_a_thread_driving_several_lanes_hands_over_one_item_of_each_in_turn() -> None:
    """One thread over two lanes makes one item of each in turn, chunked or not: a chunk
    of lane 0 would make its later items while lane 1 owes an earlier one, and when the
    chunk's last item outgrew its room (here the 5th, 450 of 500 bytes) it would wait in
    that thread for room that only the consumer frees, while the consumer waits for
    lane 1's item that thread never makes (a hang)."""

    def lane(t: int) -> Iterator:
        yield from ((t, i) for i in range(20))

    window: Window = Window(lanes=2, max_items=64, max_bytes=500, order="round_robin")
    window._observer = check = Checker()
    runner = LaneRunner(
        [lambda t=t: lane(t) for t in range(2)],
        window=window,
        sizeof=lambda x: 450 if x == (0, 4) else 100,
        name="group",
        threads=1,
        chunk=16,
        largest=100,
    )
    assert run(runner, deadline_s=10) == round_robin_reference([20, 20], 0)
    assert check.violations == []


@pytest.mark.parametrize("most", [0, -1, 1.5, "2", None])
def test_get_many_refuses_a_bad_count_like_the_buffer(most: object) -> None:
    """``get_many(0)`` returned one item ("up to most in all"); ``BoundedBuffer`` refuses
    the same values."""
    w: Window = Window(lanes=1, max_items=4, max_bytes=100, order="sequence")
    w.reserve(0, 10)
    w.commit(0, "a", 10, seq=0)
    with pytest.raises(ValueError, match="most"):
        w.get_many(most)  # type: ignore[arg-type]
    assert w.get_many(2) == ["a"]


@pytest.mark.parametrize("nbytes", [-50, 1.5, "10", None])
def test_reserve_refuses_a_bad_size_and_counts_nothing(nbytes: object) -> None:
    w: Window = Window(lanes=2, max_items=4, max_bytes=100, order="first_ready")
    with pytest.raises((TypeError, ValueError), match="nbytes"):
        w.reserve(0, nbytes)  # type: ignore[arg-type]
    assert w.held() == (0, 0)
    assert w.reserve(0, 10) == 1  # the lane was not left reserved
