"""Forward-only decoding: seeks only where they skip frames, containers always closed."""

from __future__ import annotations

import numpy as np
import pytest

import streambuf.video.decode as clips_mod
from streambuf.video import (
    DecodeStats,
    clips_at_random_indices,
    clips_at_regular_indices,
    decode_clips,
    every_frame_windows,
    probe,
    sampler_rng,
)

pytestmark = pytest.mark.timeout(30)


def expected_plan(info, wanted: list[int]) -> tuple[list[int], int]:
    """Seek targets and frames decoded under the rule: seek to the wanted frame's keyframe
    only when that keyframe lies beyond the next frame the decoder would produce."""
    seeks, decoded, last = [], 0, None
    for target in wanted:
        key = info.keyframe_before(target)
        if last is None or key > last + 1:
            seeks.append(key)
            decoded += target - key + 1
        else:
            decoded += target - last
        last = target
    return seeks, decoded


@pytest.fixture
def seek_log(monkeypatch) -> list[int]:
    log: list[int] = []
    real = clips_mod._Decoder.seek

    def spy(self, key):
        log.append(key)
        return real(self, key)

    monkeypatch.setattr(clips_mod._Decoder, "seek", spy)
    return log


@pytest.mark.parametrize("seed", range(4))
def test_forward_only_and_minimal_seeks(videos, video_name, seek_log, seed) -> None:
    path = videos[video_name]
    info = probe(path)
    sampler = clips_at_random_indices(
        num_clips=4, num_frames_per_clip=3, num_indices_between_frames=2
    )
    wanted = sorted({i for c in sampler.sample(info, sampler_rng(seed, 0, 0)) for i in c})
    stats = DecodeStats()
    list(decode_clips(path, sampler=sampler, seed=seed, stats=stats))
    seeks, decoded = expected_plan(info, wanted)
    assert seek_log == seeks  # increasing: the decoder never goes back
    assert seek_log == sorted(set(seek_log))
    assert all(info.is_keyframe[k] for k in seek_log)
    assert stats.seeks == len(seeks)
    # frames nothing needs may be dropped by the decoder (non-reference ones), never more
    assert len(wanted) <= stats.frames_decoded <= decoded
    assert stats.frames_decoded + stats.frames_skippable >= decoded
    assert stats.frames_converted == len(wanted)


def test_within_one_gop_no_extra_seek(videos, seek_log) -> None:
    path = videos["h264_bframes"]  # keyframe every 12 frames
    info = probe(path)
    assert info.is_keyframe.nonzero()[0].tolist()[:3] == [0, 12, 24]
    sampler = clips_at_regular_indices(
        num_clips=2, num_frames_per_clip=2, sampling_range_start=25, sampling_range_end=33
    )
    stats = DecodeStats()
    list(decode_clips(path, sampler=sampler, stats=stats))
    assert seek_log == [24]  # frames 25..33 share one GOP: seek once, decode forward
    assert stats.frames_decoded + stats.frames_skippable >= 34 - 24
    assert stats.frames_decoded <= 34 - 24


def test_whole_video_is_one_pass(videos, video_name, seek_log) -> None:
    stats = DecodeStats()
    list(decode_clips(videos[video_name], sampler=every_frame_windows(5), stats=stats))
    n = probe(videos[video_name]).num_frames
    assert seek_log == [0] and stats.frames_decoded == n


class _Tracked:
    """Proxy of a PyAV container that records whether it was closed."""

    opened: list[_Tracked] = []

    def __init__(self, real) -> None:
        self._real, self.closed = real, False
        _Tracked.opened.append(self)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        self._real.__enter__()
        return self

    def __exit__(self, *exc):
        self.closed = True
        return self._real.__exit__(*exc)


@pytest.mark.parametrize("how", ["exhaust", "close_early", "error"])
def test_container_always_closed(videos, monkeypatch, tmp_path, how) -> None:
    import av

    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: _Tracked(real_open(*a, **k)))
    _Tracked.opened.clear()
    path = videos["h264_bframes"]
    if how == "error":  # frame data zeroed after the first GOPs: fails in the decoder
        data = bytearray(path.read_bytes())
        n = len(data)
        data[n // 3 : n // 2] = np.random.default_rng(0).bytes(n // 2 - n // 3)
        path = tmp_path / "bad.mp4"
        path.write_bytes(bytes(data))
    stats = DecodeStats()
    gen = decode_clips(path, sampler=every_frame_windows(4), on_error="skip", stats=stats)
    if how == "close_early":
        next(gen)
        assert not _Tracked.opened[0].closed
        gen.close()
    else:
        list(gen)
    assert len(_Tracked.opened) == 1 and _Tracked.opened[0].closed
    assert stats.failures == (how == "error") and (stats.clips > 0)


def test_frames_nothing_needs_are_skipped_on_b_frame_video(videos) -> None:
    """Decoding forward to a clip start, non-reference frames are dropped by the decoder
    (the clip's frames stay exact: tests/video/test_decode.py compares every sampler's
    frames with a full decode)."""
    path = videos["h264_bframes"]
    info = probe(path)
    sampler = clips_at_regular_indices(num_clips=3, num_frames_per_clip=2)
    wanted = sorted({i for c in sampler.sample(info, sampler_rng(0, 0, 0)) for i in c})
    stats = DecodeStats()
    list(decode_clips(path, sampler=sampler, stats=stats))
    _, plan = expected_plan(info, wanted)
    assert stats.frames_skippable > 0
    assert stats.frames_decoded < plan, (stats, plan)
