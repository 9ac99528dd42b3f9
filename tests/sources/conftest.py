"""Fixtures for the source tests: a faulty HTTP server, shards on disk, an S3 (moto) server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import make_shards
from .httpserver import FaultyServer


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never route test traffic through a proxy from the environment."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def shard_dir(tmp_path: Path) -> Path:
    """4 shards x 20 samples (keys s000/00000 .. s003/00019), ~1 KB payload each."""
    make_shards(tmp_path / "shards", 4, 20)
    return tmp_path / "shards"


@pytest.fixture
def http_server(shard_dir: Path) -> Iterator[FaultyServer]:
    """A FaultyServer serving ``shard_dir``; faults and log are fresh for each test."""
    with FaultyServer(shard_dir) as srv:
        yield srv


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """An S3-compatible moto server on 127.0.0.1 (one per session)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_options(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return {"endpoint_url": moto_endpoint, "key": "testing", "secret": "testing"}


@pytest.fixture
def s3_bucket(moto_endpoint: str, s3_options: dict[str, Any], shard_dir: Path) -> str:
    """A fresh bucket holding every file of ``shard_dir``; returns its name."""
    import boto3

    name = f"test-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    for path in sorted(shard_dir.iterdir()):
        client.put_object(Bucket=name, Key=path.name, Body=path.read_bytes())
    return name
