"""Audio of many channels and audio that starts after 0: a 7.1 file decodes to its 8
channels, each the samples it was made with (PyAV's planar 7.1 frames were read past
their end: a segfault), a file of more than 8 channels is downmixed to 8, and more than 8
asked for is refused; a Matroska file whose audio starts at 0.5 s places every clip in
its 3 s of audio (its container duration counts from 0: the last clips were reported
"truncated or corrupt")."""

from __future__ import annotations

import fractions
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import streambuf as sb

pytestmark = pytest.mark.timeout(120)

RATE = 16000


def ffmpeg(*args: str) -> None:
    exe = pytest.importorskip("imageio_ffmpeg").get_ffmpeg_exe()
    subprocess.run([exe, "-v", "error", "-y", *args], check=True, timeout=60)


def level(c: int) -> float:
    """Channel ``c``'s constant level (distinct for each channel)."""
    return round((c + 1) / 10, 1)


def make_channels(path: Path, channels: int, layout: str | None) -> Path:
    """``channels`` channels of 2 s, channel c a constant ``level(c)``."""
    expr = "|".join(str(level(c)) for c in range(channels))
    src = f"aevalsrc='{expr}':s={RATE}:d=2" + (f":c={layout}" if layout else "")
    codec = ["-c:a", "flac"] if path.suffix == ".flac" else ["-c:a", "pcm_s16le"]
    ffmpeg("-f", "lavfi", "-i", src, *codec, str(path))
    return path


def test_a_7_1_file_gives_its_eight_channels(tmp_path: Path) -> None:
    path = make_channels(tmp_path / "surround.flac", 8, "7.1")
    sampler = sb.audio.clips_at_regular_timestamps(seconds_between_clip_starts=0.5, seconds=0.5)
    for channels in (None, 8):
        clips = list(sb.audio.decode_audio_clips(path, sampler=sampler, channels=channels))
        assert len(clips) == 4
        for a in clips:
            assert a.data.shape == (8, RATE // 2)
            want = torch.tensor([level(c) for c in range(8)]).unsqueeze(1)
            assert torch.allclose(a.data, want.expand_as(a.data), atol=1e-3), channels
    (stereo,) = sb.audio.decode_audio_clips(
        path, sampler=sb.audio.clips_at_random_timestamps(seconds=0.5), channels=2
    )
    assert stereo.data.shape == (2, RATE // 2)
    pipe = sb.audio.clips([str(path)], sampler=sampler, sample_rate=8000).batch(2)
    loader = sb.Loader(pipe, num_workers=2, max_batches=2, max_bytes="64MiB", timeout_s=60)
    batches = list(loader)
    assert [tuple(b.data.shape) for b in batches] == [(2, 8, 4000)] * 2


def test_more_than_eight_channels_are_downmixed_or_refused(tmp_path: Path) -> None:
    path = make_channels(tmp_path / "ten.wav", 10, None)
    sampler = sb.audio.clips_at_random_timestamps(seconds=0.5)
    (a,) = sb.audio.decode_audio_clips(path, sampler=sampler)
    assert a.data.shape == (8, RATE // 2)
    for make in (
        lambda: sb.audio.clips([str(path)], sampler=sampler, channels=9),
        lambda: sb.audio.decode_audio_clips(path, sampler=sampler, channels=9),
    ):
        with pytest.raises(ValueError, match=r"channels=9.*(at most 8|<= 8)"):
            make()


def make_late_mka(path: Path) -> Path:
    """3 s of a 16 kHz ramp (sample i is i / 48000) whose first sample is at 0.5 s."""
    av = pytest.importorskip("av")
    with av.open(str(path), "w", format="matroska") as c:
        s = c.add_stream("pcm_s16le", rate=RATE, layout="mono")
        x = (np.arange(3 * RATE) * 32767 // (3 * RATE)).astype(np.int16)
        for i in range(0, len(x), 800):
            frame = av.AudioFrame.from_ndarray(
                x[None, i : i + 800].copy(), format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts = RATE, RATE // 2 + i
            frame.time_base = fractions.Fraction(1, RATE)
            for packet in s.encode(frame):
                c.mux(packet)
        for packet in s.encode(None):
            c.mux(packet)
    return path


def test_audio_that_starts_after_zero_places_every_clip(tmp_path: Path) -> None:
    path = make_late_mka(tmp_path / "late.mka")
    want = (np.arange(3 * RATE) * 32767 // (3 * RATE)).astype(np.int16) / 32768
    every = sb.audio.clips_at_regular_timestamps(seconds_between_clip_starts=0.5, seconds=0.5)
    clips = list(sb.audio.decode_audio_clips(path, sampler=every))
    assert [float(a.pts_seconds) for a in clips] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    for a in clips:
        i0 = round(float(a.pts_seconds) * RATE)
        got = a.data[0].numpy()
        assert np.allclose(got, want[i0 : i0 + len(got)], atol=1e-4)
    random = sb.audio.clips_at_random_timestamps(num_clips=16, seconds=0.5)
    for seed in range(3):
        got = list(sb.audio.decode_audio_clips(path, sampler=random, seed=seed))
        assert len(got) == 16  # none past the 3 s of audio
    stats = sb.audio.AudioDecodeStats()
    skipped = list(sb.audio.decode_audio_clips(path, sampler=every, on_error="skip", stats=stats))
    assert len(skipped) == 6 and stats.failures == 0


def test_nan_ranges_are_refused_by_every_sampler() -> None:
    nan = float("nan")
    for make in (
        lambda: sb.audio.clips_at_random_timestamps(seconds=1.0, sampling_range_start=nan),
        lambda: sb.audio.clips_at_random_timestamps(seconds=1.0, sampling_range_end=nan),
        lambda: sb.audio.clips_at_regular_timestamps(
            seconds_between_clip_starts=0.5, seconds=1.0, sampling_range_end=nan
        ),
        lambda: sb.audio.clips_at_random_timestamps(seconds=float("inf")),
        lambda: sb.video.clips_at_random_timestamps(num_frames_per_clip=2, sampling_range_end=nan),
        lambda: sb.video.clips_at_regular_timestamps(
            seconds_between_clip_starts=0.5, num_frames_per_clip=2, sampling_range_start=nan
        ),
    ):
        with pytest.raises(ValueError, match="finite"):
            make()


def test_a_batch_of_mixed_rates_names_each_entry_points_option() -> None:
    from streambuf.video.audio import AudioSamples

    a = AudioSamples(torch.zeros(1, 10), 0.0, 10 / 16000, 16000)
    b = AudioSamples(torch.zeros(2, 10), 0.0, 10 / 44100, 44100)
    with pytest.raises(ValueError, match=r"audio\.clips\(\.\.\., sample_rate=.*video\.clips"):
        AudioSamples.collate([a, b])


def test_sampler_ranges_take_numpy_numbers() -> None:
    import numpy as np

    s = sb.video.clips_at_random_timestamps(
        num_frames_per_clip=2, sampling_range_start=np.float32(0.5), sampling_range_end=np.int64(3)
    )
    assert s.sampling_range_start == 0.5 and s.sampling_range_end == 3
