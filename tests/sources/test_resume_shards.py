"""Checkpoint and resume of ``sb.shards`` pipelines: local tar files and HTTP with faults
injected (the save/load harness), cheap resume (ranged requests at the next sample, no
prefix re-read), elastic resume, and first_ready lanes (exactly once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.resume_harness import check_save_load, counted_once, resume_and_finish, save_after

from .helpers import expected_keys
from .httpserver import FaultyServer
from .resume_data import shard_loader

pytestmark = pytest.mark.timeout(300)

# 4 shards x 20 samples, batches of 4: 20 batches; 5 batches per shard (on a boundary)
STOPS = [1, 3, 10, 19, "last", "end"]


@pytest.mark.parametrize("workers", [0, 2])
def test_local_shards(shard_dir: Path, workers: int) -> None:
    check_save_load(shard_loader, {"spec": str(shard_dir / "*.tar"), "workers": workers}, STOPS)


def test_local_shards_without_shuffle_stop_on_shard_boundary(shard_dir: Path) -> None:
    # one worker, one lane, no shuffle: batch 5 ends exactly at the end of the first shard
    kw = {"spec": str(shard_dir / "*.tar"), "workers": 0, "lanes": 1, "shuffle": 0}
    check_save_load(shard_loader, kw, [5, 10, 15])


def test_http_with_faults(http_server: FaultyServer) -> None:
    http_server.fail("*", times=4, status=503)
    http_server.drop("/shard-000001.tar", after_bytes=9000, times=3)
    spec = http_server.base_url + "/shard-{000000..000003}.tar"
    check_save_load(shard_loader, {"spec": spec, "workers": 2}, [2, 9, "last"])
    assert sum(r.status == 503 for r in http_server.records()) == 4  # the faults did happen


def test_resume_reads_only_what_is_left(http_server: FaultyServer) -> None:
    spec = http_server.base_url + "/shard-{000000..000003}.tar"
    kw = {"spec": spec, "workers": 0, "lanes": 2, "shuffle": 0}
    list(shard_loader(**kw))
    total = sum(r.bytes_sent for r in http_server.records())
    first, state = save_after(shard_loader, kw, 14)  # 56 of 80 samples delivered
    before = len(http_server.log)
    rest, _ = resume_and_finish(shard_loader, kw, state)
    resumed = http_server.records()[before:]
    assert len(first) + len(rest) == 20
    sent = sum(r.bytes_sent for r in resumed)
    assert sent < 0.45 * total, (sent, total)  # ~30% left: no shard re-read from byte 0
    assert all(r.range_start for r in resumed if r.path.endswith(("1.tar", "3.tar")))


def test_first_ready_lanes_resume_exactly_once(shard_dir: Path) -> None:
    kw = {"spec": str(shard_dir / "*.tar"), "workers": 2, "order": "first_ready"}
    first, state = save_after(shard_loader, kw, 7)
    rest, _ = resume_and_finish(shard_loader, kw, state)
    counted_once([k for b in first + rest for k in b], sorted(expected_keys(4, 20)))


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 1), (0, 2)])
def test_elastic_num_workers(shard_dir: Path, old: int, new: int) -> None:
    spec = str(shard_dir / "*.tar")
    first, state = save_after(shard_loader, {"spec": spec, "workers": old}, 6)
    rest, _ = resume_and_finish(shard_loader, {"spec": spec, "workers": new}, state)
    counted_once([k for b in first + rest for k in b], sorted(expected_keys(4, 20)))
