"""Shard lanes <-> inline reading (``shards(adaptive=True)``, issue 25): switching between
the lane threads and the consumer's thread keeps the order, loses and repeats nothing,
keeps resume exact, and local files start inline."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from streambuf._inline import InlineChooser
from streambuf._ledger import Ledger
from streambuf._source import SourceRun
from streambuf.errors import ShardError
from streambuf.io import expand_urls
from streambuf.sources import stream_shards
from streambuf.testing import check_resume

from .helpers import expected_keys, make_samples, make_shards, switching_lanes, write_tar
from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(120)


def switchy() -> InlineChooser:
    """A chooser that changes mode every few items (no time floors, no intervals)."""
    return InlineChooser(4, min_window_s=0.0, min_interval_s=0.0, max_interval_s=0.0)


def keys_of(urls: list[str], *, order: str = "round_robin", chooser: Any = "keep") -> tuple:
    stream = stream_shards(urls, lanes=3, max_items=8, order=order, adaptive=True)
    if chooser != "keep":
        stream._run.chooser = chooser
    keys = [s["__key__"] for s in stream]
    return keys, stream._run


@pytest.fixture
def shard_urls(tmp_path: Path) -> list[str]:
    return [str(p) for p in make_shards(tmp_path, 7, 23, payload=300)]


def test_switching_keeps_round_robin_order(shard_urls: list[str]) -> None:
    ref = [s["__key__"] for s in stream_shards(shard_urls, lanes=3, max_items=8, adaptive=False)]
    for _ in range(3):
        keys, run = keys_of(shard_urls, chooser=switchy())
        assert keys == ref  # the same order, nothing lost or repeated
        assert run.chooser.switches >= 6, run.chooser.switches  # it really switched
        assert 0 < run.inline_items < len(ref)  # both modes delivered


def test_switching_keeps_the_order_where_lanes_end_shards_at_different_counts(
    tmp_path: Path,
) -> None:
    """Short and long shards: the lanes end shards at different item counts, so a
    phase's stop point must count items only (not a lane's shard ends)."""
    sizes = [2, 11, 5, 3, 17, 1, 7, 13, 4, 6, 2, 9]
    urls = [
        str(write_tar(tmp_path / f"shard-{s:06d}.tar", make_samples(s, n, payload=200)))
        for s, n in enumerate(sizes)
    ]
    ref = [s["__key__"] for s in stream_shards(urls, lanes=3, max_items=8, adaptive=False)]
    assert len(ref) == sum(sizes)
    for _ in range(3):
        keys, run = keys_of(urls, chooser=switchy())
        assert keys == ref
        assert run.chooser.switches >= 6, run.chooser.switches


def test_switching_first_ready_delivers_each_sample_once(shard_urls: list[str]) -> None:
    keys, run = keys_of(shard_urls, order="first_ready", chooser=switchy())
    assert sorted(keys) == sorted(expected_keys(7, 23))
    assert run.chooser.switches >= 4


def test_local_files_start_inline_without_threads(shard_urls: list[str]) -> None:
    stream = stream_shards(shard_urls, lanes=3, adaptive=True)
    it = iter(stream)
    next(it)
    assert stream._run.inline_items == 1  # the first sample came from the consumer's thread
    assert not [t for t in threading.enumerate() if t.name.startswith("streambuf-shards")]
    stream.close()
    off = stream_shards(shard_urls, lanes=3, adaptive=False)
    it = iter(off)
    next(it)
    assert off._run.inline_items == 0
    off.close()


def test_an_error_read_inline_names_the_shard(tmp_path: Path) -> None:
    urls = [str(p) for p in make_shards(tmp_path, 3, 5)]
    Path(urls[1]).write_bytes(Path(urls[1]).read_bytes()[:700])  # truncated
    stream = stream_shards(urls, lanes=2, adaptive=True)
    with pytest.raises(ShardError) as info:
        list(stream)
    assert stream._run.inline_items > 0
    assert "shard-000001.tar" in str(info.value)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "inline" in notes


def test_break_while_switching_leaves_no_threads(shard_urls: list[str]) -> None:
    for stop in (5, 17, 40):
        stream = stream_shards(shard_urls, lanes=3, max_items=8, adaptive=True)
        stream._run.chooser = switchy()
        for n, _ in enumerate(stream):
            if n == stop:
                break
        stream.close()
        left = [t for t in threading.enumerate() if t.name.startswith("streambuf-shards")]
        for t in left:
            t.join(5)
        assert not [t for t in left if t.is_alive()]


def test_resume_is_exact_while_switching(shard_urls: list[str]) -> None:
    # round robin: batches identical to the uninterrupted run, 0 and 2 workers (the grid,
    # tests/resume_grid.py, covers first_ready, elastic resumes and chains in all modes)
    with switching_lanes():
        make = functools.partial(_pipeline, shard_urls, "round_robin")
        check_resume(make, num_workers=(0, 2), stops=(1, 6, 13, "last"), ids=_keys)


def _pipeline(urls: list[str], order: str) -> sb.Pipeline:
    # shuffled shards, a shuffle buffer and a filter: runs split across batch boundaries
    pipe = sb.shards(urls, lanes=3, max_items=8, order=order, shuffle_shards=True, seed=3)
    return pipe.shuffle(9, seed=1).select(_not_3).batch(5)


def _not_3(sample: dict[str, Any]) -> bool:
    return not sample["__key__"].endswith("3")


def _keys(batch: Any) -> list[str]:
    return list(batch["__key__"])


def test_remote_shards_start_on_threads_cached_ones_inline(
    http_server: FaultyServer, tmp_path: Path
) -> None:
    urls = expand_urls(http_server.base_url + "/shard-{000000..000003}.tar")
    cache = dict(cache_dir=str(tmp_path / "cache"), cache_limit="1GiB")
    firsts = []
    for _epoch in range(2):
        stream = stream_shards(urls, lanes=2, adaptive=True, timeout_s=5, **cache)
        it = iter(stream)
        next(it)
        firsts.append(stream._run.inline_items)
        assert len(list(it)) > 0
    assert firsts == [0, 1]  # epoch 1 over HTTP: lanes; epoch 2 from the cache: inline


class _Lists:
    """An Access over in-memory shards (``shards[i]`` a list of values); reading shard 1
    is slow, so the other lanes run ahead of it by many items."""

    threaded = True

    def __init__(self, shards: list[list[str]]) -> None:
        self.shards = shards

    def read(self, lane: int, shard: int, /, *, index: int, hint: Any):  # type: ignore[no-untyped-def]
        for j in range(index, len(self.shards[shard])):
            if shard == 1:
                time.sleep(0.003)
            yield j, None, None, self.shards[shard][j]

    def fetch(self, shard: int, wanted: list[tuple[int, Any]], /):  # type: ignore[no-untyped-def]
        return iter(())

    def close(self) -> None:
        pass


class _PauseAt:
    """A chooser that pauses the lanes once, at the ``at``-th item, then stays inline."""

    def __init__(self, at: int) -> None:
        self.at, self.n, self.inline, self.state, self.switches = at, 0, False, "warm", 0

    def tick(self) -> str:
        self.n += 1
        if not self.inline and self.n == self.at:
            self.state = "drain"
            return "pause"
        return "none"

    def drained(self) -> None:
        self.inline, self.state, self.switches = True, "probe", self.switches + 1


def test_a_pause_waits_for_the_lane_behind() -> None:
    """Lanes 0 and 2 run far ahead of slow lane 1 when the pause comes: they stop at once,
    lane 1 catches up to their count, and the order is the round robin's."""
    shards = [[f"{s}:{i}" for i in range(30)] for s in range(3)]
    ref = [v for row in zip(*shards) for v in row]
    for at in (4, 10):
        run = SourceRun(_Lists(shards), [0, 1, 2], ledger=Ledger(), lanes=3, max_items=30)
        run.chooser = _PauseAt(at)  # type: ignore[assignment]
        got = [rec.value for rec in run]
        assert got == ref, at
        assert run.chooser.switches == 1 and run.inline_items > 0


@pytest.mark.serial
def test_adaptive_never_holds_a_paced_stream_back(http_server: FaultyServer) -> None:
    """Over a link with 50 ms per request the first sample arrives as fast as with the
    lanes always on (within one request time plus 50 ms), and the whole read is not
    slower than 1.5x: the chooser keeps the threads where requests wait."""
    http_server.latency_s = 0.05
    urls = expand_urls(http_server.base_url + "/shard-{000000..000003}.tar")

    def timed(adaptive: bool) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        stream = stream_shards(urls, lanes=3, adaptive=adaptive, timeout_s=10)
        it = iter(stream)
        next(it)
        first = time.perf_counter() - t0
        n = 1 + sum(1 for _ in it)
        return first, time.perf_counter() - t0, n

    timed(True)  # warm: imports, connections
    on = [timed(True) for _ in range(2)]
    off = [timed(False) for _ in range(2)]
    assert {r[2] for r in on + off} == {80}
    first_on, first_off = min(r[0] for r in on), min(r[0] for r in off)
    assert first_on <= first_off + 0.05 + 0.05, (first_on, first_off)
    assert min(r[1] for r in on) <= 1.5 * min(r[1] for r in off), (on, off)


class _Stuck(_Lists):
    """Reading shard 1 blocks until ``release`` is set (a read abort cannot stop);
    ``closed`` records each reader whose ``finally`` ran (its file closed)."""

    def __init__(self, shards: list[list[str]]) -> None:
        super().__init__(shards)
        self.release = threading.Event()
        self.closed: list[int] = []
        self.kept: list[Any] = []  # every reader, so only an explicit close() closes one

    def read(self, lane: int, shard: int, /, *, index: int, hint: Any):  # type: ignore[no-untyped-def]
        reader = self._read(shard, index)
        self.kept.append(reader)  # (without this, the lane dropping it would close it too)
        return reader

    def _read(self, shard: int, index: int):  # type: ignore[no-untyped-def]
        try:
            for j in range(index, len(self.shards[shard])):
                if shard == 1 and j == 1:
                    self.release.wait(10)
                yield j, None, None, self.shards[shard][j]
        finally:
            self.closed.append(shard)


def test_a_reader_stuck_in_a_read_is_closed_when_it_returns() -> None:
    """The consumer leaves while lane 1 is inside a read it cannot abort: its reader (and
    the file under it) is closed by the lane as soon as the read returns, not at GC."""
    access = _Stuck([[f"{s}:{i}" for i in range(30)] for s in range(2)])
    run = SourceRun(access, [0, 1], ledger=Ledger(), lanes=2, join_timeout_s=0.2)
    it = iter(run)
    got = [next(it).value for _ in range(2)]  # 0:0, 1:0; lane 1 now blocks in 1:1
    it.close()
    assert got == ["0:0", "1:0"] and 0 in access.closed and 1 not in access.closed
    access.release.set()
    deadline = time.monotonic() + 5
    while 1 not in access.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert access.closed.count(1) == 1  # closed once, by its lane, with `run` still alive
    del run
