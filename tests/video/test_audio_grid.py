"""Audio samplers at durations and steps that binary floats cannot hold exactly (0.7 s,
1.2 s, 2.3 s; steps 0.1 and 0.3): the clips' count, start times and samples are those
exact decimal arithmetic gives, on a wav ramp whose every sample is its index; and
``decode_member`` draws other clips at another epoch (the same at the same one), through
a pipeline and a Loader's worker."""

from __future__ import annotations

import tarfile
import wave
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import streambuf as sb

pytestmark = pytest.mark.timeout(120)

RATE = 16000
DURATIONS = ["0.7", "1.2", "2.3"]
STEPS = ["0.1", "0.3"]
SECONDS = ["0.1", "0.3", "0.7"]
STARTS = ["0", "0.3"]


def ramp(n: int) -> np.ndarray:
    return ((np.arange(n) % 65536) - 32768).astype(np.int16)


def make_wav(path: Path, seconds: str) -> Path:
    """A mono 16 kHz wav of exactly ``seconds`` (sample i holds i - 32768)."""
    n = int(Decimal(seconds) * RATE)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(ramp(n).tobytes())
    return path


def exact_starts(duration: str, step: str, seconds: str, lo: str) -> list[Decimal]:
    """Where the clips start, in decimal: ``lo + k * step`` while the clip ends in time."""
    d, s, c, a = (Decimal(x) for x in (duration, step, seconds, lo))
    if a + c > d:
        return []
    return [a + k * s for k in range(int((d - c - a) // s) + 1)]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("duration", DURATIONS)
def test_regular_clips_are_where_decimal_arithmetic_puts_them(
    tmp_path: Path, duration: str, step: str
) -> None:
    path = make_wav(tmp_path / "ramp.wav", duration)
    want_all = ramp(int(Decimal(duration) * RATE)).astype(np.float32) / 32768
    checked = 0
    for seconds in SECONDS:
        n = int(Decimal(seconds) * RATE)
        for lo in STARTS:
            want = exact_starts(duration, step, seconds, lo)
            if not want:
                continue
            regular = sb.audio.clips_at_regular_timestamps(
                seconds_between_clip_starts=float(step),
                seconds=float(seconds),
                sampling_range_start=float(lo),
            )
            samplers = [regular]
            if lo == "0":
                samplers.append(sb.audio.every_window(seconds=float(seconds), stride=float(step)))
            for sampler in samplers:
                where = (duration, step, seconds, lo, sampler)
                assert sampler.count(float(duration)) == len(want), where
                got = list(sb.audio.decode_audio_clips(path, sampler=sampler))
                assert [int(a.clip_index) for a in got] == list(range(len(want))), where
                for a, t in zip(got, want):
                    i0 = int(t * RATE)  # exact: every start is a whole sample here
                    assert a.pts_seconds == pytest.approx(i0 / RATE, abs=1e-12), where
                    assert a.data.shape == (1, n), where
                    expect = torch.from_numpy(want_all[i0 : i0 + n])
                    assert torch.equal(a.data[0], expect), where
                checked += 1
    assert checked >= 8


def shard_of(tmp_path: Path) -> Path:
    shard = tmp_path / "speech-000.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(3):
            tar.add(make_wav(tmp_path / f"u{i}.wav", "2.3"), arcname=f"utt{i}.wav")
    return shard


SAMPLER = sb.audio.clips_at_random_timestamps(num_clips=3, seconds=0.25)


def starts_of(batches: Any) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for clips in batches:
        for c in clips:
            out.setdefault(str(c.source), []).append(float(c.pts_seconds))
    return out


def test_decode_member_at_two_epochs_draws_different_clips(tmp_path: Path) -> None:
    shard = shard_of(tmp_path)
    pipe = sb.shards([str(shard)]).map(sb.audio.decode_member("wav", sampler=SAMPLER, seed=3))
    by_epoch = {}
    for epoch in (0, 1, 0):
        pipe.set_epoch(epoch)
        got = starts_of(pipe)
        assert sorted(got) == [f"{shard}#utt{i}.wav" for i in range(3)]
        assert all(len(v) == 3 for v in got.values())
        if epoch in by_epoch:
            assert got == by_epoch[epoch]  # the same epoch: the same clips
        by_epoch[epoch] = got
    for name in by_epoch[0]:  # every member's clips differ between the epochs
        assert by_epoch[0][name] != by_epoch[1][name], name
    # through a Loader's worker: its set_epoch reaches the worker's copy
    loader = sb.Loader(pipe, num_workers=1, max_batches=2, max_bytes="64MiB", timeout_s=60)
    for epoch in (1, 0):
        loader.set_epoch(epoch)
        assert starts_of(loader) == by_epoch[epoch], epoch
