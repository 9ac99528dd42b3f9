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

Bounded: ``sampler.count(duration)`` is how many clips ``sample`` returns, known before
any is placed; more than ``max_clips`` (default ``MAX_CLIPS_PER_FILE``) is a
``ValueError`` before a list is built, so a header claiming 1e9 s never becomes a list
of 1e9 start times (the decoder checks the duration itself first:
``streambuf.audio.decode``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = [
    "MAX_CLIPS_PER_FILE",
    "AudioClipSampler",
    "clips_at_random_timestamps",
    "clips_at_regular_timestamps",
    "every_window",
]


MAX_CLIPS_PER_FILE = 100_000  # clips one file may give (27 h of 1 s windows): max_clips=


class AudioClipSampler(Protocol):
    """What ``decode_audio_clips`` needs from a sampler (``count(duration)`` and
    ``max_clips`` too, where it has them: the decoder checks the count before
    ``sample`` builds the list; without them, the list it returns, after)."""

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


def too_many(count: int, max_clips: int, what: str) -> str | None:
    """Why ``count`` clips are refused (more than ``max_clips``), with the fix; None if
    they are not."""
    if count <= max_clips:
        return None
    return (
        f"{what} would place {count} clips in it, more than max_clips={max_clips}: pass "
        f"max_clips={count} (or more) to the sampler if the file is that long, or a longer "
        "stride"
    )


@dataclass(frozen=True)
class RandomTimestamps:
    num_clips: int
    seconds: float
    sampling_range_start: float = 0.0
    sampling_range_end: float | None = None
    max_clips: int = MAX_CLIPS_PER_FILE
    kind = "random"

    def count(self, duration: float, /) -> int:
        """How many clips ``sample`` gives a file of ``duration`` s (``ValueError``: a
        clip does not fit)."""
        _range(self.sampling_range_start, self.sampling_range_end, duration, self.seconds)
        return self.num_clips

    def sample(self, duration: float, rng: np.random.Generator, /) -> list[float]:
        lo, hi = _range(self.sampling_range_start, self.sampling_range_end, duration, self.seconds)
        return [float(t) for t in rng.uniform(lo, hi, size=self.num_clips)]


@dataclass(frozen=True)
class RegularTimestamps:
    seconds_between_clip_starts: float
    seconds: float
    sampling_range_start: float = 0.0
    sampling_range_end: float | None = None
    max_clips: int = MAX_CLIPS_PER_FILE
    kind = "regular"

    def count(self, duration: float, /) -> int:
        """How many clips ``sample`` gives a file of ``duration`` s (``ValueError``: a
        clip does not fit), computed, not listed."""
        lo, hi = _range(self.sampling_range_start, self.sampling_range_end, duration, self.seconds)
        return math.floor((hi - lo) / self.seconds_between_clip_starts + 1e-9) + 1

    def sample(self, duration: float, rng: np.random.Generator, /) -> list[float]:
        n = self.count(duration)
        why = too_many(n, self.max_clips, f"a {duration:.3f} s file")
        if why:
            raise ValueError(why)
        lo = self.sampling_range_start
        return [lo + k * self.seconds_between_clip_starts for k in range(n)]


def clips_at_random_timestamps(
    *,
    num_clips: int = 1,
    seconds: float,
    sampling_range_start: float = 0.0,
    sampling_range_end: float | None = None,
    max_clips: int = MAX_CLIPS_PER_FILE,
) -> RandomTimestamps:
    """``num_clips`` clips of ``seconds``, starting at uniform random times
    (``num_clips`` at most ``max_clips``)."""
    if isinstance(num_clips, bool) or not isinstance(num_clips, int) or num_clips < 1:
        raise ValueError(f"num_clips={num_clips!r} must be an int >= 1")
    _check_range(sampling_range_start, sampling_range_end)
    why = too_many(num_clips, _max_clips(max_clips), f"num_clips={num_clips}")
    if why:
        raise ValueError(why)
    return RandomTimestamps(
        num_clips,
        _positive(seconds, "seconds"),
        sampling_range_start,
        sampling_range_end,
        max_clips,
    )


def clips_at_regular_timestamps(
    *,
    seconds_between_clip_starts: float,
    seconds: float,
    sampling_range_start: float = 0.0,
    sampling_range_end: float | None = None,
    max_clips: int = MAX_CLIPS_PER_FILE,
) -> RegularTimestamps:
    """A clip of ``seconds`` every ``seconds_between_clip_starts`` (the count depends on
    the file's duration; a file that would give more than ``max_clips`` is refused)."""
    _check_range(sampling_range_start, sampling_range_end)
    return RegularTimestamps(
        _positive(seconds_between_clip_starts, "seconds_between_clip_starts"),
        _positive(seconds, "seconds"),
        sampling_range_start,
        sampling_range_end,
        _max_clips(max_clips),
    )


def every_window(
    *, seconds: float, stride: float | None = None, max_clips: int = MAX_CLIPS_PER_FILE
) -> RegularTimestamps:
    """Windows of ``seconds`` every ``stride`` (default ``seconds``: back to back) from
    the start; the tail shorter than a window is left out (a file that would give more
    than ``max_clips`` windows is refused)."""
    seconds = _positive(seconds, "seconds")
    return clips_at_regular_timestamps(
        seconds_between_clip_starts=seconds if stride is None else stride,
        seconds=seconds,
        max_clips=max_clips,
    )


def _max_clips(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_clips={value!r} must be an int >= 1")
    return value


def _check_range(start: float, end: float | None) -> None:
    if not _seconds(start) or start < 0:
        raise ValueError(f"sampling_range_start={start!r} must be a finite number of seconds >= 0")
    if end is not None and (not _seconds(end) or end <= start):
        raise ValueError(
            f"sampling_range_end={end!r} must be None or a finite number of seconds > "
            f"sampling_range_start={start}"
        )
