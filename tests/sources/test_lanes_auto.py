"""``shards(lanes="auto")`` (issue 26): the lane count is ``AUTO_LANES`` (a constant, so
the round-robin order and a resume's cursors never depend on timing), the lanes run on
threads or inline by measurement, every sample once, resume exact."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from streambuf.sources import stream_shards
from streambuf.sources.options import AUTO_LANES, ShardOptions
from streambuf.testing import check_resume

from .helpers import expected_keys, make_shards

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shard_urls(tmp_path: Path) -> list[str]:
    return [str(p) for p in make_shards(tmp_path, 11, 9, payload=300)]


def test_auto_is_a_fixed_count_with_the_fixed_counts_order(shard_urls: list[str]) -> None:
    assert ShardOptions(lanes="auto").lane_count == AUTO_LANES == 8
    ref = [s["__key__"] for s in stream_shards(shard_urls, lanes=AUTO_LANES, adaptive=False)]
    got = [s["__key__"] for s in stream_shards(shard_urls, lanes="auto")]
    assert got == ref
    assert set(got) == expected_keys(11, 9) and len(got) == 99


def test_bad_lanes_are_refused_by_name(shard_urls: list[str]) -> None:
    for bad in ("many", 0, 1.5):
        with pytest.raises((TypeError, ValueError), match="lanes"):
            sb.shards(shard_urls, lanes=bad)  # type: ignore[arg-type]


def test_auto_through_a_loader_every_sample_once(shard_urls: list[str]) -> None:
    pipe = sb.shards(shard_urls, lanes="auto", shuffle_shards=True, seed=2).batch(4)
    with sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="64MiB", timeout_s=60) as ld:
        keys = [k for b in ld for k in b["__key__"]]
    assert sorted(keys) == sorted(expected_keys(11, 9))


def _pipeline(urls: list[str]) -> sb.Pipeline:
    return sb.shards(urls, lanes="auto", shuffle_shards=True, seed=3).shuffle(5, seed=1).batch(4)


def _keys(batch: Any) -> list[str]:
    return list(batch["__key__"])


def test_resume_is_exact_with_lanes_auto(shard_urls: list[str]) -> None:
    make = functools.partial(_pipeline, shard_urls)
    check_resume(make, num_workers=(0, 2), stops=(1, 7, "last"), ids=_keys)
