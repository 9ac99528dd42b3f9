"""Property tests of streambuf.nodes' Prefetcher and ParallelMapper: random item sizes
(some larger than max_bytes), thread counts, bounds, map and consumer speeds, and an early
``reset`` (then a resume from the state saved there).

An observer runs under each buffer's lock after every reservation, admission and removal
and checks, over everything a domain holds (queued items *and* reservations for items
being pulled or mapped): items <= its item limit and bytes <= its byte limit, unless it
holds one item alone (oversize, which must then be counted). The consumer checks that
nothing is lost or repeated, and the order with ``in_order=True``: after the early reset
a full epoch, and after a resume from the saved state exactly what was not delivered.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper

import streambuf as sb
from streambuf.nodes import _run
from streambuf.window import Window

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_thread_leak")]

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Checker:
    """Called under a buffer's lock after every mutation; records violations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.checks = 0
        self.oversize_seen = 0

    def __call__(self, eng) -> None:
        self.checks += 1
        assert isinstance(eng, Window)  # one pool: reservations + admitted results
        domains = [(eng._held, eng._bytes, eng.max_items, eng.max_bytes)]
        counted = eng._oversize
        for n, nbytes, max_items, max_bytes in domains:
            if n > 1 and (n > max_items or nbytes > max_bytes):
                with self.lock:
                    self.violations.append(f"{n} held ({nbytes} B) > {max_items}, {max_bytes} B")
            if nbytes > max_bytes:
                self.oversize_seen += 1
                if counted == 0:
                    with self.lock:
                        self.violations.append(f"oversize {nbytes} B alone, not counted")


@pytest.fixture
def checker(monkeypatch):
    check = Checker()

    class ObservedWindow(Window):
        def __init__(self, **kw):
            super().__init__(**kw)
            self._observer = check

    monkeypatch.setattr(_run, "Window", ObservedWindow)
    return check


@contextmanager
def deadline(seconds: float):
    """Every ``next()`` inside finishes in time (SIGALRM interrupts a blocked wait)."""

    def expired(signum, frame):
        raise TimeoutError(f"no item within {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def size_of(item) -> int:
    return item[1]


class Delay:
    def __init__(self, max_s: float, seed: int) -> None:
        self.max_s, self.rng, self.lock = max_s, random.Random(seed), threading.Lock()

    def __call__(self, item):
        with self.lock:
            d = self.rng.random() * self.max_s
        if d:
            time.sleep(d)
        return item


case = st.fixed_dictionaries(
    {
        "node": st.sampled_from(["prefetcher", "in_order", "as_ready"]),
        "threads": st.integers(1, 4),
        "max_items": st.integers(1, 8),
        "max_bytes": st.integers(20, 400),
        "sizes": st.lists(st.one_of(st.integers(0, 40), st.integers(0, 700)), max_size=40),
        "map_delay": st.sampled_from([0.0, 0.0, 0.001]),
        "consumer_delay": st.sampled_from([0.0, 0.0005, 0.002]),
        "reset_after": st.one_of(st.none(), st.integers(0, 40)),
        "seed": st.integers(0, 1000),
    }
)


def make(c):
    src = IterableWrapper([(i, s) for i, s in enumerate(c["sizes"])])
    if c["node"] == "prefetcher":
        return sb.nodes.Prefetcher(
            src, max_items=c["max_items"], max_bytes=c["max_bytes"], sizeof=size_of
        )
    in_order = c["node"] == "in_order"
    return sb.nodes.ParallelMapper(
        src,
        Delay(c["map_delay"], c["seed"]),
        threads=c["threads"],
        max_items=max(c["max_items"], c["threads"]) if in_order else c["max_items"],
        max_bytes=c["max_bytes"],
        in_order=in_order,
        sizeof=size_of,
    )


def consume(node, c, limit=None):
    rng = random.Random(c["seed"])
    got = []
    while limit is None or len(got) < limit:
        try:
            got.append(next(node))
        except StopIteration:
            break
        if c["consumer_delay"]:
            time.sleep(rng.random() * c["consumer_delay"])
    return got


# Pinned cases (run first, every time): results far larger than the reservations made
# from the small ones before them, with several held at once, in each node kind.
_GROWING = [10] * 6 + [300] * 6 + [10] * 6


@SETTINGS
@example(
    c={
        "node": "as_ready",
        "threads": 4,
        "max_items": 8,
        "max_bytes": 100,
        "sizes": _GROWING,
        "map_delay": 0.001,
        "consumer_delay": 0.002,
        "reset_after": None,
        "seed": 1,
    }
)
@example(
    c={
        "node": "in_order",
        "threads": 4,
        "max_items": 8,
        "max_bytes": 100,
        "sizes": _GROWING,
        "map_delay": 0.001,
        "consumer_delay": 0.002,
        "reset_after": None,
        "seed": 2,
    }
)
@given(c=case)
def test_bounds_hold_and_nothing_is_lost_or_repeated(checker, c):
    full = [(i, s) for i, s in enumerate(c["sizes"])]
    ordered = c["node"] != "as_ready"

    def same(got, want, what):
        if ordered:
            assert got == want, what
        else:
            assert Counter(got) == Counter(want), what

    node = make(c)
    with deadline(20):
        head = consume(node, c, limit=c["reset_after"])
        state = node.state_dict()
        if c["reset_after"] is not None:
            node.reset()  # early: threads stopped, held items dropped, from the start
            same(consume(node, c), full, "a full epoch after an early reset")
            node.reset(state)
            rest = consume(node, c)
            same(head + rest, full, "head + resumed rest")
        else:
            same(head, full, "one epoch")
    node.shutdown()
    assert checker.violations == []
    assert checker.checks > 0 or not full
