"""``decode_member``: decode clips from a video stored as a member of a tar shard.

For pipelines over WebDataset-style samples (dicts of ``{"__key__": ..., "mp4": b"..."}``
from ``streambuf.shards(...)``)::

    dec = sb.video.decode_member("mp4", sampler=sb.video.clips_at_random_indices(
        num_clips=2, num_frames_per_clip=16), width=224, height=224)
    pipe = sb.shards("train-{000..127}.tar").map(dec, threads=4)   # -> list[Clip] per sample

``map`` is one-to-one, so each sample becomes a **list** of clips (sampler order), which
travels through the pipeline's byte-bounded buffers with its true size (the sum of its
clips). With ``num_clips=1``, take ``[0]`` in a following ``.map``.

Randomness: the sampler's generator is seeded by (seed, epoch, a stable hash of the
sample's ``__url__`` and ``__key__``), so the clips of a sample depend on the sample, not
on which worker decodes it. Call ``dec.set_epoch(epoch)`` each epoch (it reaches
DataLoader workers, persistent ones too); without it every epoch draws the same clips.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

from .._failures import FailurePolicy, OnError
from .._shared import SharedInt
from ..errors import StageError, VideoError
from ..io.urls import redact
from .audio import AudioMissing, AudioSpec, audio_spec
from .decode import _LAYOUTS, Clip, DecodeStats, Layout, decode_clips
from .probe import _import_av
from .samplers import ClipSampler

__all__ = ["MemberDecoder", "decode_member"]

_STAGE = "video"


def sample_index(url: object, key: object) -> int:
    """A stable non-negative 63-bit number for a sample (its generator's third seed)."""
    digest = hashlib.blake2b(f"{url}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def member_bytes(
    sample: Mapping[str, Any],
    fields: tuple[str, ...],
    policy: FailurePolicy,
    error: type[StageError],
    kind: str,
) -> tuple[str, bytes | bytearray | memoryview] | None:
    """``(name, raw bytes)`` of the first of ``fields`` in ``sample``; a sample without
    any is an ``error`` at stage "<kind>.open" handed to ``policy`` (None when skipped);
    a field holding anything but bytes is a ``TypeError`` (decoded too early)."""
    url, key = sample.get("__url__"), sample.get("__key__")
    field = next((f for f in fields if f in sample), None)
    name = redact(f"{url}#{key}.{field or fields[0]}")
    if field is None:
        have = sorted(k for k in sample if not str(k).startswith("__"))
        err = error(
            f"sample has no field {' or '.join(map(repr, fields))} "
            f"(fields: {', '.join(have) or 'none'}); pass decode_member(field=...)",
            stage=f"{kind}.open",
            source=name,
        )
        policy.handle(err, source=name, error_type=error)
        return None
    data = sample[field]
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(
            f"field {field!r} of {name} holds {type(data).__name__}, not bytes; "
            "decode_member needs the raw member (do not decode it first)"
        )
    return name, data


class MemberDecoder:
    """Callable ``sample -> list[Clip]`` made by ``decode_member`` (picklable)."""

    def __init__(
        self,
        field: str | Sequence[str],
        *,
        sampler: ClipSampler,
        width: int | None,
        height: int | None,
        layout: Layout,
        ffmpeg_threads: int,
        seed: int,
        on_error: OnError,
        max_failures: int | None,
        audio: AudioSpec | None = None,
    ) -> None:
        self.fields = (field,) if isinstance(field, str) else tuple(field)
        if not self.fields or not all(isinstance(f, str) and f for f in self.fields):
            raise ValueError(f"field={field!r} must be a field name like 'mp4', or a list")
        if not callable(getattr(sampler, "sample", None)):
            raise TypeError(f"sampler={sampler!r} has no sample(info, rng) method")
        if layout not in _LAYOUTS:
            raise ValueError(f"layout={layout!r} must be one of {_LAYOUTS}")
        for arg, value in (("width", width), ("height", height)):
            if value is not None and value <= 0:
                raise ValueError(f"{arg}={value} must be > 0, or None for the coded size")
        if ffmpeg_threads < 0:
            raise ValueError(f"ffmpeg_threads={ffmpeg_threads} must be >= 0")
        self.sampler = sampler
        self.width, self.height, self.layout = width, height, layout
        self.ffmpeg_threads = ffmpeg_threads
        self.seed = int(seed)
        self.on_error: OnError = on_error
        self.max_failures = max_failures
        self.audio = audio
        self._policy = FailurePolicy(on_error, max_failures, stage=_STAGE)
        self._epoch = SharedInt(0)
        self.stats = DecodeStats()  # this process's counters (not thread-safe: indicative)
        self.__name__ = "decode_member"

    def set_epoch(self, epoch: int) -> None:
        """Seed the next epoch's clips (reaches DataLoader workers, persistent ones too)."""
        self._epoch.value = int(epoch)

    def __call__(self, sample: Mapping[str, Any], /) -> list[Clip]:
        found = member_bytes(sample, self.fields, self._policy, VideoError, "video")
        if found is None:
            return []
        name, data = found
        url, key = sample.get("__url__"), sample.get("__key__")
        out = list(
            decode_clips(
                io.BytesIO(data),
                sampler=self.sampler,
                seed=self.seed,
                epoch=self._epoch.value,
                index=sample_index(url, key),
                width=self.width,
                height=self.height,
                layout=self.layout,
                threads=self.ffmpeg_threads,
                policy=self._policy,
                stats=self.stats,
                name=name,
                audio=self.audio,
            )
        )
        out.sort(key=lambda c: int(c.clip_index))
        return out

    def __repr__(self) -> str:
        return f"decode_member({self.fields!r}, sampler={self.sampler!r})"


def decode_member(
    field: str | Sequence[str] = "mp4",
    /,
    *,
    sampler: ClipSampler,
    width: int | None = None,
    height: int | None = None,
    layout: Layout = "TCHW",
    ffmpeg_threads: int = 1,
    seed: int = 0,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    audio: bool | dict[str, int | None] | None = None,
    audio_missing: AudioMissing = "raise",
) -> MemberDecoder:
    """A ``.map()`` function: sample dict -> the list of clips decoded from ``sample[field]``.

    Args:
        field: the member holding the video bytes (``"mp4"``), or several to try in order.
        sampler, width, height, layout: as in ``clips()``.
        ffmpeg_threads: FFmpeg threads per decoder (keep 1 inside DataLoader workers).
        seed: seeds the sampler with the epoch (``set_epoch``) and the sample's key.
        on_error, max_failures: "raise" or "skip" (returns ``[]``; counted per process).
        audio, audio_missing: as in ``clips()``: each clip carries ``Clip.audio``.

    Raises (when called):
        VideoError: the field is missing or the video cannot be decoded (``"raise"``).
        TypeError: the field holds something other than bytes.
    """
    _import_av()
    return MemberDecoder(
        field,
        sampler=sampler,
        width=width,
        height=height,
        layout=layout,
        ffmpeg_threads=ffmpeg_threads,
        seed=seed,
        on_error=on_error,
        max_failures=max_failures,
        audio=audio_spec(audio, audio_missing),
    )
