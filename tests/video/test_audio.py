"""Audio with clips. The videos are made by the ffmpeg CLI (imageio-ffmpeg's binary):
their audio encodes time, a 40 ms burst of 1 kHz every 0.25 s from 0.1 s. For random
clips, the bursts in each clip's audio fall where the frames' ``pts_seconds`` say (within
5 ms: one AAC frame is 21 ms); the same through a Loader with 2 workers and after a
resume; the rate and channels asked for; a video without audio raises or gives flagged
silence; batches pad to the longest with ``lengths``; audio bytes are counted."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import streambuf as sb
from streambuf.errors import VideoError
from streambuf.sizing import nbytes
from streambuf.video.audio import AudioSamples
from tests.resume_harness import check_save_load

pytestmark = pytest.mark.timeout(180)

FIRST, EVERY, BURST = 0.1, 0.25, 0.04  # seconds: burst onsets at FIRST + k * EVERY
SECONDS, FPS = 4, 25
TOLERANCE_S = 0.005


def ffmpeg(*args: str) -> None:
    exe = pytest.importorskip("imageio_ffmpeg").get_ffmpeg_exe()
    subprocess.run([exe, "-v", "error", "-y", *args], check=True, timeout=60)


def make_av(path: Path, *, audio: bool = True, rate: int = 48000, gop: int = 25) -> Path:
    """A 4 s 25 fps H.264 video (160x120) with AAC stereo bursts (or none)."""
    video = ["-f", "lavfi", "-i", f"testsrc=size=160x120:rate={FPS}:duration={SECONDS}"]
    tone = (
        f"aevalsrc='if(gte(t\\,{FIRST})*lt(mod(t-{FIRST}\\,{EVERY})\\,{BURST})\\,"
        f"0.8*sin(2*PI*1000*t)\\,0)|if(gte(t\\,{FIRST})*lt(mod(t-{FIRST}\\,{EVERY})\\,"
        f"{BURST})\\,0.8*sin(2*PI*1000*t)\\,0)':s={rate}:d={SECONDS}"
    )
    sound = ["-f", "lavfi", "-i", tone, "-c:a", "aac", "-b:a", "128k"] if audio else []
    enc = ["-c:v", "libx264", "-g", str(gop), "-pix_fmt", "yuv420p", "-preset", "veryfast"]
    ffmpeg(*video, *sound, *enc, *([] if audio else ["-an"]), "-shortest", str(path))
    return path


@pytest.fixture(scope="session")
def av_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("av")
    for i in range(4):
        make_av(root / f"av{i}.mp4")
    make_av(root / "silent.mp4", audio=False)
    return root


def onsets(a: AudioSamples, n: int | None = None) -> list[float]:
    """Times (s) where a burst starts in ``a`` (its first ``n`` samples)."""
    x = a.data[..., :n].abs().amax(dim=0).numpy()
    rate = a.sample_rate
    w = max(1, rate // 1000)  # 1 ms envelope
    env = np.convolve(x > 0.3, np.ones(w), "same") > 0
    starts = np.flatnonzero(env[1:] & ~env[:-1]) + 1  # (a burst cut by the start: none)
    return [float(a.pts_seconds) + s / rate for s in starts]


EDGE_S = 0.003  # onsets this near a span's ends are not compared (a cut burst)


def expected_onsets(start: float, end: float) -> list[float]:
    """Burst onsets inside [start, end), away from its edges."""
    t = FIRST + np.arange(0, 100) * EVERY
    return [float(x) for x in t if start + EDGE_S < x < end - EDGE_S]


def check_clip(clip: Any, audio: AudioSamples, n: int | None = None) -> None:
    pts, dur = clip.pts_seconds, clip.duration_seconds
    start, end = float(pts[0]), float(pts[-1] + dur[-1])
    assert abs(float(audio.pts_seconds) - start) <= 1 / audio.sample_rate
    length = audio.data.shape[-1] if n is None else n
    assert abs(length - (end - start) * audio.sample_rate) <= 1
    want, got = expected_onsets(start, end), onsets(audio, n)
    where = (clip.source, int(clip.clip_index), want, got)
    for w in want:  # every burst of the span is heard where it was played ...
        assert any(abs(w - g) <= TOLERANCE_S for g in got), where
    every = FIRST + np.arange(0, 100) * EVERY
    for g in got:  # ... and nothing is heard where none was
        assert np.abs(every - g).min() <= TOLERANCE_S, where
    assert len(got) >= len(want) >= 1, where


@pytest.mark.parametrize(
    ("asked", "rate", "channels"),
    [(True, 48000, 2), ({"sample_rate": 16000, "channels": 1}, 16000, 1)],
)
def test_bursts_fall_where_the_frames_say(av_dir: Path, asked: Any, rate: int, channels: int):
    sampler = sb.video.clips_at_random_indices(num_clips=6, num_frames_per_clip=12)
    n = 0
    for seed in range(3):
        for clip in sb.video.decode_clips(
            av_dir / "av0.mp4", sampler=sampler, seed=seed, audio=asked
        ):
            a = clip.audio
            assert a.sample_rate == rate and a.data.shape[0] == channels
            assert a.data.dtype == torch.float32 and a.missing is False
            check_clip(clip, a)
            n += 1
    assert n == 18


def test_a_clip_at_the_start_and_clips_far_apart(av_dir: Path) -> None:
    """Clips seconds apart (two decoding runs, a seek between) and one at frame 0."""
    sampler = sb.video.clips_at_regular_indices(num_clips=3, num_frames_per_clip=10)
    got = list(sb.video.decode_clips(av_dir / "av1.mp4", sampler=sampler, audio=True))
    assert float(got[0].pts_seconds[0]) == 0.0
    assert float(got[-1].pts_seconds[0]) > 2.0
    for clip in got:
        check_clip(clip, clip.audio)


def loader(*, workers: int = 2) -> sb.Loader:
    pipe = sb.video.clips(
        sorted(str(p) for p in ROOT.glob("av*.mp4")),
        sampler=sb.video.clips_at_random_indices(num_clips=3, num_frames_per_clip=8),
        audio={"sample_rate": 16000, "channels": 1},
        seed=1,
    ).batch(2)
    return sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="64MiB", timeout_s=60)


ROOT = Path()


@pytest.fixture
def av_root(av_dir: Path) -> Any:
    global ROOT
    ROOT = av_dir
    yield av_dir
    ROOT = Path()


def batch_ids(batch: Any) -> list[Any]:
    """Each clip of a batch with the fingerprint of its audio (exact resume: equal)."""
    a = batch.audio
    return [
        (Path(s).name, int(ci), int(n), round(float(a.data[b, :, :n].abs().sum()), 3))
        for b, (s, ci, n) in enumerate(zip(batch.source, batch.clip_index, a.lengths))
    ]


def test_through_a_loader_with_two_workers(av_root: Path) -> None:
    batches = list(loader())
    assert len(batches) == 6
    for batch in batches:
        a = batch.audio
        assert a.data.shape[:2] == (2, 1) and a.lengths.shape == (2,)
        assert a.data.shape[2] == int(a.lengths.max())
        for b in range(2):
            clip = sb.video.Clip(
                batch.data[b],
                batch.pts_seconds[b],
                batch.duration_seconds[b],
                batch.source[b],
                int(batch.clip_index[b]),
            )
            one = AudioSamples(
                a.data[b], float(a.pts_seconds[b]), float(a.duration_seconds[b]), a.sample_rate
            )
            check_clip(clip, one, int(a.lengths[b]))
            assert not a.data[b, :, int(a.lengths[b]) :].any()  # padding is zeros


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_gives_the_same_audio(av_root: Path, workers: int) -> None:
    check_save_load(loader, {"workers": workers}, [2, 4], ids=batch_ids)


def test_a_video_without_audio_raises_or_gives_flagged_silence(av_dir: Path) -> None:
    sampler = sb.video.clips_at_random_indices(num_clips=2, num_frames_per_clip=5)
    silent = av_dir / "silent.mp4"
    with pytest.raises(VideoError, match=r"no audio stream.*silent\.mp4") as err:
        list(sb.video.decode_clips(silent, sampler=sampler, audio=True))
    assert err.value.stage == "video.audio"
    got = list(
        sb.video.decode_clips(
            silent, sampler=sampler, audio={"sample_rate": 8000}, audio_missing="silence"
        )
    )
    for clip in got:
        a = clip.audio
        assert a.missing is True and a.sample_rate == 8000 and not a.data.any()
        span = float(clip.pts_seconds[-1] + clip.duration_seconds[-1] - clip.pts_seconds[0])
        assert a.data.shape == (1, round(span * 8000))
    with pytest.raises(ValueError, match="sample rate of the silence"):
        sb.video.decode_clips(silent, sampler=sampler, audio=True, audio_missing="silence")


@pytest.mark.parametrize(
    ("audio", "error", "match"),
    [
        ("yes", TypeError, "must be True, False, None or a dict"),
        ({"rate": 16000}, ValueError, "unknown keys"),
        ({"sample_rate": 0}, ValueError, "int >= 1"),
        ({"channels": 9}, ValueError, "1 to 8 channels"),
    ],
)
def test_bad_audio_options_are_refused_before_decoding(
    av_dir: Path, audio: Any, error: type, match: str
) -> None:
    sampler = sb.video.clips_at_random_indices(num_clips=1, num_frames_per_clip=4)
    with pytest.raises(error, match=match):
        sb.video.clips([str(av_dir / "av0.mp4")], sampler=sampler, audio=audio)


def test_a_batch_pads_to_the_longest_and_counts_every_sample() -> None:
    a = AudioSamples(torch.ones(1, 5), 1.0, 5 / 8000, 8000)
    b = AudioSamples(torch.ones(1, 7), 2.0, 7 / 8000, 8000)
    batch = AudioSamples.collate([a, b])
    assert batch.data.shape == (2, 1, 7) and batch.lengths.tolist() == [5, 7]
    assert batch.data[0, 0].tolist() == [1] * 5 + [0, 0]
    assert batch.pts_seconds.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="sample_rate"):
        AudioSamples.collate([a, AudioSamples(torch.ones(1, 5), 0.0, 1.0, 16000)])


def test_audio_bytes_count_in_the_clip(av_dir: Path) -> None:
    sampler = sb.video.clips_at_random_indices(num_clips=1, num_frames_per_clip=4)
    (with_audio,) = sb.video.decode_clips(av_dir / "av0.mp4", sampler=sampler, audio=True)
    (frames_only,) = sb.video.decode_clips(av_dir / "av0.mp4", sampler=sampler)
    assert with_audio.audio.data.nbytes > 0
    extra = nbytes(with_audio) - nbytes(frames_only)
    assert with_audio.audio.data.nbytes <= extra <= with_audio.audio.data.nbytes + 1024


def test_member_clips_carry_audio(av_dir: Path, tmp_path: Path) -> None:
    """A video member of a tar shard: each clip's audio where its frames say."""
    import tarfile

    shard = tmp_path / "av-000.tar"
    with tarfile.open(shard, "w") as tar:
        tar.add(av_dir / "av2.mp4", arcname="s0.mp4")
    sampler = sb.video.clips_at_random_indices(num_clips=2, num_frames_per_clip=12)
    pipe = sb.shards([str(shard)]).map(
        sb.video.decode_member("mp4", sampler=sampler, audio={"sample_rate": 16000})
    )
    (got,) = list(pipe)  # one sample: the list of its clips
    assert len(got) == 2
    for clip in got:
        assert clip.audio.sample_rate == 16000
        check_clip(clip, clip.audio)
