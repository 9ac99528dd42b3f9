"""Sampler semantics (torchcodec's), on synthetic frame indexes: no decoding needed."""

from __future__ import annotations

import dataclasses
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest

from streambuf.video import (
    VideoInfo,
    clips_at_random_indices,
    clips_at_random_timestamps,
    clips_at_regular_indices,
    clips_at_regular_timestamps,
    every_frame_windows,
    sampler_rng,
)

pytestmark = pytest.mark.timeout(20)


def cfr(n: int, fps: int = 10) -> VideoInfo:
    return VideoInfo.from_pts(range(n), time_base=Fraction(1, fps), last_duration=1)


VFR_MS = [0, 20, 70, 103, 193, 234, 251, 371, 404, 424]


def vfr() -> VideoInfo:
    # given in a shuffled (decode-like) order on purpose
    order = [0, 2, 1, 4, 3, 6, 5, 8, 7, 9]
    return VideoInfo.from_pts(
        [VFR_MS[i] for i in order], time_base=Fraction(1, 1000), last_duration=30
    )


def rng() -> np.random.Generator:
    return sampler_rng(0, 0, 0)


ALL = [
    clips_at_random_indices(num_clips=3, num_frames_per_clip=4, num_indices_between_frames=2),
    clips_at_regular_indices(num_clips=5, num_frames_per_clip=3),
    clips_at_random_timestamps(num_clips=4, num_frames_per_clip=3),
    clips_at_regular_timestamps(seconds_between_clip_starts=0.5, num_frames_per_clip=2),
    every_frame_windows(4, stride=3),
]


def test_info_from_pts_sorts_and_keeps_real_times() -> None:
    info = vfr()
    assert info.pts.tolist() == VFR_MS
    assert info.pts_seconds.tolist() == [p / 1000 for p in VFR_MS]
    assert np.allclose(info.frame_duration_seconds[:-1], np.diff(VFR_MS) / 1000)
    assert info.end_seconds == pytest.approx(0.454)
    assert info.average_fps == pytest.approx(10 / 0.454)


def test_frame_at_is_the_frame_displayed_then() -> None:
    info = vfr()
    times = np.array([0.0, 0.019, 0.02, 0.069, 0.07, 0.2, 0.45, 9.0])
    assert info.frame_at(times).tolist() == [0, 0, 1, 1, 2, 4, 9, 9]


@pytest.mark.parametrize("sampler", ALL, ids=lambda s: type(s).__name__)
def test_pickle_and_determinism(sampler) -> None:
    info = cfr(40)
    again = pickle.loads(pickle.dumps(sampler))
    assert again == sampler
    assert again.sample(info, sampler_rng(3, 1, 7)) == sampler.sample(info, sampler_rng(3, 1, 7))
    for clip in sampler.sample(info, rng()):
        assert len(clip) == sampler.num_frames_per_clip
        assert all(0 <= i < 40 for i in clip)


def test_random_depends_on_seed_epoch_index() -> None:
    s = clips_at_random_indices(num_clips=8)
    info = cfr(1000)
    results = {
        str(s.sample(info, sampler_rng(*k))) for k in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    }
    assert len(results) == 4


def test_regular_indices_like_torch_linspace() -> None:
    s = clips_at_regular_indices(num_clips=3, num_frames_per_clip=1)
    assert s.sample(cfr(100), rng()) == [[0], [49], [99]]
    # more clips than starting points: repeated starts
    s = clips_at_regular_indices(num_clips=4, num_frames_per_clip=3)
    assert s.sample(cfr(4), rng()) == [[0, 1, 2], [0, 1, 2], [0, 1, 2], [1, 2, 3]]


def test_default_range_keeps_whole_clips() -> None:
    s = clips_at_random_indices(num_clips=200, num_frames_per_clip=3, num_indices_between_frames=4)
    clips = s.sample(cfr(20), rng())
    assert max(c[0] for c in clips) == 20 - 9  # span 9, every start that fits is drawn
    assert all(c == list(range(c[0], c[0] + 9, 4)) for c in clips)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("repeat_last", [8, 9, 9, 9]), ("wrap", [8, 9, 8, 9])],
)
def test_index_policy(policy, expected) -> None:
    s = clips_at_regular_indices(
        num_frames_per_clip=4, sampling_range_start=8, sampling_range_end=9, policy=policy
    )
    assert s.sample(cfr(10), rng()) == [expected]


def test_index_policy_error_and_ranges() -> None:
    s = clips_at_regular_indices(
        num_frames_per_clip=4, sampling_range_start=-2, sampling_range_end=-1, policy="error"
    )
    with pytest.raises(ValueError, match="policy='error'"):
        s.sample(cfr(10), rng())
    with pytest.raises(ValueError, match="too few"):
        clips_at_random_indices(num_frames_per_clip=11, sampling_range_start=5).sample(
            cfr(10), rng()
        )
    # as torchcodec: a clip longer than the video still starts at 0, completed by policy
    assert clips_at_random_indices(num_frames_per_clip=11).sample(cfr(10), rng()) == [
        [*range(10), 9]
    ]
    with pytest.raises(ValueError, match="sampling_range_start"):
        clips_at_random_indices(sampling_range_start=10).sample(cfr(10), rng())


def test_timestamps_map_to_displayed_frames_on_vfr() -> None:
    info = vfr()
    s = clips_at_regular_timestamps(
        seconds_between_clip_starts=0.1, num_frames_per_clip=2, seconds_between_frames=0.05
    )
    clips = s.sample(info, rng())
    end = info.end_seconds - 0.05
    starts = [k * 0.1 for k in range(math.ceil(end / 0.1))]
    assert len(clips) == len(starts)
    for clip, t in zip(clips, starts):
        assert clip == info.frame_at(np.array([t, t + 0.05])).tolist()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("repeat_last", [8, 9, 9, 9]), ("wrap", [8, 9, 8, 9])],
)
def test_time_policy(policy, expected) -> None:
    info = cfr(10)  # frames at 0.0 .. 0.9, end 1.0
    s = clips_at_regular_timestamps(
        seconds_between_clip_starts=1.0,
        num_frames_per_clip=4,
        sampling_range_start=0.85,
        sampling_range_end=0.9,
        policy=policy,
    )
    assert s.sample(info, rng()) == [expected]
    with pytest.raises(ValueError, match="policy='error'"):
        clips_at_random_timestamps(
            num_frames_per_clip=4, sampling_range_start=0.85, sampling_range_end=0.9, policy="error"
        ).sample(info, rng())


def test_random_timestamps_stay_in_range() -> None:
    info = cfr(50)
    s = clips_at_random_timestamps(num_clips=100, num_frames_per_clip=5, seconds_between_frames=0.2)
    for clip in s.sample(info, rng()):
        assert clip == list(range(clip[0], clip[0] + 10, 2))


def test_windows_cover_every_frame() -> None:
    assert every_frame_windows(4).sample(cfr(10), rng()) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 9, 9],
    ]
    assert every_frame_windows(4, policy="drop").sample(cfr(10), rng()) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    assert every_frame_windows(4, policy="wrap").sample(cfr(10), rng())[-1] == [8, 9, 8, 9]
    assert every_frame_windows(4, stride=3).sample(cfr(10), rng()) == [
        [0, 1, 2, 3],
        [3, 4, 5, 6],
        [6, 7, 8, 9],
    ]
    with pytest.raises(ValueError, match="policy='error'"):
        every_frame_windows(4, policy="error").sample(cfr(10), rng())


@pytest.mark.parametrize(
    "make",
    [
        lambda: clips_at_random_indices(num_clips=0),
        lambda: clips_at_regular_indices(num_frames_per_clip=0),
        lambda: clips_at_random_indices(num_indices_between_frames=0),
        lambda: clips_at_random_indices(policy="loop"),
        lambda: clips_at_random_timestamps(seconds_between_frames=0),
        lambda: clips_at_regular_timestamps(seconds_between_clip_starts=0),
        lambda: every_frame_windows(0),
        lambda: every_frame_windows(2, stride=0),
    ],
)
def test_bad_arguments_fail_at_construction(make) -> None:
    with pytest.raises(ValueError, match="must"):
        make()


@pytest.mark.parametrize(
    "sampler",
    [
        clips_at_random_timestamps(num_frames_per_clip=8),
        clips_at_regular_timestamps(seconds_between_clip_starts=0.1, num_frames_per_clip=8),
    ],
    ids=["random", "regular"],
)
def test_too_short_video_names_its_length_the_span_and_the_fix(sampler, writers, tmp_path) -> None:
    """A real 5-frame video (0.208 s at 24 fps) cannot hold a clip of 8 frames 1/24 s
    apart (0.292 s): the error says so, not 'sampling_range_end (-0.083)'."""
    from streambuf.video import probe

    write_video, _, specs = writers
    spec = dataclasses.replace(specs["mpeg4"], name="short", num_frames=5)
    path = write_video(tmp_path / "short.mp4", spec)
    with pytest.raises(ValueError) as info:
        sampler.sample(probe(path), rng())
    msg = str(info.value)
    assert str(path) in msg and "0.208 s" in msg and "5 frames" in msg
    assert "8 frames 0.0417 s apart" in msg and "span 0.292 s" in msg
    assert "num_frames_per_clip" in msg and "sampling_range_end=" in msg  # the fixes
    assert "-0.0" not in msg
