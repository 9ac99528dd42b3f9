from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from streambuf.errors import ShardError
from streambuf.io import expand_urls, open_stream
from streambuf.io.opener import FETCH_GROWTH
from streambuf.sources import stream_shards

from .helpers import expected_keys
from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(60)
FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)


def test_s3_read_shards(s3_bucket: str, s3_options: dict[str, Any], shard_dir: Path) -> None:
    urls = expand_urls(f"s3://{s3_bucket}/shard-{{000000..000003}}.tar")
    with open_stream(urls[1], storage_options=s3_options, block_bytes=16384) as f:
        assert f.read() == (shard_dir / "shard-000001.tar").read_bytes()
    stream = stream_shards(urls, lanes=2, storage_options=s3_options, block_bytes="16KiB")
    samples = list(stream)
    assert len(samples) == 80 and {s["__key__"] for s in samples} == expected_keys(4, 20)
    assert {s["__url__"] for s in samples} == set(urls)
    assert stream.stats().io.requests >= 4


def test_s3_glob(s3_bucket: str, s3_options: dict[str, Any]) -> None:
    urls = expand_urls(f"s3://{s3_bucket}/shard-*.tar", storage_options=s3_options)
    assert urls == [f"s3://{s3_bucket}/shard-{i:06d}.tar" for i in range(4)]


def test_s3_missing_key_fails_at_once(
    s3_bucket: str, s3_options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    opts = {**s3_options, "secret": "supersecretvalue", "key": "AKIASECRETKEYID"}
    caplog.set_level(logging.DEBUG, logger="streambuf")
    with pytest.raises(ShardError) as info:
        open_stream(f"s3://{s3_bucket}/nope.tar", storage_options=opts, **FAST)
    assert info.value.stage == "open" and "nope.tar" in str(info.value)
    text = str(info.value) + caplog.text
    assert "supersecretvalue" not in text and "AKIASECRETKEYID" not in text


def test_s3_resume_through_faulty_proxy(
    moto_endpoint: str, s3_bucket: str, s3_options: dict[str, Any], shard_dir: Path
) -> None:
    """Connections dropped mid-body and 503s between client and S3: every byte once."""
    size = (shard_dir / "shard-000002.tar").stat().st_size
    block = 2048  # the shard (~50 KB) spans requests growing to FETCH_GROWTH blocks
    with FaultyServer(upstream=moto_endpoint) as proxy:
        opts = {
            **s3_options,
            "endpoint_url": proxy.base_url,
            "config_kwargs": {"retries": {"max_attempts": 1}},
            "skip_instance_cache": True,
        }
        path = f"/{s3_bucket}/shard-000002.tar"
        proxy.drop(path, after_bytes=1000, times=2)
        proxy.fail(path, times=1, status=503)
        with open_stream(
            f"s3://{s3_bucket}/shard-000002.tar", storage_options=opts, block_bytes=block, **FAST
        ) as f:
            data = f.read()
        assert data == (shard_dir / "shard-000002.tar").read_bytes()
        gets = proxy.records(path)
        starts = [
            int(r.headers["Range"].split("=")[1].split("-")[0])
            for r in gets
            if "Range" in r.headers
        ]
        # every ranged GET starts where the bytes delivered had reached (no re-read from
        # 0), its size growing from one block to FETCH_GROWTH blocks (few requests), the
        # rest in one request once it fits in a full-grown one
        grown, at, n = [], 0, block
        while at < size:
            grown.append(at)
            rest = size - at
            at += rest if rest <= FETCH_GROWTH * block else min(n, rest)
            n = min(2 * n, FETCH_GROWTH * block)
        assert len(grown) >= 4, "the shard must span growing requests"
        assert starts == sorted(starts) and sorted(set(starts)) == grown
        # the faults really happened (s3fs retries some itself, below our counter)
        assert len(gets) >= len(starts) and sum(r.status == 503 for r in proxy.log) == 1
        assert len(starts) == len(grown) + 2  # two dropped reads were re-issued


def test_s3_small_object_is_one_request(
    moto_endpoint: str, s3_bucket: str, s3_options: dict[str, Any], shard_dir: Path
) -> None:
    """An object of at most FETCH_GROWTH blocks is one ranged GET (the request's latency
    and CPU paid once), and a read that starts inside one takes its rest in one."""
    shard = shard_dir / "shard-000003.tar"
    size = shard.stat().st_size
    block = 16384
    assert 2 * block < size <= FETCH_GROWTH * block
    with FaultyServer(upstream=moto_endpoint) as proxy:
        opts = {**s3_options, "endpoint_url": proxy.base_url, "skip_instance_cache": True}
        url = f"s3://{s3_bucket}/{shard.name}"
        with open_stream(url, storage_options=opts, block_bytes=block, **FAST) as f:
            assert f.read() == shard.read_bytes()
        with open_stream(url, storage_options=opts, block_bytes=block, offset=100, **FAST) as f:
            assert f.read() == shard.read_bytes()[100:]
        ranges = [r.headers["Range"] for r in proxy.records() if "Range" in r.headers]
    assert ranges == [f"bytes=0-{size - 1}", f"bytes=100-{size - 1}"], ranges


def test_s3_bounded_read_requests_only_its_range(
    moto_endpoint: str, s3_bucket: str, s3_options: dict[str, Any], shard_dir: Path
) -> None:
    """A ranged fetch (a resume's pending samples) asks for its bytes, not a grown block."""
    want = (shard_dir / "shard-000001.tar").read_bytes()[1000:4000]
    with FaultyServer(upstream=moto_endpoint) as proxy:
        opts = {**s3_options, "endpoint_url": proxy.base_url, "skip_instance_cache": True}
        url = f"s3://{s3_bucket}/shard-000001.tar"
        with open_stream(url, storage_options=opts, offset=1000, length=3000, **FAST) as f:
            assert f.read() == want
        ranges = [r.headers["Range"] for r in proxy.records() if "Range" in r.headers]
    assert ranges and all(int(r.rsplit("-", 1)[1]) <= 3999 for r in ranges), ranges


def test_a_loader_charge_caps_the_s3_requests(
    moto_endpoint: str, s3_bucket: str, s3_options: dict[str, Any], shard_dir: Path
) -> None:
    """Over fsspec a lane holds what one request brought (8 blocks by default); in a
    Loader whose max_bytes cannot hold that, the largest request is cut first: every GET
    the server saw is at most the fitted size, and every sample comes once."""
    import streambuf as sb

    size = (shard_dir / "shard-000000.tar").stat().st_size
    with FaultyServer(upstream=moto_endpoint) as proxy:
        opts = {**s3_options, "endpoint_url": proxy.base_url, "skip_instance_cache": True}
        pipe = sb.shards(
            f"s3://{s3_bucket}/shard-{{000000..000003}}.tar",
            lanes=2,
            storage_options=opts,
            block_bytes="16KiB",
            readahead_bytes=0,
            **FAST,
        )
        loader = sb.Loader(pipe.batch(5), num_workers=1, max_batches=2, max_bytes="256KiB")
        fit = pipe._src.reader.fit(loader.read_bytes, lanes=2, fsspec=True)
        assert fit.request < size < 8 * 16 * 1024  # one GET a shard, as set
        keys = [k for b in loader for k in b["__key__"]]
        assert sorted(keys) == sorted(expected_keys(4, 20))
        gets = [r for r in proxy.records() if r.method == "GET" and "Range" in r.headers]
        assert len(gets) >= 8 and max(r.bytes_sent for r in gets) <= fit.request
