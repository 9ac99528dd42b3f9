from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from streambuf.errors import ShardError, TooManyFailures
from streambuf.io import expand_urls
from streambuf.sources import stream_shards

from .helpers import expected_keys, make_samples, make_shards, member_offsets, write_tar
from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(60)
FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)


def lane_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streambuf-shards")]


def no_taking_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiting consumer takes nothing a lane holds in a chunk (``Window.hold``): a
    lane's own flush is tested alone."""
    from streambuf.window import Window

    monkeypatch.setattr(Window, "_take_held", lambda self, lane: False)


def later_when_chunked(
    urls: list[str], monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[float, list[float], list[float]]:
    """Each sample's arrival (seconds from the start) read by 2 lanes one by one and in
    chunks of up to 16, and how much later the latest one came chunked."""
    from streambuf import _source

    def arrivals(chunk: int) -> list[float]:
        monkeypatch.setattr(_source, "CHUNK", chunk)
        t0 = time.monotonic()
        out = []
        for _ in stream_shards(urls, lanes=2, adaptive=False, **FAST, **options):
            out.append(time.monotonic() - t0)
        return out

    one_by_one = arrivals(1)
    chunked = arrivals(16)
    return max(c - o for c, o in zip(chunked, one_by_one)), chunked, one_by_one


def urls_of(srv: FaultyServer, n: int) -> list[str]:
    return expand_urls(srv.base_url + f"/shard-{{000000..{n - 1:06d}}}.tar")


def test_local_round_robin_order(shard_dir: Path) -> None:
    urls = expand_urls(str(shard_dir / "*.tar"))
    keys = [s["__key__"] for s in stream_shards(urls, lanes=2, max_items=4)]
    # lane 0 reads shards 0, 2 and lane 1 reads shards 1, 3; delivery alternates lanes
    lane0 = [f"s000/{i:05d}" for i in range(20)] + [f"s002/{i:05d}" for i in range(20)]
    lane1 = [f"s001/{i:05d}" for i in range(20)] + [f"s003/{i:05d}" for i in range(20)]
    assert keys == [k for pair in zip(lane0, lane1) for k in pair]


def test_http_round_robin_deterministic_under_jitter(http_server: FaultyServer) -> None:
    urls = urls_of(http_server, 4)
    runs = []
    for latency in (0.0, 0.03):
        http_server.latency_s = latency
        http_server.trickle = (4096, 0.001) if latency else None
        runs.append([s["__key__"] for s in stream_shards(urls, lanes=3, max_items=6, **FAST)])
    assert runs[0] == runs[1]
    assert len(runs[0]) == 80 and set(runs[0]) == expected_keys(4, 20)


def test_first_ready_delivers_everything_once(http_server: FaultyServer) -> None:
    keys = [
        s["__key__"]
        for s in stream_shards(urls_of(http_server, 4), lanes=3, order="first_ready", **FAST)
    ]
    assert sorted(keys) == sorted(expected_keys(4, 20))


def test_faults_lose_nothing_and_duplicate_nothing(http_server: FaultyServer) -> None:
    http_server.fail("*", times=3, status=502)
    http_server.drop("/shard-000000.tar", after_bytes=9000, times=2)
    http_server.drop("/shard-000003.tar", after_bytes=30000)
    stream = stream_shards(urls_of(http_server, 4), lanes=3, readahead_bytes=4096, **FAST)
    keys = [s["__key__"] for s in stream]
    assert len(keys) == 80 and set(keys) == expected_keys(4, 20)
    stats = stream.stats()
    assert stats.io.retries == 6 and stats.shards_done == 4 and stats.samples == 80


@pytest.mark.serial
def test_readahead_hides_the_next_shards_latency(http_server: FaultyServer) -> None:
    http_server.latency_s = 0.15  # time to first byte of every request
    urls = urls_of(http_server, 4)

    def run(readahead: int) -> float:
        t0 = time.monotonic()
        for _ in stream_shards(urls, lanes=1, max_items=2, readahead_bytes=readahead, **FAST):
            time.sleep(0.01)  # a consumer slower than the network
        return time.monotonic() - t0

    without = run(0)  # ~0.15 + 3 * 0.13 + 80 * 0.01 s: each shard switch waits
    n = len(http_server.records())
    with_ra = run(1 << 20)  # the next shard is requested at the start of the current one
    assert n == 4 and len(http_server.records()) == 8  # each shard still requested once
    assert without >= 1.25 and with_ra < without - 0.25, (without, with_ra)


def test_byte_bound_respected(tmp_path: Path) -> None:
    make_shards(tmp_path, 4, 30, payload=20_000)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    # adaptive=False: local files would be read inline, with no buffer to bound
    stream = stream_shards(urls, lanes=2, max_items=64, max_bytes=100_000, adaptive=False)
    n = 0
    for _ in stream:
        time.sleep(0.002)  # a slow consumer: the lanes run ahead until the bound holds them
        n += 1
    stats = stream.stats().buffer
    assert n == 120
    assert stats.peak_bytes <= 100_000 and stats.oversize == 0
    assert all(lane.peak_bytes <= lane.max_bytes for lane in stats.lanes)
    assert stats.peak_bytes > 50_000  # it really filled up


def test_break_stops_all_threads(http_server: FaultyServer) -> None:
    http_server.trickle = (2048, 0.005)
    before = set(threading.enumerate())
    t0 = time.monotonic()
    for i, _ in enumerate(stream_shards(urls_of(http_server, 4), lanes=3, **FAST)):
        if i == 5:
            break
    deadline = time.monotonic() + 1.5
    while lane_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not lane_threads()
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("streambuf")]
    assert time.monotonic() - t0 < 5


def test_break_while_lanes_blocked_in_a_stalled_read(http_server: FaultyServer) -> None:
    http_server.stall("*", after_bytes=6000, seconds=20, times=4)
    stream = stream_shards(urls_of(http_server, 4), lanes=3, timeout_s=30, readahead_bytes=0)
    with stream:
        it = iter(stream)
        next(it)
        time.sleep(0.2)  # every lane is now waiting on a silent socket
        t0 = time.monotonic()
        it.close()  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 1.5
    assert not lane_threads()


def test_404_raises_shard_error_with_note(http_server: FaultyServer) -> None:
    urls = [*urls_of(http_server, 2), http_server.url("missing.tar")]
    with pytest.raises(ShardError) as info:
        list(stream_shards(urls, lanes=3, **FAST))
    assert info.value.stage == "open" and "missing.tar" in str(info.value)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "lane 2" in notes and "missing.tar" in notes
    time.sleep(0.05)
    assert not lane_threads()


def _truncated_shard(root: Path) -> tuple[str, int]:
    path = write_tar(root / "shard-000002.tar", make_samples(2, 20))
    cut = member_offsets(path)["s002/00007.bin"] + 10
    path.write_bytes(path.read_bytes()[:cut])
    return path.name, 7


def test_truncated_shard_raise(http_server: FaultyServer, shard_dir: Path) -> None:
    name, _ = _truncated_shard(shard_dir)
    with pytest.raises(ShardError) as info:
        list(stream_shards(urls_of(http_server, 4), lanes=2, **FAST))
    assert info.value.stage == "tar" and name in str(info.value)
    assert "s002/00007.bin" in str(info.value)


def test_skip_keeps_good_prefix_and_counts(
    http_server: FaultyServer, shard_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, good = _truncated_shard(shard_dir)
    urls = [*urls_of(http_server, 4), http_server.url("missing.tar")]
    stream = stream_shards(urls, lanes=2, on_error="skip", max_failures=2, **FAST)
    with caplog.at_level(logging.WARNING, logger="streambuf"):
        keys = [s["__key__"] for s in stream]
    want = expected_keys(4, 20) - {f"s002/{i:05d}" for i in range(good, 20)}
    assert len(keys) == len(want) and set(keys) == want
    stats = stream.stats()
    assert stats.shards_skipped == 2 and stats.shards_done == 3
    assert "missing.tar" in caplog.text and "shard-000002.tar" in caplog.text


def test_max_failures_bound(http_server: FaultyServer) -> None:
    urls = [http_server.url(f"missing-{i}.tar") for i in range(4)]
    with pytest.raises(TooManyFailures):
        list(stream_shards(urls, lanes=2, on_error="skip", max_failures=2, **FAST))


def test_secrets_not_in_errors_or_logs(
    http_server: FaultyServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://user:hunter22@127.0.0.1:{http_server.port}/missing.tar?X-Amz-Signature=sig777"
    caplog.set_level(logging.DEBUG, logger="streambuf")
    s = stream_shards([url], on_error="skip", max_failures=0, **FAST)
    with pytest.raises(TooManyFailures) as info:
        list(s)
    text = str(info.value) + caplog.text + " ".join(getattr(info.value, "__notes__", []))
    text += str(info.value.__cause__) + " ".join(getattr(info.value.__cause__, "__notes__", []))
    assert "hunter22" not in text and "sig777" not in text
    assert "missing.tar" in text


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        stream_shards("a.tar")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        stream_shards(["a.tar"], readahead_bytes=-1)
    with pytest.raises(ValueError):
        stream_shards(["a.tar"], on_error="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize(("stride", "offset"), [(1, 0), (3, 0), (3, 2), (2, 5)])
def test_stride_offset_is_islice_of_each_shard(shard_dir: Path, stride: int, offset: int) -> None:
    urls = expand_urls(str(shard_dir / "*.tar"))
    stream = stream_shards(urls, lanes=3, stride=stride, offset=offset)
    keys = [s["__key__"] for s in stream]
    want = {f"s{s:03d}/{i:05d}" for s in range(4) for i in range(20)[offset::stride]}
    assert len(keys) == len(want) and set(keys) == want
    assert stream.stats().samples == len(want) and stream.stats().shards_done == 4


def test_stride_offset_bad_values() -> None:
    with pytest.raises(ValueError, match="stride"):
        stream_shards(["a.tar"], stride=0)
    with pytest.raises(ValueError, match="offset"):
        stream_shards(["a.tar"], offset=-1)


def test_local_shards_are_not_read_ahead(
    tmp_path: Path, http_server: FaultyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local file or a cache entry opens in microseconds: no helper thread per shard
    (it cost a third of the read rate); a remote shard still is read ahead."""
    import streambuf.sources.access as access_mod

    started: list[int] = []

    class Counted(access_mod._Ahead):
        def __init__(self, *args: Any, **kw: Any) -> None:
            started.append(1)
            super().__init__(*args, **kw)

    monkeypatch.setattr(access_mod, "_Ahead", Counted)
    urls = [str(p) for p in make_shards(tmp_path / "local", 4, 30, payload=20_000)]
    opts = dict(lanes=1, readahead_bytes="1MiB", adaptive=False, **FAST)
    assert len(list(stream_shards(urls, **opts))) == 120
    assert started == []
    remote = urls_of(http_server, 4)
    cache = dict(cache_dir=str(tmp_path / "cache"), cache_limit="1GiB")
    n = len(list(stream_shards(remote, **opts, **cache)))  # epoch 1 fills the cache
    assert n > 0 and len(started) >= 3  # remote: every next shard read ahead
    del started[:]
    assert len(list(stream_shards(remote, **opts, **cache))) == n  # epoch 2: entries
    assert started == []


@pytest.mark.serial
def test_chunks_never_hold_a_paced_stream_back(
    http_server: FaultyServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lanes hand samples over in chunks only while they come in microseconds: a chunk is
    handed over ``FLUSH_S`` after its first sample began. On a paced stream (each request
    waits 50 ms, then the body comes 2 KiB every 20 ms: about a sample each) every
    sample arrives within one request time plus 50 ms of when it arrives one by one."""
    no_taking_held(monkeypatch)  # the flush alone (a waiting consumer would take them)
    http_server.latency_s = 0.05
    http_server.trickle = (2048, 0.02)
    urls = urls_of(http_server, 2)
    late, chunked, one_by_one = later_when_chunked(urls, monkeypatch)
    assert len(chunked) == len(one_by_one) == 40
    assert late <= 0.05 + 0.05, (late, chunked, one_by_one)


def test_a_chunk_is_handed_over_before_the_next_shard_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lane's samples come in microseconds within a shard, and its next shard's open
    waits for a request (50 ms, no readahead): the lane hands the chunk it holds over
    before it opens the next shard, so no sample waits for another shard's request (it
    did: every sample of a 3-sample shard arrived a request later than one by one).

    Checked by the order of events, not by arrival times: when the server sees the
    request for a lane's next shard, that lane has already committed every sample of
    the shards it read before (its commit comes first in one thread; the request it
    sends after it is what the server logs), on any machine. How much sooner the
    samples arrive is a quiet machine's figure, and no benchmark isolates it (``streambuf
    bench network`` runs this path on remote shards; the timing bound on a paced stream
    is ``test_chunks_never_hold_a_paced_stream_back``, a ``serial`` test)."""
    from streambuf import _source
    from streambuf.window import Window

    no_taking_held(monkeypatch)  # the flush alone (a waiting consumer would take them)
    monkeypatch.setattr(_source, "CHUNK", 16)  # room for more than a shard in one chunk
    events: list[tuple[str, Any, int]] = []  # in the order they happened, any thread
    real = Window.commit_many

    def committed(w: Window[Any], lane: int, items: list[Any], sizes: list[int]) -> None:
        real(w, lane, items, sizes)
        events.append(("commit", lane, len(items)))  # after it: handed over

    class Requests(list):  # the server's log: each request as it comes in
        def append(self, rec: Any) -> None:
            events.append(("request", rec.path, 0))
            super().append(rec)

    monkeypatch.setattr(Window, "commit_many", committed)
    lanes, shards, per_shard = 2, 8, 3
    paths = make_shards(tmp_path / "s", shards, per_shard)
    with FaultyServer(tmp_path / "s") as srv:
        srv.latency_s = 0.05
        srv.log = Requests()
        urls = [srv.url(p.name) for p in paths]
        index = {urllib.parse.urlsplit(u).path: i for i, u in enumerate(urls)}
        opts = dict(lanes=lanes, adaptive=False, readahead_bytes=0, **FAST)
        got = [s["__key__"] for s in stream_shards(urls, **opts)]
    assert sorted(got) == sorted(expected_keys(shards, per_shard))
    # round robin: lane l reads shards l, l + 2, ...; its k-th shard's request comes
    # after the lane committed all k * per_shard samples of the shards before it
    made = [0] * lanes
    requested = []
    for kind, what, n in events:
        if kind == "commit":
            made[what] += n
            continue
        shard = index[what]
        lane, k = shard % lanes, shard // lanes
        requested.append(shard)
        assert made[lane] >= k * per_shard, (shard, made, events)
    assert sorted(requested) == list(range(shards)), events  # one request a shard
    assert made == [shards // lanes * per_shard] * lanes, events


def test_shard_lanes_hand_over_chunks(shard_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples read in microseconds (local shards on lane threads) go to the consumer in
    chunks (one ``commit_many`` for several), in the same round-robin order as one by
    one."""
    from streambuf.window import Window

    chunks: list[int] = []
    real = Window.commit_many

    def spy(w: Window[Any], lane: int, items: list[Any], sizes: list[int]) -> None:
        chunks.append(len(items))
        real(w, lane, items, sizes)

    monkeypatch.setattr(Window, "commit_many", spy)
    urls = expand_urls(str(shard_dir / "*.tar"))
    keys = [s["__key__"] for s in stream_shards(urls, lanes=2, adaptive=False)]
    lane0 = [f"s000/{i:05d}" for i in range(20)] + [f"s002/{i:05d}" for i in range(20)]
    lane1 = [f"s001/{i:05d}" for i in range(20)] + [f"s003/{i:05d}" for i in range(20)]
    assert keys == [k for pair in zip(lane0, lane1) for k in pair]
    assert sum(chunks) == 80 and max(chunks) > 1, chunks
