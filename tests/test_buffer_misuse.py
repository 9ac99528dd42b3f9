"""Misused reservations and lanes are refused, and the buffer's bounds and counts stay
exact: a negative or non-int ``reserve``, a ``cancel``/``put(reserved=)``/``commit``
with no reservation (or more bytes than it took), a ``release`` after a ``cancel``, a
lane that is not an int in range, on every method that takes one.

Found by a fault-probe pass: ``reserve(-1000)`` let eight 100-byte items into a 100-byte
buffer, ``cancel(1)`` with nothing reserved let a third item into ``max_items=2``,
``reserve("10")`` failed after counting a slot (lost for good), ``finish(-1)`` finished
the last lane, and ``cancel`` then ``release`` gave the same room back twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from streambuf import BoundedBuffer, ShardedBuffer

BAD_SIZES: list[Any] = [-1000, -1, "10", 1.5, True, None]


def _bounded() -> BoundedBuffer[Any]:
    return BoundedBuffer(max_items=2, max_bytes=100, sizeof=lambda x: 10)


def _sharded(order: str = "first_ready") -> ShardedBuffer[Any]:
    return ShardedBuffer(
        lanes=2,
        max_items=2,
        max_bytes=100,
        order=order,
        sizeof=lambda x: 10,  # type: ignore[arg-type]
    )


def _holds_its_bounds(buf: Any, put: Callable[[Any], None]) -> None:
    """Empty, and exactly ``max_items`` (2) items fit: the refused calls left nothing."""
    st = buf.stats()
    assert (st.items, st.bytes) == (0, 0), st
    put(1)
    put(2)
    with pytest.raises(TimeoutError):
        put(3)
    assert buf.stats().items == 2 and buf.stats().bytes == 20


@pytest.mark.timeout(30)
@pytest.mark.parametrize("nbytes", BAD_SIZES)
def test_a_bad_reservation_size_is_refused_before_anything_is_counted(nbytes: Any) -> None:
    buf = _bounded()
    with pytest.raises((TypeError, ValueError), match="nbytes"):
        buf.reserve(nbytes)
    _holds_its_bounds(buf, lambda x: buf.put(x, timeout_s=0.05))
    sh = _sharded()
    with pytest.raises((TypeError, ValueError), match="nbytes"):
        sh.reserve(0, nbytes)
    _holds_its_bounds(sh, lambda x: sh.put(0, x, timeout_s=0.05))


@pytest.mark.timeout(30)
def test_giving_back_what_was_not_reserved_is_refused() -> None:
    buf = _bounded()
    with pytest.raises(ValueError, match="holds no reservation"):
        buf.cancel(1)
    with pytest.raises(ValueError, match="holds no reservation"):
        buf.put("x", reserved=40)
    assert buf.stats().puts == 0
    buf.reserve(30)
    with pytest.raises(ValueError, match=r"gives back 31 bytes.*hold 30"):
        buf.cancel(31)
    with pytest.raises((TypeError, ValueError), match="reserved"):
        buf.put("x", reserved=-5)
    buf.cancel(30)
    with pytest.raises(ValueError, match="holds no reservation"):
        buf.cancel(30)  # twice
    _holds_its_bounds(buf, lambda x: buf.put(x, timeout_s=0.05))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("order", ["round_robin", "first_ready"])
def test_sharded_reservations_give_back_once(order: str) -> None:
    sh = _sharded(order)
    with pytest.raises(ValueError, match=r"commit.*no reservation"):
        sh.commit(0, "x", 10)
    sh.reserve(0, 10)
    sh.cancel(0, 10)
    sh.release(0)  # after a cancel: nothing left to give back
    with pytest.raises(ValueError, match="holds no reservation"):
        sh.cancel(0, 10)
    sh.reserve(0, 10)
    sh.commit(0, "made", 10)
    assert sh.get(timeout_s=5) == "made"
    if order == "first_ready":  # one pool of 2
        _holds_its_bounds(sh, lambda x: sh.put(1, x, timeout_s=0.05))
    else:  # each lane owns one slot
        assert (sh.stats().items, sh.stats().bytes) == (0, 0)
        sh.put(0, "a", timeout_s=0.05)
        with pytest.raises(TimeoutError):
            sh.put(0, "b", timeout_s=0.05)


LANE_CALLS: dict[str, Callable[[ShardedBuffer[Any], Any], Any]] = {
    "put": lambda b, lane: b.put(lane, "x", timeout_s=0.05),
    "reserve": lambda b, lane: b.reserve(lane, 10, timeout_s=0.05),
    "cancel": lambda b, lane: b.cancel(lane, 10),
    "commit": lambda b, lane: b.commit(lane, "x", 10),
    "release": lambda b, lane: b.release(lane),
    "finish": lambda b, lane: b.finish(lane),
    "share": lambda b, lane: b.share(lane),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("call", list(LANE_CALLS))
@pytest.mark.parametrize("lane", [-1, 2, 1.0, "1", True, None])
def test_every_method_that_takes_a_lane_checks_it(call: str, lane: Any) -> None:
    sh = _sharded("round_robin")
    error = IndexError if type(lane) is int else TypeError
    with pytest.raises(error, match="lane"):
        LANE_CALLS[call](sh, lane)
    sh.put(0, "a")
    sh.put(1, "b")
    sh.finish(0)
    sh.finish(1)
    assert list(sh) == ["a", "b"]  # no lane was finished, or filled, by the refused call


@pytest.mark.parametrize("start", [1.5, "1", None, True])
def test_start_lane_is_checked_when_the_buffer_is_built(start: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="start_lane"):
        ShardedBuffer(lanes=2, max_items=2, max_bytes=100, start_lane=start)


@pytest.mark.timeout(30)
def test_two_reservations_on_a_lane_are_given_back_each_once() -> None:
    """``cancel`` takes back its own reservation's record, not the lane's other one
    (which ``commit``/``release`` then still find)."""
    sh = ShardedBuffer(lanes=1, max_items=4, max_bytes=300)
    sh.reserve(0, 100)
    sh.reserve(0, 200)
    sh.cancel(0, 100)
    sh.commit(0, b"x" * 50, 50)  # the 200-byte reservation
    assert sh.get(timeout_s=5) == b"x" * 50
    sh.reserve(0, 100)
    sh.reserve(0, 200)
    sh.cancel(0, 100)
    sh.release(0)
    assert (sh.stats().items, sh.stats().bytes) == (0, 0)
    sh.put(0, b"y" * 150, timeout_s=1)  # the whole room is back


def test_numpy_integers_are_lanes_and_sizes() -> None:
    np = pytest.importorskip("numpy")
    sh = ShardedBuffer(lanes=3, max_items=6, max_bytes=300, start_lane=np.int64(-1))
    sh.reserve(np.int64(1), np.int64(10))
    sh.cancel(np.int64(1), np.int64(10))
    for lane in range(3):
        sh.put(np.int64(lane), lane)
        sh.finish(np.int64(lane))
    assert list(sh) == [2, 0, 1]  # start_lane=-1: the last lane first
    buf = BoundedBuffer(max_items=2, max_bytes=100)
    buf.reserve(np.int64(10))
    buf.put("x", reserved=np.int64(10))
    assert buf.get() == "x" and buf.stats().bytes == 0
