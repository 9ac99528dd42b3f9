"""decode_clips returns exactly the frames (and real pts) of a naive full decode."""

from __future__ import annotations

import io
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from streambuf import nbytes
from streambuf.video import (
    Clip,
    DecodeStats,
    clips_at_random_indices,
    clips_at_random_timestamps,
    clips_at_regular_indices,
    clips_at_regular_timestamps,
    decode_clips,
    every_frame_windows,
    probe,
    sampler_rng,
)

pytestmark = pytest.mark.timeout(30)

SAMPLERS = {
    "random_indices": clips_at_random_indices(
        num_clips=3, num_frames_per_clip=4, num_indices_between_frames=3
    ),
    "regular_indices": clips_at_regular_indices(num_clips=4, num_frames_per_clip=5),
    "random_timestamps": clips_at_random_timestamps(num_clips=3, num_frames_per_clip=4),
    "regular_timestamps": clips_at_regular_timestamps(
        seconds_between_clip_starts=0.4, num_frames_per_clip=3, seconds_between_frames=0.1
    ),
    "windows": every_frame_windows(8, stride=6),
    "tail_repeat": clips_at_regular_indices(
        num_frames_per_clip=4, sampling_range_start=-2, sampling_range_end=-1
    ),
}


def check_against(
    clips: list[Clip], expected: list[list[int]], frames, pts, *, source: str, layout: str = "THWC"
) -> None:
    assert sorted(c.clip_index for c in clips) == list(range(len(expected)))
    for clip in clips:
        idx = expected[clip.clip_index]
        want = np.stack([frames[i] for i in idx])
        got = clip.data.numpy()
        if layout == "TCHW":
            got = got.transpose(0, 2, 3, 1)
        elif layout == "CTHW":
            got = got.transpose(1, 2, 3, 0)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)
        assert clip.pts_seconds.dtype == torch.float64
        assert clip.pts_seconds.tolist() == [pts[i] for i in idx]
        assert clip.source == source


@pytest.mark.parametrize("sampler_name", SAMPLERS)
def test_frames_equal_naive_decode(videos, reference, video_name, sampler_name) -> None:
    path, sampler = videos[video_name], SAMPLERS[sampler_name]
    frames, pts = reference[video_name]
    info = probe(path)
    assert info.pts_seconds.tolist() == pts
    assert info.num_frames == len(frames)
    expected = sampler.sample(info, sampler_rng(5, 2, 9))
    clips = list(decode_clips(path, sampler=sampler, seed=5, epoch=2, index=9, layout="THWC"))
    check_against(clips, expected, frames, pts, source=str(path))
    for clip in clips:  # per-frame durations tile the timeline
        idx = expected[clip.clip_index]
        assert clip.duration_seconds.tolist() == info.frame_duration_seconds[idx].tolist()


@pytest.mark.parametrize("layout", ["TCHW", "CTHW"])
def test_layouts(videos, reference, layout) -> None:
    sampler = SAMPLERS["regular_indices"]
    frames, pts = reference["h264_bframes"]
    path = videos["h264_bframes"]
    clips = list(decode_clips(path, sampler=sampler, layout=layout))
    expected = sampler.sample(probe(path), sampler_rng(0, 0, 0))
    check_against(clips, expected, frames, pts, source=str(path), layout=layout)
    t, h, w = 5, 48, 64
    shape = {"TCHW": (t, 3, h, w), "CTHW": (3, t, h, w)}[layout]
    assert all(c.data.shape == shape and c.data.is_contiguous() for c in clips)


@pytest.mark.parametrize("name", ["h264_bframes", "odd_size"])
def test_resize_in_swscale(videos, naive, name) -> None:
    path = videos[name]
    frames, pts = naive(path, width=32, height=20)
    sampler = SAMPLERS["random_indices"]
    clips = list(decode_clips(path, sampler=sampler, width=32, height=20, layout="THWC"))
    check_against(
        clips, sampler.sample(probe(path), sampler_rng(0, 0, 0)), frames, pts, source=str(path)
    )
    one_side = next(iter(decode_clips(path, sampler=sampler, width=32)))
    info = probe(path)
    assert one_side.data.shape[-2:] == (round(32 * info.height / info.width), 32)


def test_file_object_source_and_threads(videos, reference) -> None:
    path = videos["vp9"]
    frames, pts = reference["vp9"]
    buf = io.BytesIO(path.read_bytes())
    buf.name = "in-memory.webm"
    sampler = SAMPLERS["random_timestamps"]
    info = probe(buf)
    assert info.source == "in-memory.webm"
    clips = list(decode_clips(buf, sampler=sampler, layout="THWC", threads=2))
    check_against(
        clips, sampler.sample(info, sampler_rng(0, 0, 0)), frames, pts, source="in-memory.webm"
    )


def test_determinism_per_seed_and_epoch(videos) -> None:
    path = videos["mpeg4"]
    sampler = clips_at_random_indices(num_clips=4, num_frames_per_clip=2)

    def run(seed: int, epoch: int) -> list[list[float]]:
        clips = sorted(
            decode_clips(path, sampler=sampler, seed=seed, epoch=epoch),
            key=lambda c: int(c.clip_index),
        )
        return [c.pts_seconds.tolist() for c in clips]

    assert run(1, 0) == run(1, 0)
    assert run(1, 0) != run(1, 1)
    assert run(1, 0) != run(2, 0)


def test_collate_and_nbytes(videos) -> None:
    sampler = clips_at_regular_indices(num_clips=3, num_frames_per_clip=4)
    clips = list(decode_clips(videos["h264_vfr"], sampler=sampler))
    batch = default_collate(clips)
    assert isinstance(batch, Clip)
    assert batch.data.shape == (3, 4, 3, 48, 64)
    assert torch.equal(batch.data[1], clips[1].data)
    assert batch.pts_seconds.shape == (3, 4) and batch.pts_seconds.dtype == torch.float64
    assert batch.source == [str(videos["h264_vfr"])] * 3
    assert batch.clip_index.tolist() == [0, 1, 2]
    # inside a dict too, as a DataLoader sample would carry it
    nested = default_collate([{"clip": c, "label": 1} for c in clips])
    assert isinstance(nested["clip"], Clip) and nested["label"].tolist() == [1, 1, 1]
    clip = clips[0]
    tensors = clip.data.nbytes + clip.pts_seconds.nbytes + clip.duration_seconds.nbytes
    assert tensors <= nbytes(clip) <= tensors + 200
    again = pickle.loads(pickle.dumps(clip))
    assert torch.equal(again.data, clip.data) and again.source == clip.source


def test_bad_arguments_fail_before_opening(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    sampler = SAMPLERS["windows"]
    for kwargs, match in [
        ({"layout": "HWC"}, "layout"),
        ({"width": 0}, "width"),
        ({"threads": -1}, "threads"),
        ({"on_error": "ignore"}, "on_error"),
    ]:
        with pytest.raises(ValueError, match=match):
            decode_clips(missing, sampler=sampler, **kwargs)
    with pytest.raises(TypeError, match="sample"):
        decode_clips(missing, sampler=object())  # type: ignore[arg-type]


def test_stats_count_overlapping_frames_once(videos) -> None:
    stats = DecodeStats()
    path = videos["h264_bframes"]
    clips = list(decode_clips(path, sampler=every_frame_windows(8, stride=2), stats=stats))
    n = probe(path).num_frames
    assert stats.clips == len(clips) and stats.videos == 1
    assert stats.frames_converted == n and stats.frames_decoded == n and stats.seeks == 1
    assert stats.snapshot() == stats and stats.snapshot() is not stats


def test_import_is_lazy_and_names_the_extra(monkeypatch, videos) -> None:
    code = "import sys, streambuf.video; assert 'av' not in sys.modules, 'av imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    monkeypatch.setitem(sys.modules, "av", None)  # what a missing PyAV looks like
    with pytest.raises(ImportError, match=re.escape("pip install streambuf[video]")):
        decode_clips(videos["vp9"], sampler=SAMPLERS["windows"])
    with pytest.raises(ImportError, match=re.escape("pip install streambuf[video]")):
        probe(videos["vp9"])
