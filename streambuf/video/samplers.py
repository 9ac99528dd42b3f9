"""Clip samplers: which frames of a video make up each clip.

Names, arguments, defaults and edge cases follow ``torchcodec.samplers``
(``clips_at_random_indices``, ``clips_at_regular_indices``, ``clips_at_random_timestamps``,
``clips_at_regular_timestamps``); ``every_frame_windows`` adds a streaming mode that covers
every frame once, in fixed windows.

A sampler is a small frozen dataclass, validated at construction and picklable (it crosses
into DataLoader workers). ``sampler.sample(info, rng)`` maps a probed video (``VideoInfo``:
the real frame timestamps) and a ``numpy.random.Generator`` to a list of clips, each a list
of ``num_frames_per_clip`` frame indices into the video's frames in presentation order.

Invariants:

* Every returned index is in ``[0, info.num_frames)`` and every clip has exactly
  ``num_frames_per_clip`` indices (``every_frame_windows(policy="drop")`` aside, which drops
  the short tail window instead).
* The result depends only on the sampler, ``info`` and the generator's state: the caller
  seeds the generator with ``(seed, epoch, video index)`` (``sampler_rng``).
* Timestamp samplers never compute time from index / fps: a timestamp ``t`` maps to the
  frame displayed at ``t``, the one whose ``[pts, next pts)`` contains it.
* Clips that run past the end (an index sampler's on a video shorter than one clip's
  span, a timestamp sampler's with an explicit ``sampling_range_end``, the last of
  ``every_frame_windows``) are completed by ``policy``: ``"repeat_last"`` repeats the last valid frame, ``"wrap"``
  restarts from the clip's first frame, ``"error"`` raises ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from .probe import VideoInfo

__all__ = [
    "ClipSampler",
    "Policy",
    "clips_at_random_indices",
    "clips_at_random_timestamps",
    "clips_at_regular_indices",
    "clips_at_regular_timestamps",
    "every_frame_windows",
    "sampler_rng",
]

Policy = Literal["repeat_last", "wrap", "error"]
_POLICIES = ("repeat_last", "wrap", "error")


class ClipSampler(Protocol):
    """What ``decode_clips`` needs from a sampler."""

    def sample(self, info: VideoInfo, rng: np.random.Generator, /) -> list[list[int]]:
        """Frame indices of each clip (see the module invariants)."""
        ...


def sampler_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator a sampler gets for video ``index`` in ``epoch`` (a pure function)."""
    return np.random.default_rng([seed, epoch, index])


def _complete(values: list, desired: int, policy: str, fix: str) -> list:
    """Fill a clip that ran past the end of the video, per ``policy`` (``fix``: what
    the caller's sampler offers instead, for the error)."""
    if len(values) >= desired:
        return values
    if policy == "error" or not values:
        raise ValueError(
            f"policy='error': a clip needs {desired} frames but only {len(values)} lie "
            f"before the end of the video; {fix}"
        )
    if policy == "wrap":
        return (values * (desired // len(values) + 1))[:desired]
    return values + [values[-1]] * (desired - len(values))


def _check_common(num_frames_per_clip: int, policy: str) -> None:
    if num_frames_per_clip <= 0:
        raise ValueError(f"num_frames_per_clip={num_frames_per_clip} must be > 0")
    if policy not in _POLICIES:
        raise ValueError(f"policy={policy!r} must be one of {_POLICIES}")


def _need_frames(info: VideoInfo) -> int:
    if info.num_frames < 1:
        raise ValueError(f"the video has no frames: {info.source!r}")
    return info.num_frames


@dataclass(frozen=True)
class _IndexSampler:
    kind: Literal["random", "regular"]
    num_clips: int = 1
    num_frames_per_clip: int = 1
    num_indices_between_frames: int = 1
    sampling_range_start: int = 0
    sampling_range_end: int | None = None  # where a clip may *start*: [start, end)
    policy: Policy = "repeat_last"

    def __post_init__(self) -> None:
        _check_common(self.num_frames_per_clip, self.policy)
        if self.num_clips <= 0:
            raise ValueError(f"num_clips={self.num_clips} must be > 0")
        if self.num_indices_between_frames <= 0:
            raise ValueError(
                f"num_indices_between_frames={self.num_indices_between_frames} must be > 0"
            )

    def _range(self, n: int) -> tuple[int, int]:
        start = self.sampling_range_start
        if start < 0:
            start += n
        if not 0 <= start < n:
            raise ValueError(
                f"sampling_range_start={self.sampling_range_start} is outside "
                f"the video's {n} frames"
            )
        span = self.num_indices_between_frames * (self.num_frames_per_clip - 1) + 1
        end = self.sampling_range_end
        if end is None:
            end = max(n - span + 1, 1)
            if start >= end:
                raise ValueError(
                    f"the video has {n} frames, too few for a clip spanning {span} frames "
                    f"from sampling_range_start={self.sampling_range_start}"
                )
        else:
            end = min(end + n if end < 0 else end, n)
            if start >= end:
                raise ValueError(
                    f"sampling_range_start ({start}) must be smaller than sampling_range_end "
                    f"({end}) for a video of {n} frames"
                )
        return start, end

    def sample(self, info: VideoInfo, rng: np.random.Generator, /) -> list[list[int]]:
        """Clip start indices (random or evenly spaced), then every k-th frame."""
        n = _need_frames(info)
        start, end = self._range(n)
        if self.kind == "random":
            starts = rng.integers(start, end, size=self.num_clips).tolist()
        else:  # exactly torchcodec's rule: truncation, duplicates if too many clips
            starts = torch.linspace(start, end - 1, steps=self.num_clips, dtype=torch.int).tolist()
        step, count = self.num_indices_between_frames, self.num_frames_per_clip
        return [
            _complete(
                list(range(s, min(s + step * (count - 1) + 1, n), step)),
                count,
                self.policy,
                "the video is shorter than one clip's span: use policy='repeat_last' or "
                "'wrap', or fewer frames per clip, or leave such videos out",
            )
            for s in starts
        ]


def clips_at_random_indices(
    *,
    num_clips: int = 1,
    num_frames_per_clip: int = 1,
    num_indices_between_frames: int = 1,
    sampling_range_start: int = 0,
    sampling_range_end: int | None = None,
    policy: Policy = "repeat_last",
) -> _IndexSampler:
    """``num_clips`` clips starting at uniformly random frame indices (with replacement).

    Clips start in ``[sampling_range_start, sampling_range_end)`` (negative values count
    from the end); ``None`` means "as late as a whole clip still fits". A clip takes every
    ``num_indices_between_frames``-th frame.
    """
    return _IndexSampler(
        "random",
        num_clips,
        num_frames_per_clip,
        num_indices_between_frames,
        sampling_range_start,
        sampling_range_end,
        policy,
    )


def clips_at_regular_indices(
    *,
    num_clips: int = 1,
    num_frames_per_clip: int = 1,
    num_indices_between_frames: int = 1,
    sampling_range_start: int = 0,
    sampling_range_end: int | None = None,
    policy: Policy = "repeat_last",
) -> _IndexSampler:
    """``num_clips`` clips starting at evenly spaced frame indices (as torchcodec: the
    starts are ``linspace(start, end - 1, num_clips)`` truncated, so asking for more clips
    than starting points repeats some)."""
    return _IndexSampler(
        "regular",
        num_clips,
        num_frames_per_clip,
        num_indices_between_frames,
        sampling_range_start,
        sampling_range_end,
        policy,
    )


@dataclass(frozen=True)
class _TimeSampler:
    kind: Literal["random", "regular"]
    num_clips: int | None = 1
    seconds_between_clip_starts: float | None = None
    num_frames_per_clip: int = 1
    seconds_between_frames: float | None = None  # None: 1 / average fps
    sampling_range_start: float | None = None  # None: the first frame's pts
    sampling_range_end: float | None = None  # where a clip may *start*: [start, end)
    policy: Policy = "repeat_last"

    def __post_init__(self) -> None:
        _check_common(self.num_frames_per_clip, self.policy)
        if self.kind == "random" and (self.num_clips is None or self.num_clips <= 0):
            raise ValueError(f"num_clips={self.num_clips} must be > 0")
        if self.kind == "regular" and not (self.seconds_between_clip_starts or 0) > 0:
            raise ValueError(
                f"seconds_between_clip_starts={self.seconds_between_clip_starts} must be > 0"
            )
        if self.seconds_between_frames is not None and not self.seconds_between_frames > 0:
            raise ValueError(
                f"seconds_between_frames={self.seconds_between_frames} must be "
                "> 0, or None for one average frame duration"
            )
        for name in ("seconds_between_clip_starts", "seconds_between_frames"):
            value = getattr(self, name)  # (NaN compares False: it passes every bound)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name}={value} must be a finite number of seconds")
        for name in ("sampling_range_start", "sampling_range_end"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not math.isfinite(value)
            ):
                raise ValueError(f"{name}={value!r} must be None or a finite number of seconds")

    def _range(self, info: VideoInfo, between: float) -> tuple[float, float]:
        begin, end_stream = info.begin_seconds, info.end_seconds
        start = begin if self.sampling_range_start is None else self.sampling_range_start
        if not begin <= start < end_stream:
            raise ValueError(
                f"sampling_range_start={start} must lie in the video's "
                f"[{begin}, {end_stream}) seconds"
            )
        if self.sampling_range_end is None:
            end = end_stream - (self.num_frames_per_clip - 1) * between
        else:
            end = self.sampling_range_end
            if end <= begin:
                raise ValueError(f"sampling_range_end={end} must be > {begin}")
        if start >= end:
            n, span = self.num_frames_per_clip, (self.num_frames_per_clip - 1) * between
            video = (
                f"video {info.source!r} lasts {end_stream - begin:.3f} s "
                f"({info.num_frames} frames, [{begin:.3f}, {end_stream:.3f}) s)"
            )
            if self.sampling_range_end is not None:
                raise ValueError(
                    f"sampling_range_start={start} must be smaller than sampling_range_end="
                    f"{end}; the {video}"
                )
            raise ValueError(
                f"the {video}: too short for a clip of {n} frames {between:.4f} s apart "
                f"(span {span:.3f} s) starting at or after {start:.3f} s; use a smaller "
                "num_frames_per_clip or seconds_between_frames, pass sampling_range_end= to "
                "let clips run past the end (completed by policy), or leave such videos out"
            )
        return start, min(end, end_stream)

    def sample(self, info: VideoInfo, rng: np.random.Generator, /) -> list[list[int]]:
        """Clip start times, then one sampling time per frame, each mapped to the frame
        displayed at that time."""
        _need_frames(info)
        if not info.average_fps > 0:
            raise ValueError(
                f"cannot infer an average fps for {info.source!r}; use an index-based sampler"
            )
        between = self.seconds_between_frames or 1.0 / info.average_fps
        start, end = self._range(info, between)
        if self.kind == "random":
            assert self.num_clips is not None  # checked in __post_init__
            starts = (rng.random(self.num_clips) * (end - start) + start).tolist()
        else:
            assert self.seconds_between_clip_starts is not None
            count = max(math.ceil((end - start) / self.seconds_between_clip_starts), 0)
            starts = [start + k * self.seconds_between_clip_starts for k in range(count)]
            starts = [s for s in starts if s < end]  # float error may reach `end`
        clips = []
        for s in starts:
            times = [
                t
                for i in range(self.num_frames_per_clip)
                if (t := s + i * between) < info.end_seconds
            ]
            clips.append(
                _complete(
                    times,
                    self.num_frames_per_clip,
                    self.policy,
                    "leave sampling_range_end at None, or use policy='repeat_last' or 'wrap'",
                )
            )
        flat = np.asarray([t for c in clips for t in c], dtype=np.float64)
        idx = info.frame_at(flat).reshape(len(clips), self.num_frames_per_clip)
        return idx.tolist()


def clips_at_random_timestamps(
    *,
    num_clips: int = 1,
    num_frames_per_clip: int = 1,
    seconds_between_frames: float | None = None,
    sampling_range_start: float | None = None,
    sampling_range_end: float | None = None,
    policy: Policy = "repeat_last",
) -> _TimeSampler:
    """``num_clips`` clips starting at uniformly random times.

    Sampling times are ``start + i * seconds_between_frames`` (default: one average frame
    duration); each maps to the frame displayed then. Starts lie in
    ``[sampling_range_start, sampling_range_end)`` seconds; ``None`` means the first frame's
    pts and "as late as a whole clip still fits before the end".
    """
    return _TimeSampler(
        "random",
        num_clips,
        None,
        num_frames_per_clip,
        seconds_between_frames,
        sampling_range_start,
        sampling_range_end,
        policy,
    )


def clips_at_regular_timestamps(
    *,
    seconds_between_clip_starts: float,
    num_frames_per_clip: int = 1,
    seconds_between_frames: float | None = None,
    sampling_range_start: float | None = None,
    sampling_range_end: float | None = None,
    policy: Policy = "repeat_last",
) -> _TimeSampler:
    """Clips starting every ``seconds_between_clip_starts`` seconds from
    ``sampling_range_start`` (so the number of clips depends on the video's duration)."""
    return _TimeSampler(
        "regular",
        None,
        seconds_between_clip_starts,
        num_frames_per_clip,
        seconds_between_frames,
        sampling_range_start,
        sampling_range_end,
        policy,
    )


@dataclass(frozen=True)
class _Windows:
    num_frames_per_clip: int
    stride: int | None = None  # None: num_frames_per_clip (windows do not overlap)
    policy: Literal["repeat_last", "wrap", "error", "drop"] = "repeat_last"

    def __post_init__(self) -> None:
        if self.num_frames_per_clip <= 0:
            raise ValueError(f"num_frames_per_clip={self.num_frames_per_clip} must be > 0")
        if self.stride is not None and self.stride <= 0:
            raise ValueError(f"stride={self.stride} must be > 0, or None for num_frames_per_clip")
        if self.policy not in (*_POLICIES, "drop"):
            raise ValueError(f"policy={self.policy!r} must be one of {(*_POLICIES, 'drop')}")

    def sample(self, info: VideoInfo, rng: np.random.Generator, /) -> list[list[int]]:
        """Windows at 0, stride, 2*stride, ... until every frame is in one."""
        n, size = _need_frames(info), self.num_frames_per_clip
        stride = self.stride or size
        clips = []
        for s in range(0, n, stride):
            frames = list(range(s, min(s + size, n)))
            if len(frames) < size:
                if self.policy == "drop":
                    break
                frames = _complete(
                    frames,
                    size,
                    self.policy,
                    "use policy='drop' (no last partial window), 'repeat_last' or 'wrap'",
                )
            clips.append(frames)
            if s + size >= n:
                break
        return clips


def every_frame_windows(
    num_frames_per_clip: int,
    *,
    stride: int | None = None,
    policy: Literal["repeat_last", "wrap", "error", "drop"] = "repeat_last",
) -> _Windows:
    """Streaming mode: windows of ``num_frames_per_clip`` consecutive frames every
    ``stride`` frames (default: back to back), covering every frame of the video.

    The last window is completed per ``policy`` when frames run out (``"drop"`` drops it,
    so the tail frames are then not covered). A stride larger than the window skips frames.
    """
    return _Windows(num_frames_per_clip, stride, policy)
