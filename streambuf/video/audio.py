"""Audio with clips: ``AudioSamples`` and the decoding of the audio that spans each clip.

A clip's span is its first frame's pts to its last frame's pts plus that frame's
duration; its audio is exactly the samples of that span, ``round((t - t0) * rate)`` for
both ends, ``t0`` the time of the first decoded sample (the audio frame's pts, never a
count from 0). The audio stream is decoded once for each run of clips whose spans lie
within ``_GAP_S`` of each other (one seek, ``_PREROLL_S`` before the run, one
``AudioResampler`` to the asked rate, channel count and packed float32, split into
channels (PyAV's planar 7.1 frames are read past their end);
swresample's filter delay is under a millisecond), before the video frames are, so a
clip carries its audio when it is yielded. The runs are formed from every clip the
sampler chose, wanted now or not, so a clip's samples are the same whichever of the
video's clips are decoded with it (a slot's share, a resume's remainder). Samples of a span before the stream's first sample or after its last are
zeros, and the clip is flagged ``missing`` when more than ``_UNCOVERED_S`` of its span
lies there (an audio track that ends before the video, or starts after it): its audio is
not all the stream's. A video without an audio stream is a ``VideoError`` (stage
``video.audio``) naming the file, or silence flagged ``missing`` with
``audio_missing="silence"``. ``DecodeStats.audio_missing`` counts the clips flagged.

Memory: the audio of a video's wanted clips is held from the start of the video's
decode until each clip is yielded (float32: 64 KiB a second at 16 kHz mono), and
counted in each clip's bytes (``sizing.nbytes`` walks the dataclass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import default_collate_fn_map

from ..errors import StageError, VideoError

__all__ = [
    "AudioMissing",
    "AudioSamples",
    "AudioSpec",
    "audio_spec",
    "clip_audio",
    "cut",
    "decode_range",
    "runs",
]

AudioMissing = Literal["raise", "silence"]
_GAP_S = 1.0  # spans closer than this are decoded in one pass (no seek between)
_PREROLL_S = 0.1  # decoded before a run's first span: the decoder's state settles
_LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}
MAX_CHANNELS = 8  # a stream of more is downmixed to 7.1
_UNCOVERED_S = 0.05  # a span may lie this far outside the decoded audio (an AAC frame's
# padding, a last video frame longer than the audio) and not be flagged missing


@dataclass
class AudioSamples:
    """The audio of one clip (torchcodec's ``AudioSamples`` field names), or of a batch.

    Attributes:
        data: float32 ``[channels, samples]``; a batch ``[B, channels, longest]``, each
            clip's samples first and zeros after (``lengths``).
        pts_seconds: the time of the first sample (a batch: float64 ``[B]``).
        duration_seconds: ``samples / sample_rate`` (a batch: float64 ``[B]``).
        sample_rate: samples per second (one for the whole batch).
        lengths: None for one clip; a batch: int64 ``[B]``, each clip's sample count.
        missing: the clip's audio is not (all) the stream's: the video has no audio
            stream and this is the silence ``audio_missing="silence"`` asked for, or its
            audio ends before (or starts after) the clip's span, zeros standing for the
            rest (a batch: bool ``[B]``).
        source, clip_index: for clips of audio files (``streambuf.audio``), the file's
            name and the clip's position in the sampler's list (a batch: a list of
            names, int64 ``[B]``); None for a video clip's audio (its ``Clip`` has them).
    """

    data: torch.Tensor
    pts_seconds: float | torch.Tensor
    duration_seconds: float | torch.Tensor
    sample_rate: int
    lengths: torch.Tensor | None = None
    missing: bool | torch.Tensor = False
    source: str | list[str] | None = None
    clip_index: int | torch.Tensor | None = None

    @classmethod
    def collate(cls, batch: list[AudioSamples], *, collate_fn_map: Any = None) -> AudioSamples:
        """One batch: stacked, each clip's samples padded with zeros to the longest
        (``lengths`` says how many are real); every clip must have the same rate and
        channel count."""
        rates = {a.sample_rate for a in batch}
        channels = {int(a.data.shape[0]) for a in batch}
        if len(rates) > 1 or len(channels) > 1:
            raise ValueError(
                f"cannot batch audio of sample rates {sorted(rates)} and channel counts "
                f"{sorted(channels)}: resample every clip to one rate and count: "
                "streambuf.audio.clips(..., sample_rate=16000, channels=1), or "
                "streambuf.video.clips(..., audio={'sample_rate': 16000, 'channels': 1})"
            )
        lengths = [int(a.data.shape[-1]) for a in batch]
        longest = max(lengths)
        if all(n == longest for n in lengths):
            data = default_collate([a.data for a in batch])
        else:
            data = torch.zeros((len(batch), channels.pop(), longest), dtype=torch.float32)
            for b, a in enumerate(batch):
                data[b, :, : lengths[b]] = a.data
        return cls(
            data=data,
            pts_seconds=torch.tensor([float(a.pts_seconds) for a in batch], dtype=torch.float64),
            duration_seconds=torch.tensor(
                [float(a.duration_seconds) for a in batch], dtype=torch.float64
            ),
            sample_rate=rates.pop(),
            lengths=torch.tensor(lengths, dtype=torch.int64),
            missing=torch.tensor([bool(a.missing) for a in batch]),
            source=_sources(batch),
            clip_index=_clip_indices(batch),
        )


def _sources(batch: list[AudioSamples]) -> list[str] | None:
    if all(a.source is None for a in batch):
        return None
    out: list[str] = []
    for a in batch:
        out.extend([a.source] if isinstance(a.source, str) else a.source or [])
    return out


def _clip_indices(batch: list[AudioSamples]) -> torch.Tensor | None:
    got = [a.clip_index for a in batch]
    if any(ci is None for ci in got):
        return None
    return torch.tensor([int(ci) for ci in got if ci is not None], dtype=torch.int64)


default_collate_fn_map[AudioSamples] = AudioSamples.collate


@dataclass(frozen=True)
class AudioSpec:
    """What audio a clip carries: ``sample_rate`` and ``channels`` (None: the stream's
    own), and what a video without audio gives (``missing``)."""

    sample_rate: int | None = None
    channels: int | None = None
    missing: AudioMissing = "raise"


def audio_spec(audio: Any, missing: Any = "raise") -> AudioSpec | None:
    """``audio=`` of ``clips``/``decode_clips``/``decode_member`` checked: None or False
    (no audio), True (the stream's rate and channels), or a dict with ``sample_rate``
    and/or ``channels``."""
    if missing not in ("raise", "silence"):
        raise ValueError(f"audio_missing={missing!r} must be 'raise' or 'silence'")
    if audio is None or audio is False:
        return None
    if audio is True:
        spec = AudioSpec(missing=missing)
    elif isinstance(audio, Mapping):
        unknown = set(audio) - {"sample_rate", "channels"}
        if unknown:
            raise ValueError(
                f"audio={dict(audio)!r}: unknown keys {sorted(unknown)}; give sample_rate "
                "and/or channels"
            )
        for key in ("sample_rate", "channels"):
            v = audio.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"audio={{{key!r}: {v!r}}} must be an int >= 1 or None")
        if audio.get("channels") is not None and audio["channels"] not in _LAYOUTS:
            raise ValueError(f"audio={{'channels': {audio['channels']}}}: 1 to 8 channels")
        spec = AudioSpec(audio.get("sample_rate"), audio.get("channels"), missing)
    else:
        raise TypeError(
            f"audio={audio!r} must be True, False, None or a dict like "
            "{'sample_rate': 16000, 'channels': 1}"
        )
    if missing == "silence" and spec.sample_rate is None:
        raise ValueError(
            "audio_missing='silence' needs the sample rate of the silence: "
            "audio={'sample_rate': 16000}"
        )
    return spec


def clip_audio(
    container: Any,
    spans: dict[int, tuple[float, float]],
    wanted: list[int],
    spec: AudioSpec,
    name: str,
) -> dict[int, AudioSamples]:
    """The audio of each wanted clip ``ci`` over its span ``spans[ci] = (start, end)``.

    ``spans`` holds *every* clip the sampler chose: the decoding runs (and so each
    run's seek, its first sample and the resampler's grid) are a function of them all,
    not of the clips wanted now, so a slot's share, a resume's remainder and the whole
    video give every clip the same samples."""
    streams = container.streams.audio
    if not streams:
        if spec.missing == "raise":
            raise VideoError(
                "has no audio stream; pass audio_missing='silence' for zeros flagged "
                "missing, or audio=None",
                stage="video.audio",
                source=name,
            )
        assert spec.sample_rate is not None
        rate, channels = spec.sample_rate, spec.channels or 1
        out = {}
        for ci in wanted:
            start, end = spans[ci]
            n = round((end - start) * rate)
            out[ci] = AudioSamples(torch.zeros((channels, n)), start, n / rate, rate, missing=True)
        return out
    stream = streams[0]
    rate = spec.sample_rate or stream.rate
    channels = spec.channels or min(stream.channels, MAX_CHANNELS)  # (more: down to 7.1)
    if channels < 1:
        raise VideoError(
            f"its audio stream has {stream.channels} channels", stage="video.audio", source=name
        )
    want = set(wanted)
    out = {}
    for run in runs(spans):
        if want.isdisjoint(run):
            continue
        lo = min(spans[c][0] for c in run)
        hi = max(spans[c][1] for c in run)
        t0, samples = decode_range(container, stream, lo, hi, rate, channels, name)
        end = t0 + samples.shape[1] / rate  # (the stream's end, if it ends before hi)
        for c in run:
            if c in want:
                out[c] = cut(samples, t0, spans[c], rate)
                start, stop = spans[c]
                out[c].missing = stop > end + _UNCOVERED_S or start < t0 - _UNCOVERED_S
    return out


def runs(spans: dict[int, tuple[float, float]]) -> list[list[int]]:
    """The clips in runs decoded in one pass: by start, a new run where a clip starts
    more than ``_GAP_S`` after every earlier clip ended."""
    runs: list[list[int]] = []
    end = float("-inf")
    for ci in sorted(spans, key=lambda c: (spans[c], c)):
        start, stop = spans[ci]
        if not runs or start > end + _GAP_S:
            runs.append([])
        runs[-1].append(ci)
        end = max(end, stop)
    return runs


def cut(
    samples: np.ndarray, t0: float, span: tuple[float, float], rate: int, n: int | None = None
) -> AudioSamples:
    """The samples of ``span`` out of ``samples`` (which start at ``t0``), zeros where
    the span lies outside them; ``n``: exactly that many from the span's start."""
    i0 = round((span[0] - t0) * rate)
    i1 = round((span[1] - t0) * rate) if n is None else i0 + n
    data = torch.zeros((samples.shape[0], i1 - i0), dtype=torch.float32)
    a, b = max(i0, 0), min(i1, samples.shape[1])
    if b > a:
        data[:, a - i0 : b - i0] = torch.from_numpy(samples[:, a:b])
    return AudioSamples(data, t0 + i0 / rate, (i1 - i0) / rate, rate)


def decode_range(
    container: Any,
    stream: Any,
    lo: float,
    hi: float,
    rate: int,
    channels: int,
    name: str,
    *,
    error: type[StageError] = VideoError,
    stage: str = "video.audio",
    damage: list[Exception] | None = None,
) -> tuple[float, np.ndarray]:
    """``(t0, float32 [channels, n])``: the stream's samples from at or before ``lo`` to
    at or past ``hi`` (or its end), resampled; ``t0`` the time of the first. A failure
    is an ``error`` at ``stage`` naming the file; with a ``damage`` list, a decoding
    error is appended to it instead and the samples before it are returned."""
    import av

    tb = float(stream.time_base)
    at = max(0.0, lo - _PREROLL_S)  # (the first frame after a seek lacks its overlap)
    container.seek(int(at / tb), stream=stream, backward=True, any_frame=False)
    # packed float32, split into channels here: PyAV's planar frames of 8 channels (7.1)
    # report a ninth plane, and to_ndarray() reads past the last (a segfault)
    resampler = av.AudioResampler(format="flt", layout=_layout(channels), rate=rate)
    chunks: list[np.ndarray] = []
    t0: float | None = None
    try:
        for packet in container.demux(stream):
            done = False
            for frame in packet.decode():
                if t0 is None:
                    if frame.pts is None:
                        raise error(
                            "an audio frame has no pts: cannot place the audio in time",
                            stage=stage,
                            source=name,
                        )
                    t0 = float(frame.pts * frame.time_base)
                for o in resampler.resample(frame):
                    chunks.append(_planar(o))
                if frame.pts is not None and float(frame.pts * frame.time_base) > hi:
                    done = True
            if done:
                break
    except av.FFmpegError as exc:
        if damage is None:
            raise error(
                f"cannot decode the audio: {type(exc).__name__}: {exc}",
                stage=stage,
                source=name,
            ) from exc
        damage.append(exc)  # the caller keeps what was decoded before it
    try:
        for o in resampler.resample(None):
            chunks.append(_planar(o))
    except av.FFmpegError as exc:
        raise error(f"cannot resample: {exc}", stage=stage, source=name) from exc
    if t0 is None:
        return lo, np.zeros((channels, 0), dtype=np.float32)
    samples = np.concatenate(chunks, axis=1) if chunks else np.zeros((channels, 0), np.float32)
    return t0, samples.astype(np.float32, copy=False)


def _planar(frame: Any) -> np.ndarray:
    """A packed float32 frame's samples as ``[channels, n]`` (a view)."""
    return frame.to_ndarray().reshape(-1, frame.layout.nb_channels).T


def _layout(channels: int) -> str:
    return _LAYOUTS[channels]  # (1..MAX_CHANNELS: more are refused, or the file's own capped)
