"""Decode sampled clips from one audio file with PyAV: ``decode_audio_clips``.

How a file is read:

1. open it (path or seekable binary file object), take its first audio stream and its
   duration from the header (the stream's, else the container's);
2. ask the sampler for the clips' start times, with a generator seeded by
   ``(seed, epoch, index)``; every clip lasts ``sampler.seconds``;
3. decode the clips in *runs* (clips whose spans lie within a second of each other,
   formed from every clip the sampler chose, so a clip's samples are the same whichever
   clips are decoded with it): one seek 0.1 s before the run, one ``AudioResampler`` to
   the asked rate and channels, float32 ``[channels, n]`` (``streambuf.video.audio``);
4. cut each clip exactly: its first sample is ``round((start - t0) * rate)``, ``t0`` the
   time of the first decoded sample (its pts, counted from the stream's start time: an
   mp3's timestamps begin after the encoder delay its decoder drops), and it has ``round(seconds * rate)`` samples, so
   clips of one rate always stack into a batch; ``pts_seconds`` is its first sample's
   time. Lossless files (wav, flac) at their own rate give the stored samples exactly.

A file whose decoded audio ends (at a decoding error, or more than ``_SHORT_S`` before
its header says) before a clip does is truncated or corrupt: an ``AudioError`` (stage
"audio.decode") naming it at that clip, the clips before it delivered, or a counted
skip with ``on_error="skip"``. (A wav cut short is read as the shorter file it is:
FFmpeg takes a wav's length from its size, not its header.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any

from .._failures import FailurePolicy, OnError
from ..errors import AudioError
from ..video.audio import MAX_CHANNELS, AudioSamples, cut, decode_range, runs
from ..video.probe import VideoSource, _import_av, source_name
from ..video.samplers import sampler_rng
from .samplers import AudioClipSampler

__all__ = ["AudioDecodeStats", "decode_audio_clips"]

_SHORT_S = 0.05  # decoded audio may end this much before its header says (encoder delay)


@dataclass
class AudioDecodeStats:
    """Counters of ``decode_audio_clips`` (pass one object to many calls to add up).

    Attributes:
        files: files opened.
        clips: clips yielded.
        samples: samples yielded (per channel).
        seeks: runs decoded (one seek each).
        failures: files that failed (raised or skipped).
    """

    files: int = 0
    clips: int = 0
    samples: int = 0
    seeks: int = 0
    failures: int = 0

    def snapshot(self) -> AudioDecodeStats:
        return replace(self)


def decode_audio_clips(
    source: VideoSource,
    /,
    *,
    sampler: AudioClipSampler,
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
    sample_rate: int | None = None,
    channels: int | None = None,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    policy: FailurePolicy | None = None,
    stats: AudioDecodeStats | None = None,
    name: str | None = None,
    keep: Callable[[int], bool] | None = None,
) -> Generator[AudioSamples, None, None]:
    """Yield the clips ``sampler`` picks from the audio file ``source``.

    Args:
        source: a path, or a seekable binary file object.
        sampler: e.g. ``streambuf.audio.clips_at_random_timestamps(num_clips=4,
            seconds=2.0)``.
        seed, epoch, index: seed the sampler's generator.
        sample_rate, channels: resample / downmix to these (None: the file's own).
        on_error, max_failures, policy: "raise" (default) or "skip" a failing file with a
            counted, logged warning (``policy``: one shared across calls).
        stats: counters to update (``AudioDecodeStats``).
        name: the file's name in messages and ``AudioSamples.source``.
        keep: decode only the clips whose sampler position ``ci`` has ``keep(ci)``.

    Yields:
        ``AudioSamples`` with ``source`` and ``clip_index`` set, in order of start time.

    Raises:
        AudioError: stage "audio.open" (unreadable, no audio stream, no duration),
            "audio.sample" (the file is shorter than a clip) or "audio.decode" (corrupt
            or truncated), naming the file.
        ValueError: bad arguments (here, before anything is opened).
    """
    if not callable(getattr(sampler, "sample", None)) or not hasattr(sampler, "seconds"):
        raise TypeError(
            f"sampler={sampler!r} is not an audio sampler; use e.g. "
            "streambuf.audio.clips_at_random_timestamps(num_clips=2, seconds=2.0)"
        )
    for arg, value in (("sample_rate", sample_rate), ("channels", channels)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{arg}={value!r} must be an int or None")
        if value is not None and value < 1:
            raise ValueError(f"{arg}={value} must be >= 1, or None for the file's own")
    if channels is not None and channels > MAX_CHANNELS:
        raise ValueError(
            f"channels={channels}: at most {MAX_CHANNELS} (7.1), or None for the file's own "
            f"(a file of more is downmixed to {MAX_CHANNELS})"
        )
    if policy is None:
        policy = FailurePolicy(on_error, max_failures, stage="audio")
    _import_av()
    return _decode(
        source,
        sampler,
        (seed, epoch, index),
        (sample_rate, channels),
        policy,
        stats if stats is not None else AudioDecodeStats(),
        name or source_name(source),
        keep,
    )


def _decode(
    source: VideoSource,
    sampler: AudioClipSampler,
    key: tuple[int, int, int],
    want: tuple[int | None, int | None],
    policy: FailurePolicy,
    stats: AudioDecodeStats,
    name: str,
    keep: Callable[[int], bool] | None,
) -> Generator[AudioSamples, None, None]:
    av = _import_av()
    try:
        try:
            container = av.open(
                os.fspath(source) if isinstance(source, os.PathLike) else source, mode="r"
            )
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise AudioError(
                f"cannot open: {type(exc).__name__}: {exc}", stage="audio.open", source=name
            ) from exc
        with container:
            yield from _clips(container, sampler, key, want, stats, name, keep)
    except AudioError as err:
        stats.failures += 1
        policy.handle(err, source=name, error_type=AudioError)


def _clips(
    container: Any,
    sampler: AudioClipSampler,
    key: tuple[int, int, int],
    want: tuple[int | None, int | None],
    stats: AudioDecodeStats,
    name: str,
    keep: Callable[[int], bool] | None,
) -> Generator[AudioSamples, None, None]:
    if not container.streams.audio:
        raise AudioError("has no audio stream", stage="audio.open", source=name)
    stream = container.streams.audio[0]
    # a stream's timestamps may start after 0 (mp3: the encoder delay the decoder drops
    # is in them): a file's time is counted from its first sample, as players do
    origin = float(stream.start_time * stream.time_base) if stream.start_time else 0.0
    duration = _duration(container, stream, origin)
    if duration is None:
        raise AudioError(
            "its duration is unknown (no header says it): clips cannot be placed",
            stage="audio.open",
            source=name,
        )
    stats.files += 1
    try:
        starts = sampler.sample(duration, sampler_rng(*key))
    except ValueError as exc:
        raise AudioError(f"cannot sample clips: {exc}", stage="audio.sample", source=name) from exc
    seconds = float(sampler.seconds)
    rate = want[0] or stream.rate
    channels = want[1] or min(stream.channels, MAX_CHANNELS)  # (more: down to 7.1)
    if channels < 1:
        raise AudioError(
            f"its audio stream has {stream.channels} channels", stage="audio.open", source=name
        )
    n = round(seconds * rate)
    spans = {ci: (float(t), float(t) + seconds) for ci, t in enumerate(starts)}
    wanted = {ci for ci in spans if keep is None or keep(ci)}
    for run in runs(spans):
        mine = [ci for ci in run if ci in wanted]
        if not mine:
            continue
        lo = min(spans[c][0] for c in run)
        hi = max(spans[c][1] for c in run)
        damage: list[Exception] = []  # a decoding error: the clips before it are kept
        t0, samples = decode_range(
            container,
            stream,
            lo + origin,
            hi + origin,
            rate,
            channels,
            name,
            error=AudioError,
            stage="audio.decode",
            damage=damage,
        )
        t0 -= origin  # the file's time: 0 at its first sample
        stats.seeks += 1
        end = t0 + samples.shape[1] / rate
        for ci in mine:
            if spans[ci][1] > end + (0.0 if damage else _SHORT_S):
                why = (
                    f"decoding failed there ({type(damage[0]).__name__}: {damage[0]})"
                    if damage
                    else f"its header says {duration:.3f} s"
                )
                raise AudioError(
                    f"its audio ends at {end:.3f} s, {why}, and clip {ci} needs up to "
                    f"{spans[ci][1]:.3f} s: truncated or corrupt",
                    stage="audio.decode",
                    source=name,
                ) from (damage[0] if damage else None)
            clip = cut(samples, t0, spans[ci], rate, n)
            clip.source, clip.clip_index = name, ci
            stats.clips += 1
            stats.samples += n
            yield clip


def _duration(container: Any, stream: Any, origin: float) -> float | None:
    """The stream's seconds from its first sample (``origin``, in its timestamps): its
    own duration, else the container's, which counts from the container's start time
    (most formats) or from 0 (Matroska/WebM: the segment's duration is where it ends)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is None:
        return None
    end = container.duration / 1_000_000  # AV_TIME_BASE
    if "matroska" not in (container.format.name or ""):
        if container.start_time is not None:
            end += container.start_time / 1_000_000
        return max(0.0, end - origin)
    return max(0.0, end - max(origin, 0.0))  # (Opus in WebM starts before 0: its delay)
