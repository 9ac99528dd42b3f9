"""Audio clip samplers: where each clip of a file starts, in seconds.

The timestamp vocabulary of ``streambuf.video`` (torchcodec's names):
``clips_at_random_timestamps(num_clips=, seconds=)`` draws start times uniformly from
``[sampling_range_start, sampling_range_end - seconds]``; ``clips_at_regular_timestamps(
seconds_between_clip_starts=, seconds=)`` starts one every so many seconds;
``every_window(seconds=, stride=)`` covers the whole file in back-to-back (or
overlapping) windows. ``sampling_range_end`` None: the file's duration.

A sampler is a small frozen dataclass (picklable: it crosses into workers).
``sampler.sample(duration, rng)`` maps a file's duration (seconds, from its header) and a
``numpy.random.Generator`` seeded by ``(seed, epoch, file index)`` to the clips' start
times; every clip lasts ``seconds``. A file shorter than one clip is a ``ValueError``
(the decoder reports it naming the file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "AudioClipSampler",
    "clips_at_random_timestamps",
    "clips_at_regular_timestamps",
    "every_window",
]


class AudioClipSampler(Protocol):
    """What ``decode_audio_clips`` needs from a sampler."""

    seconds: float

    def sample(self, duration: float, rng: np.random.Generator, /) -> list[float]:
        """The start time (s) of each clip."""
        ...


def _seconds(value: object) -> bool:
    """A finite number of seconds (NaN compares False with everything: it would pass
    every bound check and place clips nowhere)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _positive(value: float, name: str) -> float:
    if not _seconds(value) or not value > 0:
        raise ValueError(f"{name}={value!r} must be a finite number of seconds > 0")
    return float(value)


def _range(start: float, end: float | None, duration: float, seconds: float) -> tuple[float, float]:
    """``[lo, hi]``: where a clip may start so that it ends within the file."""
    hi = (duration if end is None else min(end, duration)) - seconds
    if hi < start - 1e-9:
        raise ValueError(
            f"a clip of {seconds} s does not fit in [{start}, "
            f"{duration if end is None else min(end, duration):.3f}] s of a "
            f"{duration:.3f} s file"
        )
    return start, max(start, hi)


@dataclass(frozen=True)
class RandomTimestamps:
    num_clips: int
    seconds: float
    sampling_range_start: float = 0.0
    sampling_range_end: float | None = None
    kind = "random"

    def sample(self, duration: float, rng: np.random.Generator, /) -> list[float]:
        lo, hi = _range(self.sampling_range_start, self.sampling_range_end, duration, self.seconds)
        return [float(t) for t in rng.uniform(lo, hi, size=self.num_clips)]


@dataclass(frozen=True)
class RegularTimestamps:
    seconds_between_clip_starts: float
    seconds: float
    sampling_range_start: float = 0.0
    sampling_range_end: float | None = None
    kind = "regular"

    def sample(self, duration: float, rng: np.random.Generator, /) -> list[float]:
        lo, hi = _range(self.sampling_range_start, self.sampling_range_end, duration, self.seconds)
        n = math.floor((hi - lo) / self.seconds_between_clip_starts + 1e-9) + 1
        return [lo + k * self.seconds_between_clip_starts for k in range(n)]


def clips_at_random_timestamps(
    *,
    num_clips: int = 1,
    seconds: float,
    sampling_range_start: float = 0.0,
    sampling_range_end: float | None = None,
) -> RandomTimestamps:
    """``num_clips`` clips of ``seconds``, starting at uniform random times."""
    if isinstance(num_clips, bool) or not isinstance(num_clips, int) or num_clips < 1:
        raise ValueError(f"num_clips={num_clips!r} must be an int >= 1")
    _check_range(sampling_range_start, sampling_range_end)
    return RandomTimestamps(
        num_clips, _positive(seconds, "seconds"), sampling_range_start, sampling_range_end
    )


def clips_at_regular_timestamps(
    *,
    seconds_between_clip_starts: float,
    seconds: float,
    sampling_range_start: float = 0.0,
    sampling_range_end: float | None = None,
) -> RegularTimestamps:
    """A clip of ``seconds`` every ``seconds_between_clip_starts`` (the count depends on
    the file's duration)."""
    _check_range(sampling_range_start, sampling_range_end)
    return RegularTimestamps(
        _positive(seconds_between_clip_starts, "seconds_between_clip_starts"),
        _positive(seconds, "seconds"),
        sampling_range_start,
        sampling_range_end,
    )


def every_window(*, seconds: float, stride: float | None = None) -> RegularTimestamps:
    """Windows of ``seconds`` every ``stride`` (default ``seconds``: back to back) from
    the start; the tail shorter than a window is left out."""
    seconds = _positive(seconds, "seconds")
    return clips_at_regular_timestamps(
        seconds_between_clip_starts=seconds if stride is None else stride, seconds=seconds
    )


def _check_range(start: float, end: float | None) -> None:
    if not _seconds(start) or start < 0:
        raise ValueError(f"sampling_range_start={start!r} must be a finite number of seconds >= 0")
    if end is not None and (not _seconds(end) or end <= start):
        raise ValueError(
            f"sampling_range_end={end!r} must be None or a finite number of seconds > "
            f"sampling_range_start={start}"
        )
