from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path

import pytest

from streambuf.errors import ShardError
from streambuf.io import IOCounters, open_stream
from streambuf.sources import iter_tar_samples

from .helpers import make_shards
from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(30)
FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)
NAME = "shard-000001.tar"


def read_keys(stream) -> list[str]:  # type: ignore[no-untyped-def]
    return [s["__key__"] for s in iter_tar_samples(stream, url=stream.url)]


def test_local_path_and_file_url(shard_dir: Path) -> None:
    path = shard_dir / NAME
    for url in (str(path), f"file://{path}"):
        with open_stream(url) as f:
            assert f.read() == path.read_bytes()
            assert f.size == path.stat().st_size and f.retries == 0


def test_local_missing(tmp_path: Path) -> None:
    with pytest.raises(ShardError) as info:
        open_stream(str(tmp_path / "nope.tar"))
    assert info.value.stage == "open" and "nope.tar" in str(info.value)


def test_http_plain(http_server: FaultyServer, shard_dir: Path) -> None:
    counters = IOCounters()
    with open_stream(http_server.url(NAME), counters=counters, block_bytes=4096) as f:
        assert f.read() == (shard_dir / NAME).read_bytes()
    snap = counters.snapshot()
    assert snap.opens == 1 and snap.requests == 1 and snap.retries == 0
    assert snap.bytes == (shard_dir / NAME).stat().st_size


def test_5xx_then_success(http_server: FaultyServer, shard_dir: Path) -> None:
    http_server.fail(f"/{NAME}", times=3, status=503)
    with open_stream(http_server.url(NAME), **FAST) as f:
        keys = read_keys(f)
        assert f.retries == 3
    assert keys == [f"s001/{i:05d}" for i in range(20)]
    assert [r.status for r in http_server.records()] == [503, 503, 503, 200]


def test_drop_mid_body_resumes_with_range(http_server: FaultyServer, shard_dir: Path) -> None:
    size = (shard_dir / NAME).stat().st_size
    http_server.drop(f"/{NAME}", after_bytes=7000, times=1)
    http_server.drop(f"/{NAME}", after_bytes=3000, times=1)
    with open_stream(http_server.url(NAME), block_bytes=4096, **FAST) as f:
        keys = read_keys(f)
        pos = f.tell()
        assert f.read() == b"\0" * (size - pos)  # the tar's zero padding
        data_retries = f.retries
    assert keys == [f"s001/{i:05d}" for i in range(20)]
    assert data_retries == 2
    recs = http_server.records(f"/{NAME}")
    assert [r.range_start for r in recs] == [None, 7000, 10000]
    assert [r.status for r in recs] == [200, 206, 206]
    deadline = time.monotonic() + 2  # the server notes bytes_sent just after its write
    while sum(r.bytes_sent for r in recs) < size and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(r.bytes_sent for r in recs) == size  # nothing read twice, nothing from 0


def test_drop_full_read_bytes_identical(http_server: FaultyServer, shard_dir: Path) -> None:
    http_server.drop("*", after_bytes=5000, times=4)
    with open_stream(http_server.url(NAME), **FAST) as f:
        assert f.read() == (shard_dir / NAME).read_bytes()


@pytest.mark.serial
def test_stall_triggers_timeout_and_resume(http_server: FaultyServer, shard_dir: Path) -> None:
    http_server.stall(f"/{NAME}", after_bytes=6000, seconds=3)
    t0 = time.monotonic()
    with open_stream(http_server.url(NAME), timeout_s=0.3, backoff_s=0.01) as f:
        assert f.read() == (shard_dir / NAME).read_bytes()
        assert f.retries == 1
    assert time.monotonic() - t0 < 2.5
    assert [r.range_start for r in http_server.records(f"/{NAME}")] == [None, 6000]


def test_slow_trickle_within_timeout_is_not_an_error(
    http_server: FaultyServer, shard_dir: Path
) -> None:
    http_server.trickle = (8192, 0.01)
    with open_stream(http_server.url(NAME), timeout_s=1) as f:
        assert f.read() == (shard_dir / NAME).read_bytes()
        assert f.retries == 0


def test_404_fails_at_once_naming_url(http_server: FaultyServer) -> None:
    url = http_server.url("missing.tar")
    with pytest.raises(ShardError) as info:
        open_stream(url, **FAST)
    assert info.value.stage == "open" and url in str(info.value) and "404" in str(info.value)
    assert len(http_server.records()) == 1  # no retries


def test_retries_exhausted(http_server: FaultyServer) -> None:
    http_server.drop(f"/{NAME}", after_bytes=2000, times=1)
    f = open_stream(http_server.url(NAME), retries=2, **FAST)
    http_server.fail(f"/{NAME}", times=10, status=500)
    with pytest.raises(ShardError) as info:
        f.read()
    f.close()
    msg = str(info.value)
    assert info.value.stage == "read" and "offset 2000" in msg and "HTTP 500" in msg
    assert http_server.url(NAME) in msg
    assert len(http_server.records()) == 3  # the first GET (dropped) + 2 retries


def test_server_ignoring_range_is_handled(http_server: FaultyServer, shard_dir: Path) -> None:
    """A 200 answer to a resume with the same strong ETag is the same object: the bytes
    already delivered are received again and discarded, never delivered twice."""
    http_server.ignore_range = True
    http_server.drop(f"/{NAME}", after_bytes=5000)
    counters = IOCounters()
    with open_stream(http_server.url(NAME), counters=counters, **FAST) as f:
        assert f.read() == (shard_dir / NAME).read_bytes()
        assert f.retries == 1
    assert counters.snapshot().discarded_bytes == 5000
    recs = http_server.records()
    assert [r.status for r in recs] == [200, 200]
    assert recs[1].range_start == 5000
    etag = recs[1].headers.get("If-Range", "")
    assert etag.startswith('"') and not etag.startswith("W/")  # a strong ETag was served


@pytest.mark.parametrize("server", ["if_range", "ignore_range", "ignore_if_range"])
def test_object_replaced_during_read_is_refused(
    http_server: FaultyServer, shard_dir: Path, server: str
) -> None:
    """The shard is replaced between the first GET and the resume: the server answers 200
    with a new ETag (If-Range no longer matches, or Range is ignored), or 206 with a new
    ETag (a server without If-Range). Mixing the two versions would corrupt the shard, so
    it is a ShardError naming the URL, not retried."""
    http_server.ignore_range = server == "ignore_range"
    http_server.ignore_if_range = server == "ignore_if_range"
    http_server.drop(f"/{NAME}", after_bytes=5000)
    path = shard_dir / NAME
    f = open_stream(http_server.url(NAME), **FAST)
    new = path.with_suffix(".new")
    new.write_bytes(path.read_bytes()[::-1])  # same size, other bytes
    os.utime(new, ns=(path.stat().st_mtime_ns + 10**9,) * 2)
    os.replace(new, path)
    with pytest.raises(ShardError) as info:
        f.read()
    f.close()
    msg = str(info.value)
    assert info.value.stage == "read" and http_server.url(NAME) in msg
    assert "changed while it was being read" in msg and "ETag" in msg
    assert len(http_server.records()) == 2  # no retries after the change was seen


def test_credentials_never_shown(
    http_server: FaultyServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="streambuf")
    port = http_server.port
    http_server.fail("*", times=100, status=503)
    for url in (
        f"http://user:hunter22@127.0.0.1:{port}/{NAME}",
        f"http://127.0.0.1:{port}/{NAME}?X-Amz-Signature=abcsig99&X-Amz-Credential=cred77",
    ):
        with pytest.raises(ShardError) as info:
            open_stream(url, retries=2, **FAST)
        text = str(info.value) + repr(info.value) + caplog.text + str(info.value.source)
        for secret in ("hunter22", "abcsig99", "cred77"):
            assert secret not in text
    assert "Authorization" in http_server.log[0].headers  # basic auth was sent, not shown


def test_basic_auth_404(http_server: FaultyServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="streambuf")
    with pytest.raises(ShardError) as info:
        open_stream(f"http://user:hunter22@127.0.0.1:{http_server.port}/x.tar")
    assert "hunter22" not in str(info.value) + caplog.text
    assert "127.0.0.1" in str(info.value)


def test_semaphore_caps_concurrency(tmp_path: Path) -> None:
    make_shards(tmp_path, 4, 20, payload=20_000)
    with FaultyServer(tmp_path) as srv:
        srv.latency_s = 0.05
        active, peak = [0], [0]
        lock = threading.Lock()

        class Counting(threading.BoundedSemaphore):
            def __enter__(self) -> bool:
                ok = super().__enter__()
                with lock:
                    active[0] += 1
                    peak[0] = max(peak[0], active[0])
                return ok

            def __exit__(self, *a: object) -> None:
                with lock:
                    active[0] -= 1
                super().__exit__(*a)

        sem = Counting(1)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                with open_stream(
                    srv.url(f"shard-{i:06d}.tar"), max_concurrent_io=sem, block_bytes=65536
                ) as f:
                    f.read()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not errors and peak[0] == 1
        assert len(srv.records()) == 4


def test_abort_unblocks_a_stalled_read(http_server: FaultyServer) -> None:
    http_server.stall(f"/{NAME}", after_bytes=100, seconds=10)
    f = open_stream(http_server.url(NAME), timeout_s=20, block_bytes=4096)
    threading.Timer(0.2, f.abort).start()
    t0 = time.monotonic()
    with pytest.raises(ShardError, match="aborted"):
        f.read()
    assert time.monotonic() - t0 < 2
    f.close()


SLOW = dict(min_rate_bps=4096, rate_window_s=0.5, backoff_s=0.01, max_backoff_s=0.05)


@pytest.mark.serial
def test_trickle_below_min_rate_is_dropped_and_resumed(
    http_server: FaultyServer, shard_dir: Path
) -> None:
    """A connection that delivers bytes, but fewer than min_rate_bps over rate_window_s of
    reading, is a transient fault: dropped, counted as a retry, resumed at the offset."""
    size = (shard_dir / NAME).stat().st_size
    http_server.trickle = (64, 0.05)  # ~1.3 KB/s: never silent for timeout_s
    counters = IOCounters()
    with open_stream(http_server.url(NAME), counters=counters, timeout_s=5, **SLOW) as f:
        head = f.read(64)  # the first chunk comes at once: no window is complete yet
        http_server.trickle = None  # the next connection is fast; this one keeps trickling
        data = head + f.read()
        assert f.retries == 1
    assert data == (shard_dir / NAME).read_bytes()
    recs = http_server.records(f"/{NAME}")
    assert [r.status for r in recs] == [200, 206]
    assert recs[0].range_start is None and 64 <= recs[1].range_start < size  # type: ignore[operator]
    assert counters.snapshot().retries == 1


@pytest.mark.serial
def test_trickle_gives_up_naming_url_offset_and_rate(http_server: FaultyServer) -> None:
    http_server.trickle = (16, 0.05)
    t0 = time.monotonic()
    f = open_stream(http_server.url(NAME), retries=2, timeout_s=5, **SLOW)
    with pytest.raises(ShardError) as info:
        f.read()
    f.close()
    msg = str(info.value)
    assert info.value.stage == "read" and http_server.url(NAME) in msg
    assert re.search(r"gave up at byte offset [1-9]\d*", msg)
    assert re.search(r"\d+ B/s", msg) and "min_rate_bps=4096" in msg
    starts = [r.range_start for r in http_server.records(f"/{NAME}")]
    assert len(starts) == 3 and starts[0] is None  # the first GET and 2 retries
    assert 0 < starts[1] < starts[2]  # type: ignore[operator]  # each resumed, never from 0
    assert time.monotonic() - t0 < 20  # 3 windows of 0.5 s; generous for a loaded machine


@pytest.mark.serial
def test_a_slow_consumer_is_not_a_slow_connection(
    http_server: FaultyServer, shard_dir: Path
) -> None:
    """Only time spent waiting for the transport counts: a reader that pauses between
    reads (backpressure) does not make a fast connection look slow."""
    with open_stream(
        http_server.url(NAME), block_bytes=4096, min_rate_bps=10**6, rate_window_s=0.2
    ) as f:
        chunks = []
        while chunk := f.read(8192):
            chunks.append(chunk)
            time.sleep(0.02)
        assert f.retries == 0
    assert b"".join(chunks) == (shard_dir / NAME).read_bytes()


@pytest.mark.parametrize(
    "kw",
    [
        {"min_rate_bps": -1},
        {"min_rate_bps": float("nan")},
        {"min_rate_bps": float("inf")},
        {"min_rate_bps": "1KiB"},
        {"rate_window_s": 0},
        {"rate_window_s": float("inf")},
        {"rate_window_s": None},
    ],
)
def test_rate_options_validated(shard_dir: Path, kw: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        open_stream(shard_dir / NAME, **kw)


@pytest.mark.serial
@pytest.mark.parametrize("off", [None, 0])
def test_min_rate_can_be_disabled(
    http_server: FaultyServer, shard_dir: Path, off: int | None
) -> None:
    http_server.trickle = (4096, 0.05)
    with open_stream(http_server.url(NAME), min_rate_bps=off, rate_window_s=0.1) as f:
        assert f.read() == (shard_dir / NAME).read_bytes() and f.retries == 0


def test_raw_readinto_takes_strided_and_typed_buffers(tmp_path: Path) -> None:
    """Reads go straight into the caller's buffer when it is contiguous; a strided view
    is filled through a temporary (as before reads in place)."""
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(100)))
    with open_stream(str(path)) as f:
        raw = f.raw
        strided = bytearray(10)
        assert raw.readinto(memoryview(strided)[::2]) == 5
        assert strided[::2] == bytes(range(5))
        plain = bytearray(4)
        assert raw.readinto(plain) == 4 and plain == bytes(range(5, 9))
