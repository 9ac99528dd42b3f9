"""``token_files`` over S3 (moto on loopback) and with the node-local cache: blocks equal
``numpy.memmap`` slices of the same files; a cached file is fetched once, later epochs
read the cache's copy; a cache too small to hold a file reads it remotely; the per-process
descriptor table stays bounded while threads read many files."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from tests.test_token_files import SEQ, SIZES, blocks_of, check_blocks, write_files

from .httpserver import FaultyServer

token_files_module = importlib.import_module("streambuf.token_files")

pytestmark = pytest.mark.timeout(120)


def loader(pipe: sb.Pipeline) -> sb.Loader:
    return sb.Loader(pipe.batch(4), num_workers=2, max_batches=4, max_bytes="4MiB", timeout_s=60)


def unbatch(batches: list[Any]) -> list[dict[str, Any]]:
    return [
        {"__url__": u, "block": int(b), "tokens": t}
        for batch in batches
        for u, b, t in zip(batch["__url__"], batch["block"], batch["tokens"])
    ]


def test_s3_blocks_equal_memmap_slices(
    tmp_path: Path, moto_endpoint: str, s3_options: dict[str, Any]
) -> None:
    import boto3

    paths = write_files(tmp_path)
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="tokens")
    for p in paths:
        client.put_object(Bucket="tokens", Key=Path(p).name, Body=Path(p).read_bytes())
    urls = [f"s3://tokens/{Path(p).name}" for p in paths]
    pipe = sb.token_files(urls, seq_len=SEQ, overlap=1, storage_options=s3_options, threads=2)
    samples = unbatch(list(loader(pipe)))
    check_blocks(samples, dict(zip(urls, paths)), "uint16", 1)


def test_cached_files_are_fetched_once_and_read_locally_after(tmp_path: Path) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    paths = write_files(data)
    with FaultyServer(data) as server:
        urls = [server.url(Path(p).name) for p in paths]
        pipe = sb.token_files(
            urls, seq_len=SEQ, overlap=1, threads=2, cache_dir=cache, cache_limit="1MiB"
        )
        ld = loader(pipe)
        check_blocks(unbatch(list(ld)), dict(zip(urls, paths)), "uint16", 1)
        first = len(server.records())
        assert 0 < first
        assert sorted(
            f.name
            for f in cache.rglob("*")
            if f.is_file() and f.stat().st_size in {2 * n for n in SIZES}
        )
        ld.set_epoch(1)
        again = unbatch(list(ld))
        check_blocks(again, dict(zip(urls, paths)), "uint16", 1)
        assert len(server.records()) == first  # epoch 1: every block from the cache


def test_a_cache_too_small_for_a_file_reads_it_remotely(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    paths = write_files(data)
    with FaultyServer(data) as server:
        urls = [server.url(Path(p).name) for p in paths]
        pipe = sb.token_files(
            urls, seq_len=SEQ, cache_dir=tmp_path / "cache", cache_limit=100, threads=2
        )
        samples = list(pipe)
        ranged = [r for r in server.records() if r.range_start is not None]
    check_blocks(samples, dict(zip(urls, paths)), "uint16", 0)
    assert len(ranged) >= sum(blocks_of(n, 0) for n in SIZES)  # a request per block


def test_descriptors_stay_bounded_while_threads_read_many_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(token_files_module, "_MAX_FDS", 1)  # 3 files, 1 descriptor kept
    paths = write_files(tmp_path)
    pipe = sb.token_files(paths, seq_len=SEQ, threads=4, seed=5)
    for epoch in range(3):
        pipe.set_epoch(epoch)
        check_blocks(list(pipe), {p: p for p in paths}, "uint16", 0)
    read = pipe._stages[0].fn  # the block reader of this process
    handles = read._handles
    assert handles is not None and len(handles.open) <= 1
    assert all(users == 0 for _, _, users in handles.open.values())


def test_a_descriptor_in_use_is_never_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table closes the least recently used descriptor that no thread reads: one a
    thread still reads stays open past the bound until released."""
    import os

    monkeypatch.setattr(token_files_module, "_MAX_FDS", 1)
    paths = write_files(tmp_path)
    handles = token_files_module._Handles()

    def opener(f: int) -> Any:
        def open_() -> tuple[int, Any]:
            fd = os.open(paths[f], os.O_RDONLY)
            return fd, lambda: os.close(fd)

        return open_

    fd0 = handles.acquire(0, opener(0))
    fd1 = handles.acquire(1, opener(1))  # over the bound, but 0 is being read
    assert fd0 is not None and fd1 is not None
    assert os.pread(fd0, 2, 0) == Path(paths[0]).read_bytes()[:2]  # still open, still file 0
    handles.release(0)
    handles.release(1)
    fd2 = handles.acquire(2, opener(2))
    assert list(handles.open) == [2]  # 0 and 1 closed once nobody read them
    assert fd2 is not None
    handles.release(2)
    assert handles.acquire(2, opener(2)) == fd2  # kept: the same descriptor again
