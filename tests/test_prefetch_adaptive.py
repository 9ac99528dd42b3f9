"""``ThreadPrefetcher(adaptive=True)`` / ``map(threads=k)``: a cheap function that holds the GIL
runs inline in the consumer, a waiting one stays on the threads, the choice follows a
change of the function's cost, and order, bounds, errors, shutdown and resume are the
same in both modes. ``InlineChooser``'s decisions on a fake clock."""

from __future__ import annotations

import threading
import time

import pytest

import streambuf as sb
from streambuf._inline import InlineChooser
from streambuf.prefetch import ThreadPrefetcher
from tests.resume_harness import check_save_load

pytestmark = pytest.mark.timeout(120)


def cheap(x: int) -> int:
    return x * 2


def sleepy(x: int) -> int:
    time.sleep(0.004)
    return x * 2


def run(
    n: int, fn, *, ordered: bool = True, adaptive: bool = True, **kw
) -> tuple[list, ThreadPrefetcher]:  # type: ignore[no-untyped-def]
    p = ThreadPrefetcher(
        range(n),
        max_items=16,
        max_bytes="1MiB",
        threads=8,
        fn=fn,
        ordered=ordered,
        adaptive=adaptive,
        **kw,
    )
    return list(p), p


@pytest.mark.parametrize("ordered", [True, False])
def test_cheap_function_goes_inline_and_nothing_changes(ordered: bool) -> None:
    out, p = run(20_000, cheap, ordered=ordered)
    want = [2 * i for i in range(20_000)]
    assert (out == want) if ordered else (sorted(out) == want)
    assert p.inline_items > 10_000, p.inline_items


@pytest.mark.serial
def test_waiting_function_stays_on_threads() -> None:
    t0 = time.perf_counter()
    out, p = run(400, sleepy)
    adaptive_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run(400, sleepy, adaptive=False)
    fixed_s = time.perf_counter() - t0
    assert out == [2 * i for i in range(400)]
    assert p.inline_items <= 4, p.inline_items  # a probe costs about one item
    assert adaptive_s < 1.5 * fixed_s + 0.2, (adaptive_s, fixed_s)
    assert adaptive_s < 0.5 * 400 * 0.004  # well ahead of running inline


class Shifting:
    """Cheap for the first ``n`` items, then 3 ms of sleep each: the chooser must go
    inline, then back to the threads."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, x: int) -> int:
        if x >= self.n:
            time.sleep(0.003)
        return x


@pytest.mark.serial
def test_choice_follows_a_change_of_cost_and_keeps_order() -> None:
    n_cheap, n = 30_001, 30_001 + 300  # odd: the switch back is mid round robin
    p = ThreadPrefetcher(
        range(n), max_items=16, max_bytes="1MiB", threads=8, fn=Shifting(n_cheap), adaptive=True
    )
    p.chooser = InlineChooser(32, min_window_s=0.01, min_interval_s=0.05, max_interval_s=0.05)
    out = list(p)
    assert out == list(range(n))
    assert p.inline_items > 15_000  # the cheap part ran inline
    assert p.inline_items < n_cheap + 100, p.inline_items  # most of the slow part did not
    assert p.chooser.switches >= 2


def test_bounds_hold_in_both_modes() -> None:
    import torch

    items = (torch.zeros(1024, dtype=torch.uint8) for _ in range(5000))  # 1 KiB each
    p = ThreadPrefetcher(
        items, max_items=8, max_bytes=4096, threads=4, fn=lambda t: t + 1, adaptive=True
    )
    assert sum(1 for _ in p) == 5000
    stats = p.stats()
    assert stats.peak_bytes <= 4096 and stats.peak_items <= 8 and p.inline_items > 0


class Boom(Exception):
    pass


def explode_at(k: int):  # type: ignore[no-untyped-def]
    def fn(x: int) -> int:
        if x == k:
            raise Boom(f"item {x}")
        return x

    return fn


def test_error_inline_keeps_its_type_and_says_where() -> None:
    with pytest.raises(Boom) as info:
        run(20_000, explode_at(15_000))
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "item #15000" in notes and "inline" in notes


def test_source_error_inline_surfaces() -> None:
    def source():  # type: ignore[no-untyped-def]
        yield from range(10_000)
        raise Boom("source")

    with pytest.raises(Boom, match="source"):
        list(
            ThreadPrefetcher(
                source(), max_items=16, max_bytes="1MiB", threads=4, fn=cheap, adaptive=True
            )
        )


def _streambuf_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streambuf-") and t.is_alive()]


@pytest.mark.parametrize("stop_at", [5, 200, 10_000])
def test_break_in_any_mode_stops_every_thread(stop_at: int) -> None:
    before = set(_streambuf_threads())
    p = ThreadPrefetcher(
        range(100_000), max_items=16, max_bytes="1MiB", threads=6, fn=cheap, adaptive=True
    )
    for i, _ in enumerate(p):
        if i == stop_at:
            break
    p.close()
    deadline = time.monotonic() + 5
    while set(_streambuf_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(_streambuf_threads()) - before


def test_adaptive_off_never_inlines() -> None:
    out, p = run(5000, cheap, adaptive=False)
    assert out == [2 * i for i in range(5000)] and p.inline_items == 0 and p.chooser is None
    assert (
        sb.Pipeline(list(range(3))).map(cheap, threads=2, adaptive=False)._stages[0].adaptive
        is False
    )


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def drive(chooser: InlineChooser, clock: FakeClock, per_item_s: float, n: int) -> list[str]:
    actions = []
    for _ in range(n):
        if chooser.state == "drain":
            chooser.drained()
        clock.t += per_item_s
        actions.append(chooser.tick())
    return actions


def test_chooser_keeps_inline_when_faster_and_rechecks_with_backoff() -> None:
    clock = FakeClock()
    c = InlineChooser(8, clock=clock, min_window_s=0, min_interval_s=1.0, max_interval_s=4.0)
    # threaded: 1 ms per item (warm-up 8, measure 8) -> pause
    assert drive(c, clock, 0.001, 16)[-1] == "pause" and c.state == "drain"
    drive(c, clock, 0.0002, 8)  # inline probe: 5x faster -> kept
    assert c.inline and c.state == "keep_inline"
    # after 1 s inline it goes back to the threads to check them
    acts = drive(c, clock, 0.0002, 5001)
    assert "resume" in acts and not c.inline


def test_chooser_gives_up_an_inline_probe_that_falls_behind() -> None:
    clock = FakeClock()
    c = InlineChooser(8, clock=clock, min_window_s=0)
    drive(c, clock, 0.001, 16)  # threaded 1 ms per item
    c.drained()
    clock.t += 0.010  # the first inline item takes 10 ms: behind by more than two items
    assert c.tick() == "resume" and not c.inline and c.state == "keep_threads"


def test_resume_through_an_adaptive_map() -> None:
    check_save_load(_adaptive_loader, {"workers": 0}, [3, 40, "last"])


def _adaptive_loader(*, workers: int):  # type: ignore[no-untyped-def]
    from tests.resume_data import cheap_pipe

    return sb.Loader(
        cheap_pipe(), num_workers=workers, max_batches=4, max_bytes="4MiB", timeout_s=60
    )


def test_chooser_windows_last_at_least_min_window_s() -> None:
    clock = FakeClock()
    c = InlineChooser(8, clock=clock, min_window_s=0.05)
    acts = drive(c, clock, 0.001, 8 + 49)  # warm 8, then 49 ms of items: not yet
    assert "pause" not in acts and c.state == "measure"
    assert drive(c, clock, 0.001, 1) == ["pause"]
