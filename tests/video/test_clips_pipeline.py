"""clips(): a Pipeline over many videos; exactly once, deterministic, bounded, closable."""

from __future__ import annotations

import logging
import pickle
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import streambuf.video.source as source_mod
from streambuf import Loader, Pipeline, TooManyFailures, VideoError, WorkerContext
from streambuf.video import (
    Clip,
    clips,
    clips_at_random_indices,
    clips_at_regular_indices,
    clips_at_regular_timestamps,
    decode_clips,
    every_frame_windows,
)
from tests.helpers import wait_for_threads

pytestmark = pytest.mark.timeout(60)

SAMPLER = clips_at_random_indices(num_clips=3, num_frames_per_clip=4, num_indices_between_frames=2)


@pytest.fixture(scope="module")
def paths(videos) -> list[str]:
    return sorted(str(p) for p in videos.values())


def key(c: Clip) -> tuple[str, int]:
    return str(c.source), int(c.clip_index)


def reference(paths: list[str], sampler, *, seed: int = 0, epoch: int = 0) -> dict:
    """(source, clip_index) -> clip, decoded video by video with decode_clips."""
    out = {}
    for i, p in enumerate(paths):
        for c in decode_clips(p, sampler=sampler, seed=seed, epoch=epoch, index=i):
            out[key(c)] = c
    return out


def assert_same_clips(got: list[Clip], want: dict) -> None:
    keys = [key(c) for c in got]
    assert len(keys) == len(set(keys)), "a clip was delivered twice"
    assert set(keys) == set(want)
    for c in got:
        w = want[key(c)]
        assert torch.equal(c.data, w.data)
        assert torch.equal(c.pts_seconds, w.pts_seconds)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_same_clips_as_decode_clips(paths, threads) -> None:
    pipe = clips(paths, sampler=SAMPLER, threads=threads, seed=3, shuffle_videos=True)
    pipe.set_epoch(2)
    assert_same_clips(list(pipe), reference(paths, SAMPLER, seed=3, epoch=2))


def test_glob_is_expanded_sorted(paths, video_dir) -> None:
    pipe = clips(str(Path(video_dir) / "*"), sampler=SAMPLER, shuffle_videos=False)
    assert [u for _, u in pipe._src.shards] == paths
    with pytest.raises(FileNotFoundError, match="no file matches"):
        clips(str(Path(video_dir) / "*.nothing"), sampler=SAMPLER)


def test_deterministic_per_seed_and_epoch(paths) -> None:
    def run(seed: int, epoch: int) -> list[tuple[tuple[str, int], list[float]]]:
        pipe = clips(paths, sampler=SAMPLER, seed=seed)
        pipe.set_epoch(epoch)
        return [(key(c), c.pts_seconds.tolist()) for c in pipe]

    assert run(1, 0) == run(1, 0)  # order too: lanes are delivered round robin
    assert run(1, 0) != run(1, 1)
    assert run(1, 0) != run(2, 0)


@pytest.mark.parametrize("world_size", [2, 3, 7, 12])  # 7, 12 > 5 videos: clip-level split
def test_exactly_once_across_ranks(paths, world_size) -> None:
    sampler = every_frame_windows(6)
    got: list[Clip] = []
    for rank in range(world_size):
        got += list(clips(paths, sampler=sampler, rank=rank, world_size=world_size, seed=4))
    assert_same_clips(got, reference(paths, sampler, seed=4))


def test_clip_split_decodes_only_its_clips(paths, monkeypatch) -> None:
    seen: list[int] = []
    real = source_mod.decode_clips

    def spy(src, **kw):
        for c in real(src, **kw):
            seen.append(int(c.clip_index))
            yield c

    monkeypatch.setattr(source_mod, "decode_clips", spy)
    sampler = clips_at_regular_indices(num_clips=6, num_frames_per_clip=2)
    got = list(clips(paths[:1], sampler=sampler, rank=1, world_size=3))
    assert sorted(int(c.clip_index) for c in got) == [1, 4]
    assert len(seen) == 2  # the other ranks' clips were never decoded here


def test_stage_buffer_bounded_by_stage_bytes(paths) -> None:
    sampler = every_frame_windows(4)
    clip_bytes = 4 * 3 * 48 * 64
    pipe = clips(paths, sampler=sampler, threads=2, width=64, height=48)  # equal clip sizes
    ctx = WorkerContext(0, 1, 0, 1, 0, 0)
    budget = 2 * 3 * clip_bytes + 100  # three clips (+ small tensors) per lane
    n = 0
    import time

    it = pipe._iterate(ctx, stage_bytes=budget)
    for _ in it:
        time.sleep(0.005)  # a slow consumer: the lanes fill up
        n += 1
    st = it._source.buffer_stats()
    assert n == st.gets > 10
    assert st.max_bytes == budget and st.peak_bytes <= budget and st.oversize == 0
    assert all(ln.peak_bytes <= ln.max_bytes for ln in st.lanes)
    assert st.peak_items >= 3  # the bound was reached, not just respected


def test_break_stops_lane_threads(paths) -> None:
    it = iter(clips(paths * 4, sampler=every_frame_windows(2), threads=3))
    next(it)
    it.close()
    assert wait_for_threads("streambuf-video") == []


def test_raise_names_the_file_and_lane(paths, tmp_path) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all" * 100)
    pipe = clips([*paths, str(bad)], sampler=SAMPLER, shuffle_videos=False)
    with pytest.raises(VideoError) as info:
        list(pipe)
    assert info.value.stage == "video.open" and info.value.source == str(bad)
    assert any("on lane" in n and "bad.mp4" in n for n in info.value.__notes__)
    assert wait_for_threads("streambuf-video") == []


def test_skip_counts_and_goes_on(paths, tmp_path, caplog) -> None:
    bad = [tmp_path / f"bad{i}.mp4" for i in range(2)]
    for b in bad:
        b.write_bytes(b"\0" * 1000)
    missing = str(tmp_path / "missing.mp4")
    every = [*paths, *map(str, bad)]
    with caplog.at_level(logging.WARNING, logger="streambuf"):
        got = list(clips(every, sampler=SAMPLER, on_error="skip", max_failures=2))
    assert {c.source for c in got} == set(paths) and len(got) == 3 * len(paths)
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 2
    pipe = clips(every, sampler=SAMPLER, width=16, height=16, on_error="skip", max_failures=2)
    pipe = pipe.batch(3)
    list(Loader(pipe, num_workers=2, max_batches=2, max_bytes="64MiB"))
    decoded = pipe.stats().videos  # summed over the workers
    assert (decoded.videos, decoded.clips, decoded.failures) == (len(paths), len(got), 2)
    with pytest.raises(TooManyFailures):
        list(clips([*every, missing], sampler=SAMPLER, on_error="skip", max_failures=2))


def test_fsspec_urls_opened_lazily(paths, monkeypatch) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in paths:
        fs.pipe(f"/vids/{Path(p).name}", Path(p).read_bytes())
    pipe = clips("memory://vids/*", sampler=SAMPLER, shuffle_videos=False, storage_options={})
    urls = [u for _, u in pipe._src.shards]
    assert urls == [f"memory:///vids/{Path(p).name}" for p in paths]
    pickle.loads(pickle.dumps(pipe))  # nothing opened: the pipeline crosses into workers
    got = list(pipe)
    want = reference(paths, SAMPLER)
    by_name = {(Path(s).name, i): c for (s, i), c in want.items()}
    assert len(got) == len(want)
    for c in got:
        assert str(c.source).startswith("memory://")
        assert torch.equal(c.data, by_name[(Path(str(c.source)).name, int(c.clip_index))].data)
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(ImportError, match=r"streambuf\[remote\]"):
        list(clips(urls[:1], sampler=SAMPLER))


def test_equalize_needs_a_known_clip_count(paths) -> None:
    with pytest.raises(ValueError, match="clips_per_video"):
        clips(paths, sampler=clips_at_regular_timestamps(seconds_between_clip_starts=0.5),
              equalize="drop")  # fmt: skip
    counts = Counter()
    for rank in range(3):
        pipe = clips(
            paths, sampler=SAMPLER, width=16, height=16, equalize="pad", rank=rank, world_size=3
        ).batch(2)
        counts[rank] = len(list(pipe))
    assert len(set(counts.values())) == 1  # 5 videos x 3 clips over 3 ranks: padded equal


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"layout": "HWC"}, ValueError, "layout"),
        ({"width": -1}, ValueError, "width"),
        ({"threads": 0}, ValueError, "threads"),
        ({"ffmpeg_threads": -1}, ValueError, "ffmpeg_threads"),
        ({"on_error": "ignore"}, ValueError, "on_error"),
        ({"clips_per_video": 0}, ValueError, "clips_per_video"),
        ({"sampler": object()}, TypeError, "sampler"),
    ],
)
def test_bad_arguments(paths, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        clips(paths, **{"sampler": SAMPLER, **kwargs})


def test_is_a_pipeline_of_uint8_clips(paths) -> None:
    pipe = clips(paths, sampler=SAMPLER, width=32, height=24, layout="CTHW").batch(4)
    assert isinstance(pipe, Pipeline)
    batch = next(iter(pipe))
    assert isinstance(batch, Clip) and batch.data.shape == (4, 3, 4, 24, 32)
    assert batch.data.dtype == torch.uint8 and np.all(batch.clip_index.numpy() < 3)


def test_remote_videos_are_cached_on_the_node(paths, tmp_path) -> None:
    # HTTP on loopback, 2 workers sharing one cache folder: epoch 1 downloads each video
    # once (whole, into the cache), epoch 2 makes no request; frames equal the local decode
    from tests.sources.httpserver import FaultyServer

    folder = Path(paths[0]).parent
    names = sorted(Path(p).name for p in paths)
    sampler = every_frame_windows(4, stride=5)
    with FaultyServer(folder) as srv:
        urls = [srv.url(n) for n in names]
        pipe = clips(
            urls,
            sampler=sampler,
            width=16,
            height=16,
            shuffle_videos=False,
            cache_dir=tmp_path / "cache",
            cache_limit="64MiB",
        ).batch(2)
        loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="16MiB", timeout_s=30)
        want = {
            (srv.url(Path(p).name), int(c.clip_index)): c.data
            for p in paths
            for c in decode_clips(p, sampler=sampler, width=16, height=16)
        }
        for epoch in range(2):
            loader.set_epoch(epoch)
            before = len(srv.records())
            got = {}
            for b in loader:
                for s, ci, data in zip(b.source, b.clip_index.tolist(), b.data):
                    assert (s, ci) not in got
                    got[(s, ci)] = data
            assert got.keys() == want.keys()
            assert all(torch.equal(got[k], want[k]) for k in want)
            made = {r.path for r in srv.records()[before:]}
            if epoch == 0:  # one download per video, nothing read twice
                assert sorted(r.path for r in srv.records()) == sorted(f"/{n}" for n in names)
            else:
                assert made == set(), f"epoch 2 requested {made}"
        loader.close()
    entries = list((tmp_path / "cache").rglob("*.mp4")) + list((tmp_path / "cache").rglob("*.webm"))
    assert entries, "nothing was cached"


def test_cache_options_are_checked_for_videos(paths, tmp_path) -> None:
    with pytest.raises(ValueError, match="needs cache_limit"):
        clips(paths, sampler=SAMPLER, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="needs cache_dir"):
        clips(paths, sampler=SAMPLER, cache_limit="1GiB")
    with pytest.raises(ValueError, match="not a URL"):
        clips(paths, sampler=SAMPLER, cache_dir="s3://bucket/x", cache_limit="1GiB")


def test_threads_auto_decodes_four_videos_at_once_in_their_order(paths) -> None:
    """``threads="auto"``: 4 lanes (the order of ``threads=4``), driven by a thread count
    that changes every couple of clips here (a tuner double); ``stats().threads`` shows
    the changes under the stage's name."""
    from tests.sources.helpers import changing_threads

    many = paths * 3
    ref = [key(c) for c in clips(many, sampler=SAMPLER, threads=4, seed=1)]
    with changing_threads([1, 4, 2, 3], every=2) as seen:
        pipe = clips(many, sampler=SAMPLER, threads="auto", seed=1)
        got = list(pipe)
    assert [key(c) for c in got] == ref
    assert len(set(seen)) >= 3, seen
    (t,) = pipe.stats().threads
    assert t.stage == "video" and t.max_threads == 4 and t.changes >= 2, t
    assert t.threads == 0 and t.running == 0, t  # the run ended


def test_threads_must_be_a_count_or_auto(paths) -> None:
    for bad in ("many", 0, 2.5):
        with pytest.raises((TypeError, ValueError), match="threads"):
            clips(paths, sampler=SAMPLER, threads=bad)


def test_equalize_takes_one_clip_count_per_video_and_names_it(paths) -> None:
    """A window sampler's clip count follows each video's length: ``clips_per_video``
    takes one count per video, and a wrong one is refused under that name (the
    message named ``samples_per_shard``, which ``clips()`` has not, and a list was
    refused, so such videos could not be equalized at all)."""
    windows = every_frame_windows(4, policy="drop")
    true = [len(list(decode_clips(p, sampler=windows, index=i))) for i, p in enumerate(paths)]
    assert len(set(true)) > 1  # the test videos differ in length
    pipe = clips(
        paths, sampler=windows, width=16, height=16, equalize="pad", clips_per_video=true
    ).batch(1, collate=list)
    assert sum(len(b) for b in pipe) == sum(true)
    over = [true[0] + 1, *true[1:]]
    pipe = clips(
        paths, sampler=windows, width=16, height=16, equalize="pad", clips_per_video=over
    ).batch(1, collate=list)
    with pytest.raises(
        ValueError, match=r"clips_per_video declares: .* declared.*clips_per_video=\["
    ):
        list(pipe)
    with pytest.raises(ValueError, match="clips_per_video has 1 counts for"):
        list(clips(paths, sampler=windows, equalize="pad", clips_per_video=[3]).batch(1))


def test_policy_error_names_the_fix_the_sampler_has(tmp_path) -> None:
    """Each sampler's too-short error offers what that sampler has (an index sampler
    said "leave sampling_range_end at None", already None; a window sampler's real
    alternative, policy='drop', was not named)."""
    from streambuf.errors import VideoError
    from tests.video.conftest import VideoSpec, write_video

    spec = VideoSpec("short3", "libx264", "mp4", width=32, height=32, num_frames=3)
    short = str(write_video(tmp_path / "short3.mp4", spec))
    index = clips_at_random_indices(num_clips=1, num_frames_per_clip=8, policy="error")
    with pytest.raises(VideoError, match=r"shorter than one clip's span: use policy='repeat_last'"):
        list(decode_clips(short, sampler=index))
    windows = every_frame_windows(8, policy="error")
    with pytest.raises(VideoError, match=r"use policy='drop'"):
        list(decode_clips(short, sampler=windows))
