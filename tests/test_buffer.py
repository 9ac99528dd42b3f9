from __future__ import annotations

import threading
import time

import pytest

import streambuf as sb
from streambuf import BoundedBuffer, BufferClosed, ShardedBuffer

pytestmark = pytest.mark.timeout(30)


def size_of(item) -> int:
    return item[-1]


def test_fifo_and_stats():
    buf = BoundedBuffer(max_items=3, max_bytes=100, sizeof=size_of)
    for i in range(3):
        buf.put((i, 10))
    s = buf.stats()
    assert (s.items, s.bytes, s.peak_items, s.peak_bytes) == (3, 30, 3, 30)
    assert [buf.get()[0] for _ in range(3)] == [0, 1, 2]
    s = buf.stats()
    assert (s.items, s.bytes, s.puts, s.gets) == (0, 0, 3, 3)


def test_put_blocks_on_count_and_bytes():
    buf = BoundedBuffer(max_items=2, max_bytes=100, sizeof=size_of)
    buf.put((0, 60))
    with pytest.raises(TimeoutError):
        buf.put((1, 50), timeout_s=0.05)  # bytes
    buf.put((1, 40))
    with pytest.raises(TimeoutError):
        buf.put((2, 0), timeout_s=0.05)  # count
    assert buf.stats().put_wait_s >= 0.09


def test_oversize_admitted_alone_only():
    buf = BoundedBuffer(max_items=4, max_bytes=100, sizeof=size_of)
    buf.put((0, 10))
    with pytest.raises(TimeoutError):
        buf.put((1, 500), timeout_s=0.05)
    assert buf.get() == (0, 10)
    buf.put((1, 500), timeout_s=1)  # empty now: admitted alone
    with pytest.raises(TimeoutError):
        buf.put((2, 1), timeout_s=0.05)
    s = buf.stats()
    assert s.oversize == 1 and s.bytes == 500


def test_big_item_not_starved_by_small_ones():
    buf = BoundedBuffer(max_items=10, max_bytes=100, sizeof=size_of)
    buf.put(("a", 60))
    order = []

    def big():
        buf.put(("big", 80), timeout_s=5)

    th = threading.Thread(target=big)
    th.start()
    time.sleep(0.05)
    # a small item now queues behind the big one (first come, first served)
    small = threading.Thread(target=lambda: buf.put(("small", 10), timeout_s=5))
    small.start()
    time.sleep(0.05)
    for _ in range(3):
        order.append(buf.get(timeout_s=5)[0])
    th.join(5)
    small.join(5)
    assert order == ["a", "big", "small"]


def test_get_timeout_and_empty_gets():
    buf = BoundedBuffer(max_items=1, max_bytes=10)
    with pytest.raises(TimeoutError):
        buf.get(timeout_s=0.05)
    assert buf.stats().empty_gets == 1
    assert buf.stats().get_wait_s >= 0.04


def test_close_wakes_waiters_and_drains():
    buf = BoundedBuffer(max_items=1, max_bytes=10, sizeof=size_of)
    buf.put((0, 1))
    errors = []

    def blocked_put():
        try:
            buf.put((1, 1), timeout_s=10)
        except BufferClosed as exc:
            errors.append(exc)

    th = threading.Thread(target=blocked_put)
    th.start()
    time.sleep(0.05)
    buf.close()
    buf.close()  # idempotent
    th.join(5)
    assert not th.is_alive() and len(errors) == 1
    with pytest.raises(BufferClosed):
        buf.put((2, 1))
    assert buf.get(timeout_s=1) == (0, 1)  # drains what is left
    with pytest.raises(BufferClosed):
        buf.get(timeout_s=1)
    assert list(buf) == []


def test_close_wakes_blocked_get():
    buf = BoundedBuffer(max_items=1, max_bytes=10)
    out = []
    th = threading.Thread(target=lambda: out.extend(buf))
    th.start()
    time.sleep(0.05)
    buf.close()
    th.join(5)
    assert not th.is_alive() and out == []


def test_set_limits_shrink_keeps_items_and_holds_puts():
    buf = BoundedBuffer(max_items=4, max_bytes=100, sizeof=size_of)
    for i in range(4):
        buf.put((i, 20))
    buf.set_limits(max_items=2, max_bytes=30)
    assert len(buf) == 4
    with pytest.raises(TimeoutError):
        buf.put((9, 1), timeout_s=0.05)
    buf.get()
    buf.get()
    buf.get()  # one left: 20 bytes, 1 item
    buf.put((4, 10), timeout_s=1)
    assert [buf.get()[0], buf.get()[0]] == [3, 4]


def test_set_limits_grow_admits_waiting_put():
    buf = BoundedBuffer(max_items=1, max_bytes=100, sizeof=size_of)
    buf.put((0, 1))
    th = threading.Thread(target=lambda: buf.put((1, 1), timeout_s=5))
    th.start()
    time.sleep(0.05)
    buf.set_limits(max_items=2)
    th.join(5)
    assert len(buf) == 2


def test_context_manager_and_bad_args():
    with BoundedBuffer(max_items=2, max_bytes="1KiB") as buf:
        assert buf.max_bytes == 1024
    assert buf.closed
    with pytest.raises(ValueError, match="max_bytes"):
        BoundedBuffer(max_items=1, max_bytes=0)
    with pytest.raises(ValueError, match="max_items"):
        BoundedBuffer(max_items=0, max_bytes=10)
    with pytest.raises(ValueError, match="not a byte size"):
        BoundedBuffer(max_items=1, max_bytes="lots")
    with pytest.raises(ValueError, match="lanes"):
        ShardedBuffer(lanes=4, max_items=3, max_bytes=10)
    with pytest.raises(ValueError, match="order"):
        ShardedBuffer(lanes=1, max_items=3, max_bytes=10, order="random")  # type: ignore[arg-type]


def test_abort_raises_in_consumer():
    buf = BoundedBuffer(max_items=2, max_bytes=10)
    buf.put(1)
    err = KeyError("boom")
    buf.abort(err)
    with pytest.raises(KeyError):
        buf.get(timeout_s=1)
    with pytest.raises(BufferClosed):
        buf.put(2)


def test_sharded_round_robin_order_and_skip_finished():
    buf = ShardedBuffer(lanes=3, max_items=30, max_bytes=1000)
    lanes = [["a0", "a1", "a2", "a3"], ["b0"], ["c0", "c1"]]
    for i, items in enumerate(lanes):
        for x in items:
            buf.put(i, x)
        buf.finish(i)
    assert list(buf) == ["a0", "b0", "c0", "a1", "c1", "a2", "a3"]


def test_sharded_round_robin_sharded_budget_no_deadlock():
    # lane 1 is slow; lane 0 fills its own slice but cannot take lane 1's.
    buf = ShardedBuffer(lanes=2, max_items=4, max_bytes=200, sizeof=size_of)

    def producer(lane, n, delay):
        for i in range(n):
            time.sleep(delay)
            buf.put(lane, (lane, i, 50), timeout_s=10)
        buf.finish(lane)

    ths = [
        threading.Thread(target=producer, args=(0, 20, 0.0)),
        threading.Thread(target=producer, args=(1, 20, 0.005)),
    ]
    for t in ths:
        t.start()
    got = [buf.get(timeout_s=10)[:2] for _ in range(40)]
    for t in ths:
        t.join(5)
    assert got == [(i % 2, i // 2) for i in range(40)]
    lanes = buf.stats().lanes
    assert all(ln.peak_items <= 2 and ln.peak_bytes <= 100 for ln in lanes)


def test_sharded_first_ready_no_head_of_line_blocking():
    buf = ShardedBuffer(lanes=2, max_items=4, max_bytes=1000, order="first_ready")
    buf.put(1, "fast")
    assert buf.get(timeout_s=1) == "fast"  # lane 0 has nothing yet: not waited for
    buf.finish(0)
    buf.finish(1)
    assert list(buf) == []


def test_sharded_put_errors():
    buf = ShardedBuffer(lanes=2, max_items=4, max_bytes=100)
    with pytest.raises(IndexError):
        buf.put(2, "x")
    buf.finish(0)
    with pytest.raises(BufferClosed, match="lane 0"):
        buf.put(0, "x")


@pytest.mark.parametrize("order", ["round_robin", "first_ready"])
def test_bounds_are_exact_not_one_over(order):
    """Exactly the bound fits and one more item (or one more byte) waits: per lane when
    sharded (round robin), for the pool when first_ready."""
    buf = ShardedBuffer(lanes=2, max_items=4, max_bytes=400, order=order, sizeof=len)
    slots = 2 if order == "round_robin" else 4
    for _ in range(slots):
        buf.put(0, b"x", timeout_s=1)
    with pytest.raises(TimeoutError):
        buf.put(0, b"x", timeout_s=0.05)  # one item over the count bound
    byte_buf = ShardedBuffer(lanes=2, max_items=8, max_bytes=400, order=order, sizeof=len)
    room = 200 if order == "round_robin" else 400
    byte_buf.put(0, b"x" * (room - 1), timeout_s=1)
    byte_buf.put(0, b"x", timeout_s=1)  # exactly at the bound
    with pytest.raises(TimeoutError):
        byte_buf.put(0, b"x", timeout_s=0.05)  # one byte over


def test_bounded_buffer_reservations_hold_room_until_put_or_cancel():
    """``reserve`` takes room before the item is built; ``put(reserved=)`` turns it into
    the item (its real size counted), ``cancel`` gives it back."""
    buf = BoundedBuffer(max_items=2, max_bytes=30, sizeof=len)
    buf.reserve(20)
    with pytest.raises(TimeoutError):
        buf.put(b"x" * 11, timeout_s=0.05)  # 20 reserved + 11 > 30
    buf.put(b"y" * 15, reserved=20)  # the reservation becomes a 15-byte item
    s = buf.stats()
    assert (s.items, s.bytes, s.puts) == (1, 15, 1)
    buf.reserve(10)
    with pytest.raises(TimeoutError):
        buf.put(b"z", timeout_s=0.05)  # 1 item + 1 reservation: the count bound
    buf.cancel(10)
    buf.put(b"z" * 15, timeout_s=1)
    assert buf.get_many(5) == [b"y" * 15, b"z" * 15]
    assert buf.stats().bytes == 0


def test_bounded_buffer_bounds_are_exact():
    buf = BoundedBuffer(max_items=3, max_bytes=30, sizeof=len)
    for _ in range(3):
        buf.put(b"x", timeout_s=1)
    with pytest.raises(TimeoutError):
        buf.put(b"x", timeout_s=0.05)
    buf2 = BoundedBuffer(max_items=5, max_bytes=30, sizeof=len)
    buf2.put(b"x" * 30, timeout_s=1)
    with pytest.raises(TimeoutError):
        buf2.put(b"x", timeout_s=0.05)


def test_default_sizer_counts_every_item_exactly():
    """The lean path sizes ints, str, bytes and tensors from ``nbytes.exact``: the same
    bytes as ``nbytes``, and the byte bound binds on them exactly."""
    import sys

    import torch

    from streambuf import nbytes

    items = [7, 10**30, "héllo", b"abcd", torch.zeros(16), None]
    buf = BoundedBuffer(max_items=100, max_bytes=1 << 20)
    buf.put(items[0])
    buf.put_many(items[1:])
    assert buf.stats().bytes == sum(nbytes(x) for x in items) > 64 + 4 + sys.getsizeof(7)
    assert buf.get_many(100) == items[:4] + items[4:] and buf.stats().bytes == 0
    three = 3 * sys.getsizeof(123)
    buf = BoundedBuffer(max_items=100, max_bytes=three)
    buf.put_many([123, 124])
    buf.put(125)  # exactly at the bound
    assert buf.stats().bytes == three
    with pytest.raises(TimeoutError):
        buf.put(126, timeout_s=0.05)  # one int over
    with pytest.raises(TimeoutError):
        buf.put_many([126], timeout_s=0.05)


def test_put_many_get_many_fifo_and_stats():
    buf = BoundedBuffer(max_items=10, max_bytes=100, sizeof=size_of)
    buf.put((0, 5))
    buf.put_many([(1, 10), (2, 15)])
    buf.put_many([])
    buf.put_many(iter([(3, 20)]))
    s = buf.stats()
    assert (s.items, s.bytes, s.puts, s.peak_items, s.peak_bytes) == (4, 50, 4, 4, 50)
    assert buf.get_many(2) == [(0, 5), (1, 10)]
    assert buf.get() == (2, 15)
    assert buf.get_many(10) == [(3, 20)]
    s = buf.stats()
    assert (s.items, s.bytes, s.gets, s.peak_bytes) == (0, 0, 4, 50)


def test_put_many_sizes_each_item_with_the_default_sizer():
    """The default sizer's per-type fast path (a run of one type mapped at once) gives
    each item its own size: ``put`` one by one and ``put_many`` count the same bytes."""
    items = [b"x" * n for n in (1, 700, 30, 4096)] + [bytearray(9), "abc", 7, 2**200]
    one, many = (
        BoundedBuffer(max_items=20, max_bytes="1MiB"),
        BoundedBuffer(max_items=20, max_bytes="1MiB"),
    )
    for x in items:
        one.put(x)
    many.put_many(items[:4])  # one type, sizes differ
    many.put_many(items[4:])  # mixed types
    assert many.stats().bytes == one.stats().bytes == sum(sb.nbytes(x) for x in items)
    assert many.get_many(20) == items


def test_get_many_respects_max_items():
    buf = BoundedBuffer(max_items=10, max_bytes=100, sizeof=size_of)
    buf.put_many([(i, 1) for i in range(5)])
    assert [x[0] for x in buf.get_many(1)] == [0]
    assert [x[0] for x in buf.get_many(2)] == [1, 2]
    assert len(buf) == 2 and buf.stats().bytes == 2
    assert [x[0] for x in buf.get_many(3)] == [3, 4]  # what is ready, fewer than asked
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_items"):
            buf.get_many(bad)


def test_put_many_bounds_are_exact_not_one_over():
    buf = BoundedBuffer(max_items=3, max_bytes=30, sizeof=len)
    buf.put_many([b"x"] * 3, timeout_s=1)  # exactly the count bound
    with pytest.raises(TimeoutError) as info:
        buf.put_many([b"x"], timeout_s=0.05)
    assert info.value.admitted == 0 and len(buf) == 3  # type: ignore[attr-defined]
    buf2 = BoundedBuffer(max_items=10, max_bytes=30, sizeof=len)
    with pytest.raises(TimeoutError) as info:
        buf2.put_many([b"x" * 10, b"x" * 10, b"x" * 10, b"x"], timeout_s=0.05)
    assert info.value.admitted == 3  # type: ignore[attr-defined]
    # named for the call and the timeout given (not put() and the time left)
    assert "put_many() found no room for its item 3 within 0.05 s" in str(info.value)
    assert (len(buf2), buf2.nbytes, buf2.stats().peak_bytes) == (3, 30, 30)
    buf3 = BoundedBuffer(max_items=10, max_bytes=30, sizeof=len)
    with pytest.raises(TimeoutError) as info:
        buf3.put_many([b"x" * 29, b"xx"], timeout_s=0.05)  # one byte over
    assert info.value.admitted == 1 and buf3.nbytes == 29  # type: ignore[attr-defined]
    buf4 = BoundedBuffer(max_items=10, max_bytes=30, sizeof=len)
    buf4.put_many([b"x" * 5] * 6)  # 30 bytes in 6 items: fits exactly
    assert buf4.nbytes == 30


def test_put_many_oversize_alone_and_blocks_like_put():
    buf = BoundedBuffer(max_items=2, max_bytes=100, sizeof=size_of)
    got = []

    def consume():
        while True:
            try:
                got.extend(buf.get_many(2, timeout_s=5))
            except BufferClosed:
                return
            time.sleep(0.002)

    th = threading.Thread(target=consume)
    th.start()
    items = [(i, 500 if i == 3 else 10) for i in range(10)]
    buf.put_many(items, timeout_s=5)  # more items than fit: waits for the consumer
    buf.close()
    th.join(5)
    assert got == items
    s = buf.stats()
    assert s.oversize == 1 and s.peak_items <= 2 and s.put_wait_s > 0


def test_put_many_queues_behind_waiting_producers():
    buf = BoundedBuffer(max_items=10, max_bytes=100, sizeof=size_of)
    buf.put(("a", 60))
    big = threading.Thread(target=lambda: buf.put(("big", 80), timeout_s=5))
    big.start()
    time.sleep(0.05)
    # these would fit now (60 + 20 <= 100), but "big" came first
    small = threading.Thread(target=lambda: buf.put_many([("s1", 10), ("s2", 10)], timeout_s=5))
    small.start()
    time.sleep(0.05)
    assert len(buf) == 1
    order = [buf.get(timeout_s=5)[0] for _ in range(2)]
    order += [x[0] for x in buf.get_many(5, timeout_s=5)]
    while len(order) < 4:
        order += [x[0] for x in buf.get_many(5, timeout_s=5)]
    big.join(5)
    small.join(5)
    assert order == ["a", "big", "s1", "s2"]


def test_get_many_blocks_times_out_and_drains_on_close():
    buf = BoundedBuffer(max_items=4, max_bytes=100)
    with pytest.raises(TimeoutError):
        buf.get_many(3, timeout_s=0.05)
    assert buf.stats().empty_gets == 1
    th = threading.Thread(target=lambda: (time.sleep(0.05), buf.put_many([1, 2])))
    th.start()
    first = buf.get_many(3, timeout_s=5)  # woken by the put_many
    th.join(5)
    assert first in ([1, 2], [1])
    rest = [] if first == [1, 2] else buf.get_many(3, timeout_s=5)
    assert first + rest == [1, 2]
    buf.put_many([3, 4])
    buf.close()
    with pytest.raises(BufferClosed) as info:
        buf.put_many([5])
    assert info.value.admitted == 0  # type: ignore[attr-defined]
    assert buf.get_many(10) == [3, 4]  # drains what is left
    with pytest.raises(BufferClosed):
        buf.get_many(10, timeout_s=1)


def test_close_wakes_blocked_put_many_and_get_many():
    buf = BoundedBuffer(max_items=2, max_bytes=100)
    errors = []

    def blocked_put():
        try:
            buf.put_many([1, 2, 3, 4], timeout_s=10)
        except BufferClosed as exc:
            errors.append(exc)

    th = threading.Thread(target=blocked_put)
    th.start()
    time.sleep(0.05)
    buf.close()
    th.join(5)
    assert not th.is_alive() and errors[0].admitted == 2  # type: ignore[attr-defined]
    assert buf.get_many(5) == [1, 2]
    empty = BoundedBuffer(max_items=2, max_bytes=100)
    out = []
    getter = threading.Thread(target=lambda: out.append(_get_many_or_closed(empty)))
    getter.start()
    time.sleep(0.05)
    empty.close()
    getter.join(5)
    assert not getter.is_alive() and out == ["closed"]


def _get_many_or_closed(buf):
    try:
        return buf.get_many(4, timeout_s=10)
    except BufferClosed:
        return "closed"


def test_abort_raises_in_get_many():
    buf = BoundedBuffer(max_items=2, max_bytes=100)
    buf.put_many([1, 2])
    buf.abort(KeyError("boom"))
    with pytest.raises(KeyError):
        buf.get_many(2, timeout_s=1)


def test_several_consumers_none_left_asleep_with_items_ready():
    """A put wakes one sleeping consumer per item: with several asleep, each item reaches
    one of them (none sleeps while an item waits)."""
    buf = BoundedBuffer(max_items=64, max_bytes=1 << 20)
    got: list[int] = []
    lock = threading.Lock()

    def consume(batch):
        while True:
            try:
                xs = buf.get_many(batch, timeout_s=10) if batch else [buf.get(timeout_s=10)]
            except BufferClosed:
                return
            with lock:
                got.extend(xs)

    ths = [threading.Thread(target=consume, args=(b,)) for b in (0, 0, 3, 5)]
    for t in ths:
        t.start()
    for i in range(0, 2000, 7):
        time.sleep(0.0005 if i % 91 == 0 else 0)
        if i % 2:
            buf.put_many(range(i, min(i + 7, 2000)))
        else:
            for x in range(i, min(i + 7, 2000)):
                buf.put(x)
    buf.close()
    for t in ths:
        t.join(15)
        assert not t.is_alive()
    assert sorted(got) == list(range(2000))
