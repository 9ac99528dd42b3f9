"""Audio files bounded by what they can back: a Matroska file whose header claims 1e9 s
(3 s of audio) is refused by every sampler, naming the file, before any clip is placed
(it was a list of 1e9 start times: a ``MemoryError`` after 2.5 GB, which
``on_error="skip"`` did not catch), and skipped, counted and logged with
``on_error="skip"``; a sampler's clips per file are capped by ``max_clips``; a genuine
file of every format passes the seek that checks a claimed end.

Each bomb runs in a spawned worker process whose address space may grow by
``HEADROOM`` at most, so a regression fails fast (its ``MemoryError`` reported) instead
of taking the machine. (Spawned, not forked: a fork of this process, threads and all,
can inherit a lock held by a thread that is not copied, and hang.)"""

from __future__ import annotations

import io
import logging
import multiprocessing
import resource
import struct
import tarfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambuf as sb
from streambuf.audio import decode as audio_decode
from streambuf.errors import AudioError

from .test_audio_channels import ffmpeg, make_late_mka

pytestmark = pytest.mark.timeout(120)

CLAIM_S = 1e9
KINDS = ["every_window", "random", "regular"]
HEADROOM = 3 << 29  # 1.5 GiB of address space above what the worker holds
TIMEOUT_S = 60


def sampler(kind: str, *, seconds: float = 1.0, cap: int | None = None) -> Any:
    """Each sampler, clips of ``seconds`` back to back (random: 4)."""
    more = {} if cap is None else {"max_clips": cap}
    if kind == "random":
        return sb.audio.clips_at_random_timestamps(num_clips=4, seconds=seconds, **more)
    if kind == "regular":
        return sb.audio.clips_at_regular_timestamps(
            seconds_between_clip_starts=seconds, seconds=seconds, **more
        )
    return sb.audio.every_window(seconds=seconds, **more)


def claim_duration(path: Path, seconds: float) -> Path:
    """Rewrite the Matroska Segment's Duration element (ID 0x4489, an 8-byte float in
    TimecodeScale units: 1 ms as PyAV writes it) to claim ``seconds``."""
    data = path.read_bytes()
    at = data.find(b"\x44\x89\x88")
    assert at > 0 and data.count(b"\x2a\xd7\xb1\x83\x0f\x42\x40") == 1  # scale: 1 ms
    path.write_bytes(data[: at + 3] + struct.pack(">d", seconds * 1000) + data[at + 11 :])
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 s of audio (96 KB) whose header claims 1e9 s."""
    path = claim_duration(make_late_mka(tmp_path_factory.mktemp("bomb") / "bomb.mka"), CLAIM_S)
    av = pytest.importorskip("av")
    with av.open(str(path)) as c:
        assert c.duration / 1e6 > CLAIM_S * 0.99  # the header says so
    return path


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def _limited(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``fn(*args)`` with the address space limited to what it is now + ``HEADROOM``; a
    ``MemoryError`` comes back as an ``AssertionError`` with its traceback."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + HEADROOM, hard))
    try:
        return fn(*args)
    except MemoryError:
        raise AssertionError(
            f"ran out of its {HEADROOM >> 20} MiB headroom:\n{traceback.format_exc()}"
        ) from None
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


Bounded = Callable[..., Any]


@pytest.fixture(scope="module")
def bounded() -> Iterator[Bounded]:
    """``bounded(fn, *args)``: ``fn(*args)`` (module-level functions) in a spawned worker
    under ``HEADROOM``; its value, or its exception raised here."""
    pool = multiprocessing.get_context("spawn").Pool(1)

    def run(fn: Callable[..., Any], *args: Any) -> Any:
        return pool.apply_async(_limited, (fn, args)).get(TIMEOUT_S)

    try:
        yield run
    finally:
        pool.terminate()
        pool.join()


def refusal(path: Path, kind: str, cap: int | None = None, seconds: float = 1.0) -> tuple:
    """How ``decode_audio_clips`` ends on ``path``: (message, stage, source, seconds)."""
    t0 = time.monotonic()
    try:
        got = list(
            sb.audio.decode_audio_clips(path, sampler=sampler(kind, seconds=seconds, cap=cap))
        )
    except AudioError as err:
        return str(err), err.stage, err.source, time.monotonic() - t0
    raise AssertionError(f"{len(got)} clips, no error")


def listed(kind: str) -> int:
    """How many start times the sampler alone lists for a 1e9 s file."""
    return len(sampler(kind).sample(CLAIM_S, np.random.default_rng(0)))


@pytest.mark.parametrize("kind", KINDS)
def test_a_duration_bomb_is_refused_by_every_sampler(
    bomb: Path, bounded: Bounded, kind: str
) -> None:
    msg, stage, source, took = bounded(refusal, bomb, kind)
    assert stage == "audio.open" and source == str(bomb), msg
    # (its audio starts at 0.5 s: the file's time counts from there)
    assert "999999999.500 s" in msg and "last packet ends at 3.000 s" in msg, msg
    assert "re-mux" in msg and "on_error='skip'" in msg, msg  # the fix
    assert took < 10, took
    # the sampler on its own never lists more than its max_clips either
    if kind == "random":
        assert bounded(listed, kind) == 4
    else:
        with pytest.raises(ValueError, match=r"1000000000 clips.*max_clips=100000"):
            bounded(listed, kind)


def skipped_through(entry: str, bomb: Path, good: Path, kind: str, tmp: Path) -> tuple:
    """(clips, failures, warnings logged) of a pipeline over ``good`` and ``bomb`` with
    ``on_error="skip"``: ``clips()`` over the files, or ``decode_member`` over a tar."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    keep = Keep(logging.WARNING)
    logging.getLogger("streambuf").addHandler(keep)
    try:
        if entry == "clips":
            pipe = sb.audio.clips(
                [str(good), str(bomb)],
                sampler=sampler(kind),
                shuffle_files=False,
                on_error="skip",
            )
            got = list(pipe)
            return len(got), pipe.stats().audio.failures, records
        shard = tmp / "shard.tar"
        with tarfile.open(shard, "w") as tar:
            tar.add(good, arcname="a.mka")
            tar.add(bomb, arcname="b.mka")
        dec = sb.audio.decode_member("mka", sampler=sampler(kind), on_error="skip")
        n = sum(len(clips) for clips in sb.shards([str(shard)]).map(dec))
        return n, dec.stats.failures, records
    finally:
        logging.getLogger("streambuf").removeHandler(keep)


@pytest.mark.parametrize("entry", ["clips", "member"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_duration_bomb_is_a_counted_logged_skip(
    bomb: Path, bounded: Bounded, tmp_path: Path, kind: str, entry: str
) -> None:
    good = make_late_mka(tmp_path / "good.mka")  # the same 3 s, its header true
    n, failures, logged = bounded(skipped_through, entry, bomb, good, kind, tmp_path)
    assert n == (4 if kind == "random" else 3), n  # the good file's clips, all of them
    assert failures == 1
    assert any("skipped" in m and "audio.open" in m and "999999999.5" in m for m in logged), logged


def test_clips_per_file_are_capped_by_max_clips(tmp_path: Path, bounded: Bounded) -> None:
    path = make_late_mka(tmp_path / "three.mka")  # 3 s
    for kind in ("every_window", "regular"):
        msg, stage, source, _ = bounded(refusal, path, kind, 100, 0.01)
        assert stage == "audio.sample" and source == str(path), msg
        assert "300 clips in it, more than max_clips=100: pass max_clips=300" in msg, msg
        got = list(sb.audio.decode_audio_clips(path, sampler=sampler(kind, seconds=0.01, cap=300)))
        assert len(got) == 300
    with pytest.raises(ValueError, match=r"num_clips=5 would place 5 clips.*max_clips=4"):
        sb.audio.clips_at_random_timestamps(num_clips=5, seconds=0.1, max_clips=4)
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_clips"):
            sb.audio.every_window(seconds=1.0, max_clips=bad)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("genuine")
    tone = "aevalsrc='0.5*sin(2*PI*440*t)':s=16000:d=3"
    out = [make_late_mka(root / "late.mka")]
    for name, codec in [
        ("a.wav", "pcm_s16le"),
        ("a.flac", "flac"),
        ("a.mp3", "libmp3lame"),
        ("a.opus", "libopus"),
        ("a.m4a", "aac"),
        ("a.ogg", "libvorbis"),
    ]:
        ffmpeg("-f", "lavfi", "-i", tone, "-c:a", codec, str(root / name))
        out.append(root / name)
    return out


def test_every_genuine_file_passes_the_seek_that_checks_its_end(
    genuine: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no file's size enough to back its header, every header is checked by seeking
    near its end: genuine files (from memory too) give the very clips they gave."""
    windows = sb.audio.every_window(seconds=0.5)

    def fingerprint(path: Path, *, in_memory: bool = False) -> list[tuple[float, float]]:
        src: Any = io.BytesIO(path.read_bytes()) if in_memory else path
        return [
            (float(a.pts_seconds), float(a.data.abs().sum()))
            for a in sb.audio.decode_audio_clips(src, sampler=windows, name=path.name)
        ]

    before = {p.name: fingerprint(p) for p in genuine}
    monkeypatch.setattr(audio_decode, "_size_bound", lambda container, stream: (1, 0.0))
    reach, seeks = audio_decode._reach, []

    def counted(*args: Any) -> Any:
        seeks.append(args)
        return reach(*args)

    monkeypatch.setattr(audio_decode, "_reach", counted)
    for path in genuine:
        assert len(before[path.name]) >= 5, path.name
        assert fingerprint(path) == before[path.name], path.name
        assert fingerprint(path, in_memory=True) == before[path.name], path.name
    assert len(seeks) == 2 * len(genuine)  # every one checked
