"""Bad input: every failure is a VideoError naming the file and stage, or a counted skip."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest

from streambuf import TooManyFailures, VideoError
from streambuf._failures import FailurePolicy
from streambuf.video import DecodeStats, decode_clips, every_frame_windows, probe

pytestmark = pytest.mark.timeout(20)

ALL_FRAMES = every_frame_windows(8)


def zero_byte(tmp: Path, videos, writers) -> Path:
    path = tmp / "empty.mp4"
    path.write_bytes(b"")
    return path


def truncated_mp4(tmp: Path, videos, writers) -> Path:
    data = videos["h264_bframes"].read_bytes()
    path = tmp / "truncated.mp4"
    path.write_bytes(data[: len(data) // 2])
    return path


def truncated_webm(tmp: Path, videos, writers) -> Path:
    data = videos["vp9"].read_bytes()
    path = tmp / "truncated.webm"
    path.write_bytes(data[: len(data) // 2])
    return path


def text_as_mp4(tmp: Path, videos, writers) -> Path:
    path = tmp / "notes.mp4"
    path.write_text("this is not a video\n" * 200)
    return path


def audio_only(tmp: Path, videos, writers) -> Path:
    _, write_audio, _ = writers
    return write_audio(tmp / "audio.mp4", seconds=0.5)


def _corrupt_middle(src: Path, dst: Path) -> Path:
    data = bytearray(src.read_bytes())
    n = len(data)
    noise = np.random.default_rng(0).integers(0, 256, n // 6, dtype=np.uint8).tobytes()
    data[n // 3 : n // 3 + n // 6] = noise
    dst.write_bytes(bytes(data))
    return dst


def corrupt_mp4(tmp: Path, videos, writers) -> Path:
    return _corrupt_middle(videos["h264_bframes"], tmp / "corrupt.mp4")


def corrupt_mkv(tmp: Path, videos, writers) -> Path:
    return _corrupt_middle(videos["h264_vfr"], tmp / "corrupt.mkv")


# (maker, stage): a demuxer that loses sync in a matroska file stops silently, which the
# index catches against the declared duration ("video.open"); the mp4 index lives in the
# moov atom, so corrupt frame data is found by the decoder ("video.decode").
BAD = [
    (zero_byte, "video.open"),
    (truncated_mp4, "video.open"),
    (truncated_webm, "video.open"),
    (text_as_mp4, "video.open"),
    (audio_only, "video.open"),
    (corrupt_mp4, "video.decode"),
    (corrupt_mkv, "video.open"),
]
IDS = [m.__name__ for m, _ in BAD]


@pytest.mark.parametrize(("make", "stage"), BAD, ids=IDS)
def test_raise_names_file_and_stage(tmp_path, videos, writers, make, stage) -> None:
    path = make(tmp_path, videos, writers)
    stats = DecodeStats()
    with pytest.raises(VideoError) as info:
        list(decode_clips(path, sampler=ALL_FRAMES, stats=stats))
    err = info.value
    assert err.stage == stage and err.source == str(path)
    assert str(path) in str(err) and stage in str(err)
    assert stats.failures == 1
    again = pickle.loads(pickle.dumps(err))
    assert (again.stage, again.source) == (stage, str(path))
    if stage == "video.open":
        with pytest.raises(VideoError, match=r"video\.open"):
            probe(path)


@pytest.mark.parametrize(("make", "stage"), BAD, ids=IDS)
def test_skip_counts_and_logs(tmp_path, videos, writers, make, stage, caplog) -> None:
    path = make(tmp_path, videos, writers)
    policy = FailurePolicy("skip", stage="video")
    with caplog.at_level(logging.WARNING, logger="streambuf"):
        list(decode_clips(path, sampler=ALL_FRAMES, policy=policy))
    assert policy.skipped == 1
    assert any(str(path) in r.getMessage() for r in caplog.records)


def test_max_failures_bounds_skips(tmp_path, videos, writers) -> None:
    bad = [make(tmp_path, videos, writers) for make, _ in BAD[:3]]
    policy = FailurePolicy("skip", max_failures=2, stage="video")
    for path in bad[:2]:
        assert list(decode_clips(path, sampler=ALL_FRAMES, policy=policy)) == []
    with pytest.raises(TooManyFailures, match="max_failures=2"):
        list(decode_clips(bad[2], sampler=ALL_FRAMES, policy=policy))
    # on_error/max_failures without a shared policy: one video, one skip
    assert list(decode_clips(bad[0], sampler=ALL_FRAMES, on_error="skip")) == []
    with pytest.raises(TooManyFailures):
        list(decode_clips(bad[0], sampler=ALL_FRAMES, on_error="skip", max_failures=0))


def test_missing_file(tmp_path) -> None:
    with pytest.raises(VideoError, match=r"video\.open") as info:
        list(decode_clips(tmp_path / "missing.mp4", sampler=ALL_FRAMES))
    assert isinstance(info.value.__cause__, OSError)


def test_clips_before_the_corruption_are_delivered(tmp_path, videos, writers) -> None:
    path = corrupt_mp4(tmp_path, videos, writers)
    got = []
    with pytest.raises(VideoError, match=r"video\.decode"):
        for clip in decode_clips(path, sampler=ALL_FRAMES):
            got.append(clip)
    assert got and got[0].clip_index == 0


def test_too_short_video_is_a_sample_error(videos) -> None:
    from streambuf.video import clips_at_random_indices

    sampler = clips_at_random_indices(num_frames_per_clip=20, sampling_range_start=50)
    with pytest.raises(VideoError, match=r"video\.sample") as info:
        list(decode_clips(videos["h264_bframes"], sampler=sampler))
    assert isinstance(info.value.__cause__, ValueError)
