"""Decode sampled clips from one audio file with PyAV: ``decode_audio_clips``.

How a file is read:

1. open it (path or seekable binary file object), take its first audio stream and its
   duration from the header (the stream's, else the container's);
2. ``plan_clips``, the one place every sampler's clips are decided: the header's
   duration is used as far as the file can back it (``usable_duration``: a header
   claiming more than the file's bytes can hold, ``_MAX_SECONDS_PER_BYTE`` or a PCM
   stream's own bit rate, is checked by a seek near its claimed end, and refused with
   an ``AudioError`` at stage "audio.open" when the stream does not reach there: a 26 KB
   file claiming 1e9 s would have been a list of 1e9 start times); the sampler's
   ``count(duration)`` is checked against its ``max_clips`` (stage "audio.sample")
   before it builds the list; then it gives the clips' start times, with a generator
   seeded by ``(seed, epoch, index)``; every clip lasts ``sampler.seconds``;
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
from .samplers import MAX_CLIPS_PER_FILE, AudioClipSampler, too_many

__all__ = ["AudioDecodeStats", "decode_audio_clips", "plan_clips", "usable_duration"]

_SHORT_S = 0.05  # decoded audio may end this much before its header says (encoder delay)
# A header claiming more seconds than this per byte of the file is checked by a seek near
# its claimed end (8 bits a second: FLAC of digital silence holds ~0.01 s a byte); a PCM
# stream's bound is its own bit rate, with this much slack (x2 and 1 s: a file cut short
# by less is read up to its damage, as any truncated file is).
_MAX_SECONDS_PER_BYTE = 1.0
_PCM_SLACK = 2.0
_REACH_SLACK_S = 1.0  # a claimed end is backed when a packet ends this near it (or 1 %)
_REACH_PACKETS = 4096  # packets read after that seek, at most


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
        AudioError: stage "audio.open" (unreadable, no audio stream, no duration, or a
            duration its stream cannot back), "audio.sample" (the file is shorter than a
            clip, or would give more than the sampler's ``max_clips``) or
            "audio.decode" (corrupt or truncated), naming the file.
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
    duration, starts = plan_clips(container, stream, origin, sampler, key, name, stats)
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


def plan_clips(
    container: Any,
    stream: Any,
    origin: float,
    sampler: AudioClipSampler,
    key: tuple[int, int, int],
    name: str,
    stats: AudioDecodeStats,
) -> tuple[float, list[float]]:
    """``(duration, starts)``: the one place a file's clips are decided, for every
    sampler (random, regular, windows, any other): the duration the file can back
    (``usable_duration``), then the clip count, checked against the sampler's
    ``max_clips`` before ``sample`` builds the list (a sampler without ``count``: its
    list, after). ``AudioError`` naming the file, at stage "audio.open" (the duration)
    or "audio.sample" (the clips)."""
    duration = usable_duration(container, stream, origin, name)
    stats.files += 1
    limit = int(getattr(sampler, "max_clips", MAX_CLIPS_PER_FILE))
    count = getattr(sampler, "count", None)
    try:
        if callable(count):
            why = too_many(int(count(duration)), limit, f"a {duration:.3f} s file")
            if why:
                raise AudioError(why, stage="audio.sample", source=name)
        starts = sampler.sample(duration, sampler_rng(*key))
    except ValueError as exc:
        raise AudioError(f"cannot sample clips: {exc}", stage="audio.sample", source=name) from exc
    why = too_many(len(starts), limit, "the sampler")
    if why:
        raise AudioError(why, stage="audio.sample", source=name)
    return duration, starts


def usable_duration(container: Any, stream: Any, origin: float, name: str) -> float:
    """The header's duration (s, from the first sample), if the file can back it: at
    most what its bytes can hold (``_size_bound``), or else reached by its packets after
    a seek near the claimed end. ``AudioError`` (stage "audio.open") naming the file
    otherwise: no duration, or one its stream does not reach (a false header; a few KB
    claiming 1e9 s)."""
    duration = _duration(container, stream, origin)
    if duration is None:
        raise AudioError(
            "its duration is unknown (no header says it): clips cannot be placed",
            stage="audio.open",
            source=name,
        )
    size, bound = _size_bound(container, stream)
    if bound is not None and duration <= bound:
        return duration
    reached = _reach(container, stream, origin, duration)
    if reached is not None and reached >= duration - max(_REACH_SLACK_S, 0.01 * duration):
        return duration
    held = (
        "(its size is unknown)"
        if size is None or bound is None
        else f"(more than its {size} bytes can hold: {bound:.3f} s at most)"
    )
    ends = "no packet near there" if reached is None else f"its last packet ends at {reached:.3f} s"
    raise AudioError(
        f"its header says it lasts {duration:.3f} s {held} and its audio stream does not "
        f"reach there ({ends}): a false or corrupt duration, refused before "
        "any clip is placed; re-mux the file so its header states its real length, or "
        "skip such files with on_error='skip'",
        stage="audio.open",
        source=name,
    )


def _size_bound(container: Any, stream: Any) -> tuple[int | None, float | None]:
    """The file's size (bytes; None: unknown) and the seconds it can hold at most:
    a PCM stream's own bit rate (x ``_PCM_SLACK``), else ``_MAX_SECONDS_PER_BYTE``."""
    try:
        size = int(container.size)
    except (AttributeError, TypeError, ValueError, OSError):
        return None, None
    if size <= 0:
        return None, None
    ctx = stream.codec_context
    bits = ctx.bit_rate if (ctx.name or "").startswith("pcm_") else 0
    if bits and bits > 0:
        return size, size * 8 / bits * _PCM_SLACK + _REACH_SLACK_S
    return size, size * _MAX_SECONDS_PER_BYTE


def _reach(container: Any, stream: Any, origin: float, duration: float) -> float | None:
    """Where the stream's packets end (s, from the first sample) after a seek to just
    before the claimed end (``_REACH_PACKETS`` read at most); None: no packet there."""
    av = _import_av()
    tb = stream.time_base
    target = min(int((origin + max(0.0, duration - _REACH_SLACK_S)) / tb), 1 << 62)
    end: float | None = None
    try:
        container.seek(target, stream=stream, backward=True, any_frame=False)
        for k, packet in enumerate(container.demux(stream)):
            if packet.pts is not None:
                at = float((packet.pts + (packet.duration or 0)) * tb) - origin
                end = at if end is None else max(end, at)
                if end >= duration:
                    break
            if k >= _REACH_PACKETS:
                break
    except (av.FFmpegError, OverflowError):
        pass  # (a seek the format refuses: what was read, if anything)
    return end


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
