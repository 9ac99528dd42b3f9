"""Property tests: random sizes, lanes, speeds, set_limits and early close.

An observer runs under the buffer's lock after every admission and removal and checks
docs/design.md invariants 1 and 2 at that moment; the consumer checks no loss, no duplicates,
per-lane FIFO and (round-robin) the deterministic order. ``BoundedBuffer`` runs once with
single calls and once with random mixes of ``put``/``put_many`` and ``get``/``get_many``
(a run of items admitted or removed under one lock acquisition is checked once, after it).
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streambuf import BoundedBuffer, BufferClosed, ShardedBuffer

pytestmark = pytest.mark.timeout(120)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def size_of(item) -> int:
    return item[2]


class Checker:
    """Called under the buffer lock after every mutation."""

    def __init__(self) -> None:
        self.last_puts = 0
        self.violations: list[str] = []
        self.max_items_seen = 0
        self.lane_puts: dict[int, int] = {}

    def __call__(self, eng) -> None:
        admitted = eng._puts != self.last_puts
        self.last_puts = eng._puts
        self.max_items_seen = max(self.max_items_seen, eng._items)
        if eng._items != sum(len(ln.q) for ln in eng._lanes):
            self.violations.append("item count out of sync")
        if any(len(ln.q) != len(ln.sizes) for ln in eng._lanes):
            self.violations.append("items and their sizes out of step")
        if eng._bytes != sum(ln.bytes for ln in eng._lanes):
            self.violations.append("byte count out of sync")
        if eng._reserved == 0 and eng._bytes != sum(s for ln in eng._lanes for s in ln.sizes):
            self.violations.append("bytes held differ from the queued items' sizes")
        if not admitted:
            return
        if eng._pooled:
            if eng._items > 1 and (eng._items > eng._max_items or eng._bytes > eng._max_bytes):
                self.violations.append(f"pool over bound: {eng._items} items {eng._bytes} B")
        else:
            for i, ln in enumerate(eng._lanes):
                if ln.puts == self.lane_puts.get(i, 0):
                    continue  # not admitted into now; may be over a bound shrunk since
                self.lane_puts[i] = ln.puts
                n = len(ln.q)
                if n > 1 and (n > ln.max_items or ln.bytes > ln.max_bytes):
                    self.violations.append(f"lane {i} over bound: {n} items {ln.bytes} B")


def run_producers(put, finish, lanes_items, delays, rng_seed, put_many=None):
    """One thread per lane; with ``put_many``, each puts runs of 1-5 items at random,
    a run of one by ``put`` or ``put_many`` at random."""

    def producer(lane):
        rng = random.Random(rng_seed + lane)
        items = lanes_items[lane]
        i = 0
        try:
            while i < len(items):
                if delays[lane]:
                    time.sleep(rng.random() * delays[lane])
                run = 1 if put_many is None else rng.choice([1, 1, 2, 3, 5])
                if run == 1 and (put_many is None or rng.random() < 0.5):
                    put(lane, items[i])
                else:
                    put_many(lane, items[i : i + run])
                i += run
        except BufferClosed:
            pass
        finally:
            finish(lane)

    ths = [threading.Thread(target=producer, args=(i,)) for i in range(len(lanes_items))]
    for t in ths:
        t.start()
    return ths


case = st.fixed_dictionaries(
    {
        "lanes": st.integers(1, 4),
        "max_items": st.integers(1, 8),
        "max_bytes": st.integers(10, 200),
        "sizes": st.lists(
            st.lists(st.one_of(st.integers(0, 8), st.integers(0, 300)), max_size=25),
            min_size=4,
            max_size=4,
        ),
        "delays": st.lists(st.sampled_from([0.0, 0.0, 0.0005, 0.002]), min_size=4, max_size=4),
        "consumer_delay": st.sampled_from([0.0, 0.0005, 0.002]),
        "limits": st.lists(
            st.tuples(st.integers(0, 60), st.integers(1, 8), st.integers(10, 300)), max_size=3
        ),
        "close_after": st.one_of(st.none(), st.integers(0, 40)),
        "seed": st.integers(0, 1000),
    }
)


def _consume(buf, c, checker, batched=False):
    got = []
    limits = sorted(c["limits"])
    rng = random.Random(c["seed"])
    n = 0
    while True:
        while limits and limits[0][0] <= n:
            _, mi, mb = limits.pop(0)
            lanes = getattr(buf, "lanes", 1)
            buf.set_limits(max_items=max(mi, lanes), max_bytes=mb)
        if c["close_after"] is not None and n >= c["close_after"] and not buf.closed:
            buf.close()  # (>=: a get_many may step over the count)
        k = rng.choice([0, 1, 2, 3, 7]) if batched else 0
        try:
            if k:
                ready = len(buf)  # only this thread takes items out: these stay there
                items = buf.get_many(k, timeout_s=20)
                want = min(k, max(ready, 1))  # all that was ready, up to k (>= 1: it waits)
                assert want <= len(items) <= k, (
                    f"get_many({k}) returned {len(items)} items with {ready} ready"
                )
            else:
                items = [buf.get(timeout_s=20)]
        except BufferClosed:
            break
        got.extend(items)
        n += len(items)
        if c["consumer_delay"]:
            time.sleep(rng.random() * c["consumer_delay"])
    return got


def _lanes_items(c, lanes):
    return [[(lane, i, s) for i, s in enumerate(c["sizes"][lane])] for lane in range(lanes)]


def _check_common(got, lanes_items, closed_early, checker):
    assert checker.violations == []
    assert len(got) == len(set(got)), "duplicates"
    everything = {x for items in lanes_items for x in items}
    assert set(got) <= everything
    if not closed_early:
        assert set(got) == everything, "lost items"
    for lane in range(len(lanes_items)):
        seq = [i for (ln, i, _) in got if ln == lane]
        assert seq == sorted(seq), "per-lane FIFO broken"


@SETTINGS
@given(c=case)
def test_bounded_buffer_properties(c):
    _bounded_buffer_case(c, batched=False)


@SETTINGS
@given(c=case)
def test_bounded_buffer_batch_calls_properties(c):
    _bounded_buffer_case(c, batched=True)


def _bounded_buffer_case(c, batched):
    buf = BoundedBuffer(max_items=c["max_items"], max_bytes=c["max_bytes"], sizeof=size_of)
    checker = Checker()
    buf._observer = checker
    lanes_items = _lanes_items(c, c["lanes"])
    done = []
    lock = threading.Lock()

    def finish(lane):
        with lock:
            done.append(lane)
            if len(done) == c["lanes"]:
                buf.close()

    ths = run_producers(
        lambda lane, x: buf.put(x, timeout_s=20),
        finish,
        lanes_items,
        c["delays"],
        c["seed"],
        put_many=(lambda lane, xs: buf.put_many(xs, timeout_s=20)) if batched else None,
    )
    try:
        got = _consume(buf, c, checker, batched)
    finally:
        buf.close()  # a failed check: the producers stop at once
    for t in ths:
        t.join(10)
        assert not t.is_alive()
    closed_early = c["close_after"] is not None
    _check_common(got, lanes_items, closed_early, checker)
    if not c["limits"]:
        big = sum(1 for x in got if x[2] > c["max_bytes"])
        assert buf.stats().oversize >= big


@SETTINGS
@given(c=case, order=st.sampled_from(["round_robin", "first_ready"]))
def test_sharded_buffer_properties(c, order):
    lanes = c["lanes"]
    max_items = max(c["max_items"], lanes)
    buf = ShardedBuffer(
        lanes=lanes, max_items=max_items, max_bytes=c["max_bytes"], order=order, sizeof=size_of
    )
    checker = Checker()
    buf._observer = checker
    lanes_items = _lanes_items(c, lanes)
    ths = run_producers(
        lambda lane, x: buf.put(lane, x, timeout_s=20),
        buf.finish,
        lanes_items,
        c["delays"],
        c["seed"],
    )
    got = _consume(buf, c, checker)
    buf.close()
    for t in ths:
        t.join(10)
        assert not t.is_alive()
    closed_early = c["close_after"] is not None
    _check_common(got, lanes_items, closed_early, checker)
    if order == "round_robin" and not closed_early:
        expected = []
        for i in range(max(len(x) for x in lanes_items)):
            expected.extend(items[i] for items in lanes_items if i < len(items))
        assert got == expected, "round-robin order is not deterministic"
    s = buf.stats()
    assert s.items == 0 or closed_early
    if lanes > 1:
        assert len(s.lanes) == lanes
        assert sum(ln.gets for ln in s.lanes) == s.gets == len(got)
