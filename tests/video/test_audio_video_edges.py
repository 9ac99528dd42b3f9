"""Video clips whose audio does not cover them, and videos of many audio channels. A 4 s
video whose audio ends at 2 s (or starts at 2 s): the clips outside the audio are zeros
flagged ``missing=True`` and counted in ``DecodeStats.audio_missing`` (they were zeros
with ``missing=False``), the others are the stream's, unflagged; the silence of a video
without audio is counted the same way. A video of 10 audio channels: downmixed to 8, as
an audio file of 10 is, or to what ``channels`` asks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

import streambuf as sb
from streambuf.video.decode import DecodeStats

from .test_audio import make_av

pytestmark = pytest.mark.timeout(120)

FPS, SECONDS, AUDIO_S = 25, 4, 2
TONE = "sine=frequency=1000:sample_rate=16000"


def ffmpeg(*args: str) -> None:
    exe = pytest.importorskip("imageio_ffmpeg").get_ffmpeg_exe()
    subprocess.run([exe, "-v", "error", "-y", *args], check=True, timeout=60)


def make_partial(path: Path, *, late: bool) -> Path:
    """4 s of video; 2 s of a tone, over its first half (``late``: its second)."""
    video = ["-f", "lavfi", "-i", f"testsrc=size=64x48:rate={FPS}:duration={SECONDS}"]
    audio = [
        *(["-itsoffset", str(AUDIO_S)] if late else []),
        *("-f", "lavfi", "-i", f"{TONE}:duration={AUDIO_S}"),
    ]
    enc = ["-c:v", "libx264", "-g", "25", "-pix_fmt", "yuv420p", "-preset", "veryfast"]
    ffmpeg(*video, *audio, *enc, "-c:a", "aac", str(path))
    return path


@pytest.fixture(scope="module")
def partial(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("partial")
    return {
        "ends_early": make_partial(root / "early.mp4", late=False),
        "starts_late": make_partial(root / "late.mp4", late=True),
        "none": make_av(root / "silent.mp4", audio=False),
    }


def outside(start: float, end: float, case: str) -> float:
    """Seconds of the span [start, end) the audio does not cover."""
    if case == "ends_early":
        return max(0.0, end - max(start, AUDIO_S))
    if case == "starts_late":
        return max(0.0, min(end, AUDIO_S) - start)
    return end - start


@pytest.mark.parametrize("case", ["ends_early", "starts_late", "none"])
def test_clips_outside_the_audio_are_flagged_missing_and_counted(
    partial: dict[str, Path], case: str
) -> None:
    sampler = sb.video.clips_at_regular_indices(num_clips=10, num_frames_per_clip=10)
    stats = DecodeStats()
    got = list(
        sb.video.decode_clips(
            partial[case],
            sampler=sampler,
            audio={"sample_rate": 16000},
            audio_missing="silence",
            stats=stats,
        )
    )
    assert len(got) == 10
    flagged = 0
    for clip in got:
        a = clip.audio
        start = float(clip.pts_seconds[0])
        end = float(clip.pts_seconds[-1] + clip.duration_seconds[-1])
        gap = outside(start, end, case)
        where = (case, start, end, gap)
        # the samples more than 0.1 s (an AAC frame: 64 ms at 16 kHz) outside the audio: zeros;
        # those more than 0.1 s inside: the tone
        edge = round((AUDIO_S - start) * 16000)
        pad = 1600
        if case == "ends_early":
            inside, zeros = a.data[:, : max(0, edge - pad)], a.data[:, max(0, edge + pad) :]
        elif case == "starts_late":
            inside, zeros = a.data[:, max(0, edge + pad) :], a.data[:, : max(0, edge - pad)]
        else:
            inside, zeros = a.data[:, :0], a.data
        assert not zeros.any(), where
        assert inside.numel() == 0 or inside.abs().amax() > 0.1, where  # (1/8: the tone)
        if gap > 0.15:
            assert a.missing is True, where
            flagged += 1
        elif gap == 0.0:
            assert a.missing is False, where
    assert flagged >= 4 and stats.audio_missing == flagged == sum(c.audio.missing for c in got)
    # a pipeline counts them too, and a batch carries the flags
    pipe = sb.video.clips(
        [str(partial[case])],
        sampler=sampler,
        audio={"sample_rate": 16000},
        audio_missing="silence",
    ).batch(10)
    (batch,) = list(pipe)
    assert batch.audio.missing.tolist() == [bool(c.audio.missing) for c in got]
    assert pipe.stats().videos.audio_missing == flagged


def level(c: int) -> float:
    return round((c + 1) / 20, 2)


def test_a_video_of_more_than_eight_channels(tmp_path: Path) -> None:
    path = tmp_path / "ten.mkv"
    expr = "|".join(str(level(c)) for c in range(10))
    ffmpeg(
        *("-f", "lavfi", "-i", f"testsrc=size=64x48:rate={FPS}:duration=2"),
        *("-f", "lavfi", "-i", f"aevalsrc='{expr}':s=16000:d=2"),
        *("-c:v", "libx264", "-pix_fmt", "yuv420p", "-preset", "veryfast"),
        *("-c:a", "pcm_s16le", str(path)),
    )
    sampler = sb.video.clips_at_regular_indices(num_clips=3, num_frames_per_clip=5)
    # the audio decoder's downmix of the same stream: the levels of its 8 channels
    (ref,) = sb.audio.decode_audio_clips(
        path, sampler=sb.audio.clips_at_random_timestamps(seconds=0.5)
    )
    assert ref.data.shape == (8, 8000)
    levels = ref.data.mean(dim=1)
    assert (levels.abs() > 0.05).sum() >= 4  # not silence
    for asked, channels in (
        (True, 8),
        ({"channels": 8, "sample_rate": 8000}, 8),
        ({"channels": 2}, 2),
    ):
        stats = DecodeStats()
        clips = list(sb.video.decode_clips(path, sampler=sampler, audio=asked, stats=stats))
        assert len(clips) == 3 and stats.audio_missing == 0
        for clip in clips:
            a = clip.audio
            span = float(clip.pts_seconds[-1] + clip.duration_seconds[-1] - clip.pts_seconds[0])
            assert a.data.shape == (channels, round(span * a.sample_rate)), asked
            assert a.missing is False and torch.isfinite(a.data).all()
            if channels == 8:  # each channel a constant: the same downmix
                mid = a.data[:, 100:-100]
                assert torch.allclose(mid, levels[:, None].expand_as(mid), atol=2e-3), asked
    with pytest.raises(ValueError, match="1 to 8 channels"):
        sb.video.clips([str(path)], sampler=sampler, audio={"channels": 9})
