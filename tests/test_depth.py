"""The depth controller driven by scripted consumer timings and memory readings."""

from __future__ import annotations

import itertools

import pytest

from streambuf.depth import DepthTuner

MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drive(tuner, clock, *, seconds, batch_s, wait_s, batch_bytes=MIB, step=None):
    """Consumer gets a batch every batch_s, having waited wait_s for each."""
    depths = []
    t_end = clock.t + seconds
    while clock.t < t_end:
        clock.t += batch_s
        tuner.observe(waited_s=wait_s, batch_bytes=batch_bytes)
        tuner.update()
        depths.append(tuner.depth)
    return depths


def test_grows_when_consumer_starves():
    clock = Clock()
    t = DepthTuner(min_depth=2, max_depth=32, max_bytes=1 << 30, interval_s=0.5, clock=clock)
    assert t.depth == 4
    drive(t, clock, seconds=5, batch_s=0.05, wait_s=0.02)
    assert t.depth == 32
    assert all(d.new_depth > d.old_depth for d in t.decisions)
    assert "waited" in t.decisions[0].reason


def test_does_not_grow_when_fed():
    clock = Clock()
    t = DepthTuner(min_depth=2, max_depth=32, max_bytes=1 << 30, interval_s=0.5, clock=clock)
    drive(t, clock, seconds=10, batch_s=0.05, wait_s=0.0)
    assert t.depth == 4 and t.decisions == []


def test_never_past_the_byte_budget():
    clock = Clock()
    t = DepthTuner(min_depth=1, max_depth=100, max_bytes=10 * MIB, interval_s=0.5, clock=clock)
    drive(t, clock, seconds=20, batch_s=0.05, wait_s=0.05, batch_bytes=3 * MIB)
    assert t.depth == 3  # 3 batches of 3 MiB fit in 10 MiB; a 4th would not
    assert max(d.new_depth for d in t.decisions) * 3 * MIB <= 10 * MIB


def test_shrinks_under_memory_pressure_and_holds():
    clock = Clock()
    available = {"bytes": 8 << 30}
    t = DepthTuner(
        min_depth=2,
        max_depth=64,
        max_bytes=1 << 40,
        interval_s=0.5,
        reserve_bytes=1 << 30,
        available_fn=lambda: available["bytes"],
        hold_intervals=4,
        clock=clock,
    )
    drive(t, clock, seconds=3, batch_s=0.05, wait_s=0.03)
    grown = t.depth
    assert grown > 4
    available["bytes"] = 512 << 20  # pressure
    drive(t, clock, seconds=0.5, batch_s=0.05, wait_s=0.03)
    assert t.depth == grown // 2
    assert "memory pressure" in t.decisions[-1].reason
    available["bytes"] = 8 << 30  # pressure gone, consumer still starving: holds first
    n = len(t.decisions)
    drive(t, clock, seconds=2.0, batch_s=0.05, wait_s=0.03)
    assert len(t.decisions) == n  # 4 windows of hold
    drive(t, clock, seconds=1.0, batch_s=0.05, wait_s=0.03)
    assert t.depth > grown // 2


def test_pressure_never_below_min_depth():
    clock = Clock()
    t = DepthTuner(
        min_depth=3,
        max_depth=8,
        max_bytes=1 << 30,
        interval_s=0.5,
        reserve_bytes=1 << 30,
        available_fn=lambda: 0,
        clock=clock,
    )
    drive(t, clock, seconds=5, batch_s=0.05, wait_s=0.0)
    assert t.depth == 3


@pytest.mark.parametrize("pattern", ["alternating", "noisy"])
def test_bounded_rate_no_oscillation(pattern):
    clock = Clock()
    t = DepthTuner(min_depth=2, max_depth=64, max_bytes=1 << 30, interval_s=0.5, clock=clock)
    for i in range(40):  # phases of starving and fed consumer, 1 s each
        starving = (i % 2 == 0) if pattern == "alternating" else (i % 3 != 0)
        drive(t, clock, seconds=1.0, batch_s=0.05, wait_s=0.02 if starving else 0.0)
    # at most one change per window, and the depth only moves one way without pressure
    times = [d.at_s for d in t.decisions]
    assert all(b - a >= 0.5 - 1e-9 for a, b in itertools.pairwise(times))
    assert all(d.new_depth > d.old_depth for d in t.decisions)
    assert len(t.decisions) <= 40 / 0.5


def test_bad_arguments():
    with pytest.raises(ValueError):
        DepthTuner(min_depth=0, max_depth=4, max_bytes=1)
    with pytest.raises(ValueError):
        DepthTuner(min_depth=5, max_depth=4, max_bytes=1)
    with pytest.raises(ValueError):
        DepthTuner(min_depth=1, max_depth=4, max_bytes=1, interval_s=0)
