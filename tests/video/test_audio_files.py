"""Audio files (``streambuf.audio``), made by the ffmpeg CLI (imageio-ffmpeg's binary):
wav and flac hold a ramp whose every sample is its own index, so a clip at a timestamp
is checked to the sample; mp3 and opus hold bursts at known times, checked to 5 ms. A
truncated file is an error naming it, or a counted skip. Through a Loader with 2
workers, an exact resume, tar members, bad options."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import streambuf as sb
from streambuf.errors import AudioError, TooManyFailures
from streambuf.video.samplers import sampler_rng
from tests.resume_harness import check_save_load

from .test_audio import BURST, EVERY, FIRST, TOLERANCE_S, onsets

pytestmark = pytest.mark.timeout(180)

RATE, SECONDS = 16000, 5


def ffmpeg(*args: str) -> None:
    exe = pytest.importorskip("imageio_ffmpeg").get_ffmpeg_exe()
    subprocess.run([exe, "-v", "error", "-y", *args], check=True, timeout=60)


def ramp(n: int) -> np.ndarray:
    """The ramp's samples as float32: sample i is (i mod 65536 - 32768) / 32768."""
    return ((np.arange(n) % 65536 - 32768) / 32768).astype(np.float32)


RAMP = f"aevalsrc='(mod(n\\,65536)-32768)/32768':s={RATE}:d={SECONDS}"
BURSTS = (
    f"aevalsrc='if(gte(t\\,{FIRST})*lt(mod(t-{FIRST}\\,{EVERY})\\,{BURST})\\,"
    f"0.8*sin(2*PI*1000*t)\\,0)':s=48000:d={SECONDS}"
)


@pytest.fixture(scope="session")
def audio_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("audio")
    for i in range(3):
        ffmpeg("-f", "lavfi", "-i", RAMP, "-c:a", "pcm_s16le", str(root / f"ramp{i}.wav"))
    ffmpeg("-f", "lavfi", "-i", RAMP, "-c:a", "flac", str(root / "ramp.flac"))
    ffmpeg("-f", "lavfi", "-i", BURSTS, "-c:a", "libmp3lame", "-b:a", "128k", str(root / "b.mp3"))
    ffmpeg("-f", "lavfi", "-i", BURSTS, "-c:a", "libopus", "-b:a", "64k", str(root / "b.opus"))
    whole = (root / "ramp.flac").read_bytes()
    (root / "truncated.flac").write_bytes(whole[: len(whole) // 2])  # header: 5 s; data: ~2.5
    return root


@pytest.mark.parametrize("name", ["ramp0.wav", "ramp.flac"])
def test_clips_by_timestamps_are_exact_to_the_sample(audio_dir: Path, name: str) -> None:
    sampler = sb.audio.clips_at_random_timestamps(num_clips=8, seconds=0.37)
    want = ramp(RATE * SECONDS)
    for seed in range(3):
        starts = sampler.sample(float(SECONDS), sampler_rng(seed, 0, 0))
        got = list(sb.audio.decode_audio_clips(audio_dir / name, sampler=sampler, seed=seed))
        assert len(got) == 8
        for a in got:
            i0 = round(starts[int(a.clip_index)] * RATE)
            assert a.sample_rate == RATE and a.data.shape == (1, round(0.37 * RATE))
            assert a.pts_seconds == pytest.approx(i0 / RATE, abs=1e-9)
            assert torch.equal(a.data[0], torch.from_numpy(want[i0 : i0 + a.data.shape[1]]))
            assert a.source == str(audio_dir / name)


@pytest.mark.parametrize("name", ["b.mp3", "b.opus"])
def test_lossy_files_place_their_bursts_in_time(audio_dir: Path, name: str) -> None:
    sampler = sb.audio.clips_at_random_timestamps(num_clips=6, seconds=0.6)
    got = list(sb.audio.decode_audio_clips(audio_dir / name, sampler=sampler, sample_rate=16000))
    assert len(got) == 6
    every = FIRST + np.arange(0, 100) * EVERY
    for a in got:
        start = float(a.pts_seconds)
        heard = onsets(a)
        played = [t for t in every if start + 0.003 < t < start + 0.6 - 0.003]
        for t in played:
            assert any(abs(t - h) <= TOLERANCE_S for h in heard), (name, start, played, heard)
        for h in heard:
            assert np.abs(every - h).min() <= TOLERANCE_S, (name, start, played, heard)


def test_regular_clips_and_windows(audio_dir: Path) -> None:
    regular = sb.audio.clips_at_regular_timestamps(seconds_between_clip_starts=1.5, seconds=1.0)
    got = list(sb.audio.decode_audio_clips(audio_dir / "ramp1.wav", sampler=regular))
    assert [a.pts_seconds for a in got] == [0.0, 1.5, 3.0]  # 4.5 + 1.0 > 5 s
    windows = list(
        sb.audio.decode_audio_clips(
            audio_dir / "ramp1.wav", sampler=sb.audio.every_window(seconds=2.0)
        )
    )
    assert [w.pts_seconds for w in windows] == [0.0, 2.0]
    whole = torch.cat([w.data for w in windows], dim=1)[0]
    assert torch.equal(whole, torch.from_numpy(ramp(4 * RATE)))


def decodable_seconds(path: Path) -> float:
    """How far plain PyAV decodes ``path`` before its data ends or fails."""
    import av

    end = 0.0
    with av.open(str(path)) as container:
        try:
            for frame in container.decode(audio=0):
                end = float(frame.pts * frame.time_base) + frame.samples / frame.sample_rate
        except av.FFmpegError:
            pass
    return end


def test_a_truncated_file_is_named_or_skipped_and_counted(audio_dir: Path) -> None:
    sampler = sb.audio.clips_at_regular_timestamps(seconds_between_clip_starts=1.0, seconds=1.0)
    bad = audio_dir / "truncated.flac"
    with pytest.raises(AudioError, match=r"truncated.*truncated\.flac") as err:
        list(sb.audio.decode_audio_clips(bad, sampler=sampler))
    assert err.value.stage == "audio.decode"
    stats = sb.audio.AudioDecodeStats()
    got = list(sb.audio.decode_audio_clips(bad, sampler=sampler, on_error="skip", stats=stats))
    # the clips that end before the damage are delivered, and only those
    whole = [float(k) for k in range(5) if k + 1.0 <= decodable_seconds(bad)]
    assert whole and [a.pts_seconds for a in got] == whole
    assert stats.failures == 1
    with pytest.raises(TooManyFailures):
        list(sb.audio.decode_audio_clips(bad, sampler=sampler, on_error="skip", max_failures=0))


def test_a_file_shorter_than_a_clip_and_one_that_is_not_audio(audio_dir: Path, tmp_path: Path):
    sampler = sb.audio.clips_at_random_timestamps(num_clips=1, seconds=6.0)
    with pytest.raises(AudioError, match="does not fit") as err:
        list(sb.audio.decode_audio_clips(audio_dir / "ramp0.wav", sampler=sampler))
    assert err.value.stage == "audio.sample"
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all" * 10)
    with pytest.raises(AudioError, match=r"junk\.wav") as err:
        list(sb.audio.decode_audio_clips(junk, sampler=sampler))
    assert err.value.stage == "audio.open"


ROOT = Path()


@pytest.fixture
def audio_root(audio_dir: Path) -> Any:
    global ROOT
    ROOT = audio_dir
    yield audio_dir
    ROOT = Path()


def loader(*, workers: int = 2) -> sb.Loader:
    pipe = sb.audio.clips(
        sorted(str(p) for p in ROOT.glob("ramp*.*")),
        sampler=sb.audio.clips_at_random_timestamps(num_clips=3, seconds=0.5),
        sample_rate=8000,
        seed=2,
    ).batch(3)
    return sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="16MiB", timeout_s=60)


def batch_ids(batch: Any) -> list[Any]:
    return [
        (Path(s).name, int(ci), round(float(batch.data[b].sum()), 4))
        for b, (s, ci) in enumerate(zip(batch.source, batch.clip_index))
    ]


def test_through_a_loader_with_two_workers(audio_root: Path) -> None:
    ld = loader()
    batches = list(ld)
    assert len(batches) == 4  # 4 files x 3 clips
    seen = sorted((Path(s).name, int(ci)) for b in batches for s, ci in zip(b.source, b.clip_index))
    names = sorted(p.name for p in audio_root.glob("ramp*.*"))
    assert seen == sorted((n, c) for n in names for c in range(3))
    for b in batches:
        assert b.data.shape == (3, 1, 4000) and b.sample_rate == 8000
        assert b.lengths.tolist() == [4000] * 3
    assert ld.pipeline.stats().audio.clips >= 12


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume(audio_root: Path, workers: int) -> None:
    check_save_load(loader, {"workers": workers}, [1, 3], ids=batch_ids)


def test_flac_members_of_a_tar_shard(audio_dir: Path, tmp_path: Path) -> None:
    shard = tmp_path / "speech-000.tar"
    with tarfile.open(shard, "w") as tar:
        tar.add(audio_dir / "ramp.flac", arcname="utt0.flac")
        tar.add(audio_dir / "ramp.flac", arcname="utt1.flac")
    sampler = sb.audio.clips_at_random_timestamps(num_clips=2, seconds=0.25)
    pipe = sb.shards([str(shard)]).map(sb.audio.decode_member("flac", sampler=sampler))
    got = [clip for clips in pipe for clip in clips]
    assert len(got) == 4
    want = ramp(RATE * SECONDS)
    for a in got:
        i0 = round(float(a.pts_seconds) * RATE)
        assert torch.equal(a.data[0], torch.from_numpy(want[i0 : i0 + 4000]))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"sampler": sb.video.clips_at_random_indices(num_clips=1, num_frames_per_clip=4)},
            TypeError,
            "not an audio sampler",
        ),
        ({"sample_rate": 0}, ValueError, "sample_rate"),
        ({"channels": "two"}, TypeError, "channels"),
    ],
)
def test_bad_options_are_refused_before_decoding(
    audio_dir: Path, kwargs: dict[str, Any], error: type, match: str
) -> None:
    args = {"sampler": sb.audio.clips_at_random_timestamps(seconds=1.0), **kwargs}
    with pytest.raises(error, match=match):
        sb.audio.clips([str(audio_dir / "ramp0.wav")], **args)
    with pytest.raises((ValueError, TypeError), match="seconds"):
        sb.audio.clips_at_random_timestamps(seconds=0)


def test_threads_auto_in_a_loader_keeps_the_order_of_four_lanes(audio_root: Path) -> None:
    def run(threads: Any) -> list[Any]:
        pipe = sb.audio.clips(
            sorted(str(p) for p in ROOT.glob("ramp*.*")) * 2,
            sampler=sb.audio.clips_at_random_timestamps(num_clips=3, seconds=0.5),
            sample_rate=8000,
            seed=2,
            threads=threads,
        ).batch(3)
        with sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="16MiB", timeout_s=60) as ld:
            out = [i for b in ld for i in batch_ids(b)]
        if threads == "auto":
            (t,) = pipe.stats().threads
            assert t.stage == "audio" and t.max_threads == 4 and t.running == 0, t
        return out

    from tests.sources.helpers import changing_threads

    ref = run(4)
    with changing_threads([1, 3, 2], every=2):  # threads over the 4 lanes, changing
        assert run("auto") == ref
