"""The shard cache (``sb.shards(cache_dir=, cache_limit=)``), issue 15's acceptance point 2.

Requests are counted in the loopback servers' logs (HTTP: ``FaultyServer``; S3: a
``FaultyServer`` proxy in front of moto). What each test proves:

* epoch 2 makes no request at all when everything fits (HTTP and S3, 2 workers);
* a limit of half the data set halves epoch 2's requests, exactly, and the cache folder,
  sampled every 10 ms under the cache's lock while 2 workers read, never exceeds the
  limit, also while another data set evicts the first one; files the cache did not
  write survive it;
* a limit smaller than one shard streams everything, writes nothing, never hangs;
* a truncated entry (size) and a corrupted one (crc32) are re-fetched, once;
* 2 ranks x 2 workers (concurrent processes) sharing one folder write each shard once,
  and download each once when every slot has its own shards;
* a resumed run reads its cursors and pending samples from the cache;
* units: cut-short and aborted reads leave nothing, a busy key streams without writing,
  a dead writer's reservation is swept, least recently used goes first, an unreadable
  manifest turns the cache off without deleting anything, ``cached_file`` for videos.
"""

from __future__ import annotations

import collections
import errno
import io
import json
import logging
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from streambuf.io import ShardCache, cached_file, open_stream
from streambuf.io import _cache_io as cache_io
from streambuf.io import cache as cache_module
from streambuf.sources import ShardOptions, shard_stats
from tests.resume_harness import check_save_load
from tests.sources.cache_data import FAST, cache_loader, run_rank
from tests.sources.cache_watch import watch

from .helpers import expected_keys, make_shards
from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(180)
KIB = 1 << 10


def keys_of(loader: Any) -> list[str]:
    return [k for b in loader for k in b["__key__"]]


def loader_for(pipe: sb.Pipeline, workers: int = 2) -> sb.Loader:
    return sb.Loader(
        pipe.batch(5), num_workers=workers, max_batches=4, max_bytes="4MiB", timeout_s=60
    )


def entries(folder: Path) -> dict[str, Any]:
    return json.loads((folder / ".streambuf" / "manifest.json").read_text())["entries"]


def entry_path(folder: Path, name: str) -> Path:
    (rec,) = [e for e in entries(folder).values() if e["url"].endswith("/" + name)]
    return folder / ".streambuf" / "data" / rec["file"]


class CacheWatch:
    """Samples the bytes of the cache's entries and temp files every 10 ms, under the
    cache's lock, in a spawned process (``cache_watch.watch``); ``peak``, ``peak_tmp``,
    ``samples`` after the ``with`` block."""

    def __init__(self, folder: Path, every_s: float = 0.01) -> None:
        ctx = mp.get_context("spawn")
        self._stop, self._out = ctx.Event(), ctx.Queue()
        root = str(folder / ".streambuf")
        self._proc = ctx.Process(target=watch, args=(root, every_s, self._stop, self._out))
        self.peak = self.peak_tmp = self.samples = 0

    def __enter__(self) -> CacheWatch:
        self._proc.start()
        assert self._out.get(timeout=60) == "started"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            res = self._out.get(timeout=30)
            self.peak, self.peak_tmp, self.samples = res["peak"], res["peak_tmp"], res["samples"]
        finally:
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()


# -- fixtures ------------------------------------------------------------------------------
PER, PAYLOAD = 20, 10_000


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 shards ``shard-*`` and 8 copies ``other-*`` (another data set: other URLs), each
    20 samples of 10 KB, all of one size."""
    root = tmp_path_factory.mktemp("sets")
    make_shards(root, 8, PER, payload=PAYLOAD)
    for i in range(8):
        shutil.copy(root / f"shard-{i:06d}.tar", root / f"other-{i:06d}.tar")
    assert len({p.stat().st_size for p in root.iterdir()}) == 1
    return root


@pytest.fixture
def server(two_sets: Path) -> Iterator[FaultyServer]:
    with FaultyServer(two_sets) as srv:
        yield srv


def spec(srv: FaultyServer, prefix: str = "shard", n: int = 8) -> str:
    return srv.base_url + f"/{prefix}-{{000000..{n - 1:06d}}}.tar"


# -- options -------------------------------------------------------------------------------
def test_options_are_checked_when_built(tmp_path: Path, shard_dir: Path) -> None:
    tar = str(shard_dir / "*.tar")
    with pytest.raises(ValueError, match="needs cache_limit"):
        sb.shards(tar, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="needs cache_dir"):
        sb.shards(tar, cache_limit="1GiB")
    with pytest.raises(ValueError, match="cache_limit"):
        sb.shards(tar, cache_dir=str(tmp_path), cache_limit="lots")
    with pytest.raises(ValueError, match="cache_limit"):
        sb.shards(tar, cache_dir=str(tmp_path), cache_limit=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        sb.shards(tar, cache_dir=str(tmp_path / "file" / "sub"), cache_limit="1GiB")
    with pytest.raises(ValueError, match="not a URL"):
        sb.shards(tar, cache_dir="s3://bucket/cache", cache_limit="1GiB")
    with pytest.raises(TypeError, match="cache_dir"):
        sb.shards(tar, cache_dir=3, cache_limit="1GiB")  # type: ignore[arg-type]
    o = ShardOptions(cache_dir=tmp_path / "new" / "cache", cache_limit="2GiB")  # type: ignore[arg-type]
    assert o.cache_dir == str(tmp_path / "new" / "cache") and o.cache_limit == 2 << 30
    assert not (tmp_path / "new").exists()  # nothing is created when options are checked


def test_local_shards_are_never_cached(tmp_path: Path, shard_dir: Path) -> None:
    pipe = sb.shards(str(shard_dir / "*.tar"), cache_dir=tmp_path / "c", cache_limit="1GiB")  # type: ignore[arg-type]
    assert len(keys_of(pipe.batch(8))) == 80
    assert shard_stats(pipe).cache == sb.io.CacheStats()
    assert not list((tmp_path / "c" / ".streambuf" / "data").iterdir())


# -- epoch 2 -------------------------------------------------------------------------------
def test_http_epoch_two_makes_no_request(server: FaultyServer, tmp_path: Path) -> None:
    pipe = sb.shards(spec(server), lanes=2, cache_dir=str(tmp_path), cache_limit="1GiB", **FAST)
    loader = loader_for(pipe)
    assert sorted(keys_of(loader)) == sorted(expected_keys(8, PER))
    first = server.records()
    assert sorted(r.path for r in first) == [f"/shard-{i:06d}.tar" for i in range(8)]
    size = (server.root / "shard-000000.tar").stat().st_size  # type: ignore[operator]
    loader.set_epoch(1)
    assert sorted(keys_of(loader)) == sorted(expected_keys(8, PER))
    assert len(server.log) == len(first), "epoch 2 must not touch the server"
    c = shard_stats(pipe).cache
    assert (c.writes, c.hits, c.misses, c.evictions, c.corrupt) == (8, 8, 8, 0, 0)
    assert c.bytes_written == c.bytes_saved == 8 * size
    assert shard_stats(pipe).io.bytes == 8 * size  # the network: epoch 1 only


def test_s3_epoch_two_makes_no_request(
    moto_endpoint: str, s3_bucket: str, s3_options: dict[str, Any], tmp_path: Path
) -> None:
    with FaultyServer(upstream=moto_endpoint) as proxy:
        opts = {**s3_options, "endpoint_url": proxy.base_url, "skip_instance_cache": True}
        pipe = sb.shards(
            f"s3://{s3_bucket}/shard-{{000000..000003}}.tar",
            lanes=2,
            storage_options=opts,
            block_bytes="8KiB",  # an 80 KiB shard takes 3 GETs (8, 16, then the rest)
            cache_dir=str(tmp_path),
            cache_limit="1GiB",
            **FAST,
        )
        loader = loader_for(pipe)
        assert sorted(keys_of(loader)) == sorted(expected_keys(4, 20))
        gets = [r for r in proxy.records() if r.path.startswith(f"/{s3_bucket}/shard-")]
        assert len(gets) >= 4 * 3  # the cache's entries are made from several GETs
        before = len(proxy.log)
        loader.set_epoch(1)
        assert sorted(keys_of(loader)) == sorted(expected_keys(4, 20))
        assert proxy.log[before:] == [], "epoch 2 must not touch S3"
        c = shard_stats(pipe).cache
        assert (c.writes, c.hits) == (4, 4)


def test_s3_half_limit_halves_the_requests(
    moto_endpoint: str, s3_bucket: str, s3_options: dict[str, Any], shard_dir: Path, tmp_path: Path
) -> None:
    size = (shard_dir / "shard-000000.tar").stat().st_size
    with FaultyServer(upstream=moto_endpoint) as proxy:
        opts = {**s3_options, "endpoint_url": proxy.base_url, "skip_instance_cache": True}
        pipe = sb.shards(
            f"s3://{s3_bucket}/shard-{{000000..000003}}.tar",
            lanes=2,
            storage_options=opts,
            block_bytes="16KiB",
            cache_dir=str(tmp_path),
            cache_limit=2 * size + size // 2,  # two shards fit, not three
            **FAST,
        )
        loader = loader_for(pipe, workers=0)
        gets = []
        for epoch in (0, 1):
            before = len(proxy.log)
            loader.set_epoch(epoch)
            assert sorted(keys_of(loader)) == sorted(expected_keys(4, 20))
            gets.append(sum(r.method == "GET" for r in proxy.log[before:]))
        assert gets[1] * 2 == gets[0], gets  # every shard is the same number of blocks
        assert shard_stats(pipe).cache.writes == 2


# -- the bound -----------------------------------------------------------------------------
def test_half_limit_halves_requests_and_the_folder_never_exceeds_it(
    server: FaultyServer, two_sets: Path, tmp_path: Path
) -> None:
    size = (two_sets / "shard-000000.tar").stat().st_size
    limit = 4 * size + size // 2  # half the data set (4 of 8 shards), not 5
    server.bandwidth_bps = 1e6  # ~0.2 s a shard: the sampler sees the writes in progress
    folder = tmp_path / "cache"
    (folder / ".streambuf" / "data").mkdir(parents=True)
    foreign = [folder / "notes.txt", folder / ".streambuf" / "data" / "foreign.tar"]
    for f in foreign:
        f.write_bytes(b"not the cache's" * 100)
    kw = dict(lanes=2, cache_dir=str(folder), cache_limit=limit, **FAST)
    with CacheWatch(folder) as watch:
        pipe = sb.shards(spec(server), **kw)
        loader = loader_for(pipe)
        requests = []
        for epoch in (0, 1):
            before = len(server.log)
            loader.set_epoch(epoch)
            assert sorted(keys_of(loader)) == sorted(expected_keys(8, PER))
            requests.append(len(server.log) - before)
        c = shard_stats(pipe).cache
        assert requests == [8, 4] and c.writes == 4 and c.evictions == 0, (requests, c)
        # another data set through the same folder evicts the first one's entries
        other = sb.shards(spec(server, "other"), **kw)
        assert len(keys_of(loader_for(other))) == 8 * PER
    o = shard_stats(other).cache
    assert o.writes == 4 and o.evictions == 4, o
    assert watch.samples > 50 and watch.peak_tmp > 0, "the sampler must see writes happen"
    assert limit - size < watch.peak <= limit, (watch.peak, limit)
    assert all(f.read_bytes() == b"not the cache's" * 100 for f in foreign)
    assert all(e["url"].split("/")[-1].startswith("other-") for e in entries(folder).values())


def test_limit_smaller_than_a_shard_streams_without_caching(
    server: FaultyServer, two_sets: Path, tmp_path: Path
) -> None:
    size = (two_sets / "shard-000000.tar").stat().st_size
    pipe = sb.shards(spec(server), lanes=2, cache_dir=str(tmp_path), cache_limit=size - 1, **FAST)
    loader = loader_for(pipe)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert sorted(keys_of(loader)) == sorted(expected_keys(8, PER))
    assert len(server.records()) == 16
    c = shard_stats(pipe).cache
    assert (c.writes, c.hits, c.misses, c.bytes_written) == (0, 0, 16, 0)
    assert not list((tmp_path / ".streambuf" / "data").iterdir())
    assert not list((tmp_path / ".streambuf" / "tmp").iterdir())


# -- damaged entries -----------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_entry_is_fetched_again(server: FaultyServer, tmp_path: Path, damage: str) -> None:
    pipe = sb.shards(spec(server), lanes=2, cache_dir=str(tmp_path), cache_limit="1GiB", **FAST)
    loader = loader_for(pipe)
    keys_of(loader)
    path = entry_path(tmp_path, "shard-000005.tar")
    good = path.read_bytes()
    if damage == "truncate":
        os.truncate(path, len(good) // 2)
    else:  # same size, one byte different: only the crc32 can tell
        with open(path, "r+b") as f:
            f.seek(len(good) // 2)
            f.write(bytes([good[len(good) // 2] ^ 0xFF]))
    before = len(server.log)
    loader.set_epoch(1)
    assert sorted(keys_of(loader)) == sorted(expected_keys(8, PER))
    assert [r.path for r in server.log[before:]] == ["/shard-000005.tar"]
    c = shard_stats(pipe).cache
    assert (c.corrupt, c.writes, c.hits) == (1, 9, 7), c
    assert entry_path(tmp_path, "shard-000005.tar").read_bytes() == good


# -- ranks x workers -----------------------------------------------------------------------
# 2 shards < 4 slots: readers share a shard (CI); 8: one reader each (make test-long)
@pytest.mark.parametrize("n_shards", [pytest.param(8, marks=pytest.mark.long), 2])
def test_two_ranks_two_workers_write_each_shard_once(
    server: FaultyServer, tmp_path: Path, n_shards: int
) -> None:
    # slow enough that two readers of one shard (n_shards=2) are likely to overlap: then
    # the second streams it without writing (the writer holds the key's lock)
    server.bandwidth_bps = 2e6 if n_shards == 8 else 3e5
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    kw = {"spec": spec(server, n=n_shards), "cache_dir": str(tmp_path), "cache_limit": "1GiB"}
    procs = [ctx.Process(target=run_rank, args=(r, kw, barrier, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=150) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert all(r[1] != "error" for r in results), results
    for epoch in (0, 1):
        got = [k for _, keys, _ in results for k in keys[epoch]]
        assert sorted(got) == sorted(expected_keys(n_shards, PER)), epoch
    writes = sum(stats["writes"] for _, _, stats in results)
    assert writes == n_shards and len(entries(tmp_path)) == n_shards
    per_shard = collections.Counter(r.path for r in server.records())
    assert set(per_shard) == {f"/shard-{i:06d}.tar" for i in range(n_shards)}
    if n_shards == 8:  # every slot has shards of its own: each is downloaded once in all
        assert set(per_shard.values()) == {1}, per_shard
    reads = max(n_shards, 4)  # per epoch: 4 slots, each reading its shards (or a share)
    assert sum(stats["hits"] for _, _, stats in results) >= reads  # epoch 2: all hits


# -- resume --------------------------------------------------------------------------------
def test_resume_reads_cursors_and_pending_samples_from_the_cache(
    http_server: FaultyServer, tmp_path: Path
) -> None:
    """The checkpoint harness (stops mid-shard, on a boundary, at the end): the whole of
    it downloads each shard once; resumed lanes and fetches read the entries."""
    kw = {
        "spec": http_server.base_url + "/shard-{000000..000003}.tar",
        "cache_dir": str(tmp_path),
        "workers": 2,
    }
    check_save_load(cache_loader, kw, [3, 10, "last"])
    assert sorted(r.path for r in http_server.records()) == [
        f"/shard-{i:06d}.tar" for i in range(4)
    ]


# -- units: ShardCache ---------------------------------------------------------------------
def remote_of(url: str) -> Any:
    return lambda offset, length: open_stream(url, offset=offset, length=length, **FAST)


def test_reads_at_an_offset_and_cut_short_reads_make_no_entry(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    cache = ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000001.tar")
    data = (shard_dir / "shard-000001.tar").read_bytes()
    with cache.open(url, offset=512, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data[512:]  # a resume: streamed, not cached
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read(8192) == data[:8192]  # closed far from the end: no entry
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        f.read(4096)
        f.raw.abort()  # type: ignore[attr-defined]  # aborted (a loader shutting down)
    assert cache.usage() == 0 and not list((tmp_path / ".streambuf" / "tmp").iterdir())
    assert cache.stats().writes == 0 and cache.stats().misses == 3
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        # 10 KB before the end (where a tar reader yields its last sample, at the
        # end-of-archive marker): within DRAIN_BYTES, so the rest has been received and
        # the entry made already, before the loader may abort the stream
        assert f.read(len(data) - 10_000) == data[:-10_000]
        assert cache.stats().writes == 1
        f.raw.abort()  # type: ignore[attr-defined]
        assert f.read() == data[-10_000:]  # the tail was received: still readable
    assert cache.stats().writes == 1 and cache.usage() == len(data)
    before = len(http_server.log)
    with cache.open(url, offset=1000, length=3000, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data[1000:4000]  # a fetch from the entry
    assert len(http_server.log) == before and cache.stats().bytes_saved == 3000


def test_a_key_being_written_elsewhere_streams_without_writing(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    a, b = ShardCache(tmp_path, 1 << 30), ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000002.tar")
    data = (shard_dir / "shard-000002.tar").read_bytes()
    first = a.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096)
    first.read(4096)  # a is writing the entry
    with b.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data
    assert b.stats().writes == 0 and b.stats().misses == 1
    assert first.read() == data[4096:]
    first.close()
    assert a.stats().writes == 1
    with b.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data
    assert b.stats().hits == 1


def test_a_dead_writers_reservation_is_swept(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    size = (shard_dir / "shard-000000.tar").stat().st_size
    cache = ShardCache(tmp_path, 2 * size)
    root = tmp_path / ".streambuf"
    # a writer that died holding a reservation of the whole limit: its temp file half
    # written, and (a crash between rename and manifest) its entry file already in place
    dead, key = "999-" + "ab" * 16, "cd" * 16
    (root / "tmp" / dead).write_bytes(b"x" * size)
    (root / "data" / f"{key}-x.tar").write_bytes(b"y" * size)
    manifest: dict[str, Any] = {"version": 1, "entries": {}, "reserved": {}}
    manifest["reserved"][dead] = {"key": key, "file": f"{key}-x.tar", "size": 2 * size, "t": 0}
    (root / "manifest.json").write_text(json.dumps(manifest))
    url = http_server.url("shard-000000.tar")
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        f.read()
    assert cache.stats().writes == 1 and cache.usage() == size
    assert not (root / "tmp" / dead).exists() and not (root / "data" / f"{key}-x.tar").exists()


def test_a_manifest_naming_paths_outside_the_cache_is_refused(
    http_server: FaultyServer, tmp_path: Path
) -> None:
    cache = ShardCache(tmp_path / "c", 1 << 30)
    url = http_server.url("shard-000000.tar")
    victim = tmp_path / "precious.txt"
    victim.write_text("keep")
    rec = {"file": "../../../precious.txt", "size": 10**9, "crc32": 0, "used": 0}
    assert (tmp_path / "c" / ".streambuf" / "data" / rec["file"]).resolve() == victim
    manifest = {"version": 1, "entries": {cache.key(url): rec}, "reserved": {}}
    (tmp_path / "c" / ".streambuf" / "manifest.json").write_text(json.dumps(manifest))
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        f.read()  # streamed: the cache is off until the manifest is fixed
    assert victim.read_text() == "keep"


def test_eviction_takes_least_recently_used_of_other_data_sets_and_spares_the_rest(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "_TOUCH_S", 0.0)  # record every use (not once a minute)
    size = (shard_dir / "shard-000000.tar").stat().st_size
    urls = [http_server.url(f"shard-{i:06d}.tar") for i in range(4)]
    filler = ShardCache(tmp_path, 2 * size)  # another job: its entries are fair game
    for u in (urls[0], urls[1], urls[0]):  # 1 is now the least recently used
        with filler.open(u, offset=0, length=None, remote=remote_of(u), block_bytes=4096) as f:
            f.read()
    (tmp_path / "foreign.bin").write_bytes(b"mine")
    job = ShardCache(tmp_path, 2 * size, keep=urls[2:])
    for u in urls[2:]:
        with job.open(u, offset=0, length=None, remote=remote_of(u), block_bytes=4096) as f:
            f.read()
    assert job.stats().evictions == 2
    with job.open(urls[1], offset=0, length=None, remote=remote_of(urls[1]), block_bytes=4096) as f:
        f.read()  # the job's own entries are never traded for one another: streamed
    got = sorted(e["url"].rsplit("/", 1)[-1] for e in entries(tmp_path).values())
    assert got == ["shard-000002.tar", "shard-000003.tar"]
    assert (tmp_path / "foreign.bin").read_bytes() == b"mine"
    # least recently used first: with room for one more, urls[1] goes before urls[0]
    lru = ShardCache(tmp_path / "lru", 2 * size)
    for u in (urls[0], urls[1], urls[0], urls[2]):
        with lru.open(u, offset=0, length=None, remote=remote_of(u), block_bytes=4096) as f:
            f.read()
    left = sorted(e["url"].rsplit("/", 1)[-1] for e in entries(tmp_path / "lru").values())
    assert left == ["shard-000000.tar", "shard-000002.tar"]


def test_an_entry_in_use_is_not_evicted(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    size = (shard_dir / "shard-000000.tar").stat().st_size
    cache = ShardCache(tmp_path, size)
    u0, u1 = http_server.url("shard-000000.tar"), http_server.url("shard-000001.tar")
    with cache.open(u0, offset=0, length=None, remote=remote_of(u0), block_bytes=4096) as f:
        f.read()
    reader = cache.open(u0, offset=0, length=None, remote=remote_of(u0), block_bytes=4096)
    with cache.open(u1, offset=0, length=None, remote=remote_of(u1), block_bytes=4096) as f:
        f.read()  # no room: u0 is being read
    assert cache.stats().evictions == 0 and cache.stats().writes == 1
    reader.close()
    with cache.open(u1, offset=0, length=None, remote=remote_of(u1), block_bytes=4096) as f:
        f.read()
    assert cache.stats().evictions == 1 and cache.stats().writes == 2


def test_an_unreadable_manifest_turns_the_cache_off(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ShardCache(tmp_path, 1 << 30)
    (tmp_path / ".streambuf" / "data" / "x.tar").write_bytes(b"kept")
    (tmp_path / ".streambuf" / "manifest.json").write_text("{not json")
    url = http_server.url("shard-000003.tar")
    caplog.set_level(logging.WARNING, logger="streambuf")
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == (shard_dir / "shard-000003.tar").read_bytes()
    assert "manifest" in caplog.text and "delete" in caplog.text
    assert (tmp_path / ".streambuf" / "data" / "x.tar").read_bytes() == b"kept"
    assert cache.stats().writes == 0


def test_cached_file_for_videos(http_server: FaultyServer, shard_dir: Path, tmp_path: Path) -> None:
    url = http_server.url("shard-000000.tar")
    data = (shard_dir / "shard-000000.tar").read_bytes()
    for _ in range(2):
        f = cached_file(url, cache_dir=tmp_path, cache_limit=1 << 30, **FAST)
        assert f is not None
        with f:
            f.seek(len(data) - 100)
            assert f.read() == data[-100:]
    assert len(http_server.records()) == 1  # downloaded once, then a local file
    assert cached_file(url, cache_dir=tmp_path / "small", cache_limit=100, **FAST) is None
    assert cached_file("/local/video.mp4", cache_dir=tmp_path, cache_limit=1 << 30) is None


def test_a_file_at_an_entrys_path_is_not_replaced(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    cache = ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000001.tar")
    squatter = tmp_path / ".streambuf" / "data" / cache._file_name(cache.key(url), url)
    squatter.write_bytes(b"someone else's")
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == (shard_dir / "shard-000001.tar").read_bytes()
    assert squatter.read_bytes() == b"someone else's" and cache.stats().writes == 0
    assert cache.usage() == 0 and not list((tmp_path / ".streambuf" / "tmp").iterdir())


def test_a_forked_child_does_not_keep_the_cache_locks(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    """A process forked (a DataLoader starting its workers) while this one holds the
    manifest lock, a key's writer lock and an entry's read lock holds none of them."""
    size = (shard_dir / "shard-000000.tar").stat().st_size
    cache = ShardCache(tmp_path, size)  # room for one entry
    u0, u1 = http_server.url("shard-000000.tar"), http_server.url("shard-000001.tar")
    with cache.open(u0, offset=0, length=None, remote=remote_of(u0), block_bytes=4096) as f:
        f.read()
    reader = cache.open(u0, offset=0, length=None, remote=remote_of(u0), block_bytes=4096)
    other = ShardCache(tmp_path / "w", 1 << 30)
    writer = other.open(u1, offset=0, length=None, remote=remote_of(u1), block_bytes=4096)
    writer.read(4096)  # holds u1's key lock in folder "w"
    ctx = mp.get_context("fork")
    release = ctx.Event()
    child = ctx.Process(target=release.wait, args=(60,))
    with cache._m.update():
        child.start()
    try:
        reader.close()
        writer.close()  # cut short: discarded, its key lock released
        t0 = time.monotonic()
        with cache._m.update():
            pass
        assert time.monotonic() - t0 < 1.0, "the child kept the manifest lock"
        with cache.open(u1, offset=0, length=None, remote=remote_of(u1), block_bytes=4096) as f:
            f.read()  # evicts u0: nobody may still hold its read lock
        assert cache.stats().evictions == 1 and cache.stats().writes == 2
        with other.open(u1, offset=0, length=None, remote=remote_of(u1), block_bytes=4096) as f:
            f.read()  # writes u1: nobody may still hold its key lock
        assert other.stats().writes == 1
    finally:
        release.set()
        child.join(30)


def test_one_crc_check_serves_every_process_until_a_reboot(
    http_server: FaultyServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[int] = []
    real = cache_io._crc_of
    monkeypatch.setattr(cache_io, "_crc_of", lambda fd: checks.append(fd) or real(fd))
    cache = ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000002.tar")

    def hit() -> None:
        cache_io.VERIFIED.clear()  # as a new process finds it
        with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
            f.read()

    hit()  # written: its crc32 is the one computed from the download
    hit()
    assert cache.stats().hits == 1 and checks == []
    monkeypatch.setattr(cache_io, "BOOT", "another-boot")  # a crash, a power loss
    hit()
    assert len(checks) == 1, "after a reboot every entry is checked again"
    hit()
    assert len(checks) == 1 and cache.stats().hits == 3 and len(http_server.records()) == 1


def test_cached_file_is_what_pyav_decodes(tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    (tmp_path / "v").mkdir()
    with av.open(str(tmp_path / "v" / "clip.mp4"), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(12):
            img = np.full((48, 64, 3), i * 20, dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, "rgb24")))
        out.mux(stream.encode(None))
    with FaultyServer(tmp_path / "v") as srv:
        f = cached_file(srv.url("clip.mp4"), cache_dir=tmp_path / "c", cache_limit="1MiB", **FAST)
        assert f is not None
        with f, av.open(f) as container:
            frames = [fr.to_ndarray(format="gray")[0, 0] for fr in container.decode(video=0)]
    assert len(frames) == 12 and frames[0] < frames[-1]


def test_a_failing_disk_never_fails_the_read(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Full(io.BytesIO):
        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module, "open", lambda *a, **k: Full(), raising=False)
    cache = ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000000.tar")
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == (shard_dir / "shard-000000.tar").read_bytes()
    assert cache.stats().writes == 0 and cache.usage() == 0


def test_an_unusable_cache_folder_streams(
    http_server: FaultyServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / ".streambuf").write_text("a file where the cache's folder goes")
    caplog.set_level(logging.WARNING, logger="streambuf")
    spec = http_server.base_url + "/shard-{000000..000003}.tar"
    pipe = sb.shards(spec, cache_dir=str(tmp_path), cache_limit="1GiB", **FAST)
    assert sorted(keys_of(pipe.batch(8))) == sorted(expected_keys(4, 20))
    assert "unusable" in caplog.text and str(tmp_path) in caplog.text
    assert shard_stats(pipe).cache == sb.io.CacheStats()


def test_a_lock_held_by_a_hung_process_is_waited_for_once(
    http_server: FaultyServer,
    shard_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process that hangs holding the manifest lock costs one bounded wait: later
    opens stream at once (each paid the whole wait again, 10 s a shard, with one warning
    for them all), and the cache is used again once the lock is free."""
    import fcntl

    from streambuf.io import _manifest

    wait = 2.0
    monkeypatch.setattr(_manifest, "LOCK_TIMEOUT_S", wait)
    caplog.set_level(logging.WARNING, logger="streambuf")
    cache = ShardCache(tmp_path, 1 << 30)
    hung = os.open(tmp_path / ".streambuf" / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(hung, fcntl.LOCK_EX)  # (another open file: a lock of its own)
    took = []
    for i in range(4):
        url = http_server.url(f"shard-{i:06d}.tar")
        t0 = time.monotonic()
        with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
            assert f.read() == (shard_dir / f"shard-{i:06d}.tar").read_bytes()
        took.append(time.monotonic() - t0)
    assert took[0] >= wait and max(took[1:]) < wait / 2, took
    assert cache.stats().writes == 0 and "held for more than" in caplog.text
    os.close(hung)  # the hung process goes away
    url = http_server.url("shard-000000.tar")
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        f.read()
    assert cache.stats().writes == 1


def test_a_manifest_write_failing_after_the_rename_leaves_no_orphan(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills just as an entry is committed: its file was renamed into data/, the
    manifest could not say so, and that orphan made every later commit of the key fail
    silently, even with room again. Now the file is taken back out."""
    from streambuf.io import _manifest

    cache = ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000002.tar")
    data = (shard_dir / "shard-000002.tar").read_bytes()
    real_replace, full = os.replace, [True]

    def replace(src: Any, dst: Any) -> None:
        if full[0] and str(dst).endswith("manifest.json") and any(cache_root.iterdir()):
            full[0] = False
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    cache_root = tmp_path / ".streambuf" / "data"
    monkeypatch.setattr(_manifest.os, "replace", replace)
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data
    assert not full[0] and cache.stats().writes == 0
    assert not list(cache_root.iterdir())  # no orphan left in data/
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data
    assert cache.stats().writes == 1 and cache.usage() == len(data)


def test_a_dead_writers_file_at_the_entrys_path_is_replaced(
    http_server: FaultyServer, shard_dir: Path, tmp_path: Path
) -> None:
    """A writer died between its rename and its manifest write: its reservation names the
    file. With room to spare no sweep runs, so the key's next writer replaces it."""
    cache = ShardCache(tmp_path, 1 << 30)
    url = http_server.url("shard-000003.tar")
    root = tmp_path / ".streambuf"
    key, name = cache.key(url), cache._file_name(cache.key(url), url)
    (root / "data" / name).write_bytes(b"half of a dead writer's entry")
    dead = "999-" + "ab" * 16
    manifest: dict[str, Any] = {"version": 1, "entries": {}, "reserved": {}}
    manifest["reserved"][dead] = {"key": key, "file": name, "size": 10, "t": 0}
    (root / "manifest.json").write_text(json.dumps(manifest))
    data = (shard_dir / "shard-000003.tar").read_bytes()
    with cache.open(url, offset=0, length=None, remote=remote_of(url), block_bytes=4096) as f:
        assert f.read() == data
    assert cache.stats().writes == 1 and (root / "data" / name).read_bytes() == data
    assert entries(tmp_path)[key]["file"] == name and cache.usage() == len(data)
