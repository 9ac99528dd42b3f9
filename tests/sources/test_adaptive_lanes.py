"""Shard lanes <-> inline reading (``shards(adaptive=True)``, issue 25): switching between
the lane threads and the consumer's thread keeps the order, loses and repeats nothing,
keeps resume exact, and local files start inline."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from streambuf._inline import InlineChooser
from streambuf.errors import ShardError
from streambuf.io import expand_urls
from streambuf.sources import stream_shards
from streambuf.testing import check_resume

from .helpers import expected_keys, make_shards, switching_lanes
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
