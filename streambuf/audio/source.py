"""``streambuf.audio.clips(files, sampler=...)``: a ``Pipeline`` of audio clips, and
``decode_member`` for audio members of tar shards.

The machinery is the video source's (``streambuf.video.source``): each file is a shard,
split over rank x worker (a file's clips split by sampler position when there are fewer
files than slots), ``threads`` files decoded at once per worker on lane threads, clips
held within the Loader's stage byte budget, a clip's position ``(file, clip index)`` so
a resume decodes only the clips not yet delivered, bad files raised or skipped and
counted. Only the decoding differs (``decode_audio_clips``) and the counters
(``pipe.stats().audio``: ``AudioDecodeStats``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .._counters import PipelineStats, SharedCounters
from .._failures import FailurePolicy, OnError
from .._shared import SharedInt
from .._source_kinds import SequenceSource
from .._units import check_count_or_auto, check_int
from ..errors import AudioError, StageError
from ..io.urls import UrlSpec, expand_urls, secrets_of
from ..pipeline import Pipeline
from ..sharding import Sharding
from ..video.audio import MAX_CHANNELS, AudioSamples
from ..video.member import member_bytes, sample_index
from ..video.probe import _import_av
from ..video.source import LaneReader, VideoAccess
from .decode import AudioDecodeStats, decode_audio_clips
from .samplers import AudioClipSampler

__all__ = ["AudioAccess", "AudioMemberDecoder", "AudioReader", "clips", "decode_member"]

_DEFAULT_STAGE_BYTES = 256 << 20
_ITEMS_PER_LANE = 8
_COUNTERS = tuple(f.name for f in fields(AudioDecodeStats))


def _check(sampler: Any, sample_rate: Any, channels: Any) -> None:
    if not callable(getattr(sampler, "sample", None)) or not hasattr(sampler, "seconds"):
        raise TypeError(
            f"sampler={sampler!r} is not an audio sampler; use e.g. "
            "streambuf.audio.clips_at_random_timestamps(num_clips=2, seconds=2.0)"
        )
    if sample_rate is not None:
        check_int(sample_rate, name="sample_rate", minimum=1)
    if channels is not None:  # (7.1 at most: ``streambuf.video.audio``)
        check_int(channels, name="channels", minimum=1, maximum=MAX_CHANNELS)


class AudioAccess(VideoAccess):
    """The video source's ``Access`` with audio files' decoding and counters."""

    kind = "audio"
    stats_type = AudioDecodeStats
    error_type: type[StageError] = AudioError

    def _decode(
        self, src: Any, *, index: int, name: str, stats: Any, keep: Callable[[int], bool]
    ) -> Generator[Any, None, None]:
        return decode_audio_clips(
            src,
            sampler=self.r.sampler,
            seed=self.ctx.seed,
            epoch=self.ctx.epoch,
            index=index,
            sample_rate=self.r.sample_rate,
            channels=self.r.channels,
            policy=self.policy,
            stats=stats,
            name=name,
            keep=keep,
        )


@dataclass(frozen=True)
class AudioReader(LaneReader):
    """The ``SourceReader`` of ``clips()``: configuration only, picklable."""

    sampler: AudioClipSampler
    sample_rate: int | None = None
    channels: int | None = None
    threads: int | str = 2
    on_error: OnError = "raise"
    max_failures: int | None = None
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_limit: int | None = None
    default_bytes: int = _DEFAULT_STAGE_BYTES
    _secrets: tuple[str, ...] = field(default=(), repr=False)
    access_type: ClassVar[type[VideoAccess]] = AudioAccess
    stage_name: ClassVar[str] = "audio"
    items_per_lane: ClassVar[int] = _ITEMS_PER_LANE
    counters: SharedCounters = field(
        default_factory=lambda: SharedCounters(_COUNTERS), compare=False, repr=False
    )
    thread_counters: SharedCounters | None = field(default=None, compare=False, repr=False)

    def stats(self) -> PipelineStats:
        """What the pipeline's workers decoded so far (``Pipeline.stats()``)."""
        return PipelineStats(
            audio=AudioDecodeStats(**self.counters.totals()), threads=self.thread_stats()
        )


def clips(
    files: UrlSpec,
    /,
    *,
    sampler: AudioClipSampler,
    sample_rate: int | None = None,
    channels: int | None = None,
    threads: int | str = 2,
    seed: int = 0,
    shuffle_files: bool = True,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Pipeline:
    """A ``Pipeline`` of ``AudioSamples`` clips from audio files (wav, flac, mp3, opus,
    anything FFmpeg reads), e.g.::

        pipe = sb.audio.clips("speech/*.flac",
                              sampler=sb.audio.clips_at_random_timestamps(
                                  num_clips=4, seconds=2.0),
                              sample_rate=16000, channels=1).batch(32)
        loader = sb.Loader(pipe, num_workers=4, max_batches=8, max_bytes="1GiB")
        for batch in loader:
            x = batch.data          # (32, 1, 32000) float32; batch.pts_seconds: (32,)

    Args:
        files: paths, globs, brace patterns, fsspec URLs, or a list of them.
        sampler: ``clips_at_random_timestamps``, ``clips_at_regular_timestamps`` or
            ``every_window`` (``streambuf.audio``).
        sample_rate, channels: resample / downmix to these (None: each file's own; give
            both to batch files of mixed formats).
        threads: files decoded at once per worker; ``"auto"``: 4 files at once, driven
            by as many threads as measurably pay (the order is that of ``threads=4``).
        seed, shuffle_files: the file order is permuted per (seed, epoch); the samplers
            are seeded by (seed, epoch, file index).
        on_error, max_failures: "raise" or "skip" bad files (counted, at most this many
            per worker).
        storage_options, cache_dir, cache_limit: as in ``streambuf.video.clips``.
        rank, world_size: override ``torch.distributed``.
    """
    _check(sampler, sample_rate, channels)
    check_count_or_auto(threads, name="threads")
    FailurePolicy(on_error, max_failures, stage="audio")  # validates both
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options={storage_options!r} must be a dict or None")
    from ..sources.options import check_cache_options

    folder, limit = check_cache_options(cache_dir, cache_limit)
    sharding = Sharding(
        shuffle_shards=shuffle_files,
        seed=seed,
        rank=rank,
        world_size=world_size,
        arg_names={"shuffle_shards": "shuffle_files"},
    )
    _import_av()
    urls = [os.fspath(u) for u in expand_urls(files, storage_options=storage_options)]
    reader = AudioReader(
        sampler=sampler,
        sample_rate=sample_rate,
        channels=channels,
        threads=threads,
        on_error=on_error,
        max_failures=max_failures,
        storage_options=dict(storage_options) if storage_options else None,
        cache_dir=folder,
        cache_limit=limit,
        _secrets=secrets_of(storage_options),
    )
    from .._compact import IndexedStrList, StrList

    return Pipeline._of(SequenceSource(IndexedStrList(StrList(urls)), reader=reader), sharding)


class AudioMemberDecoder:
    """Callable ``sample -> list[AudioSamples]`` made by ``decode_member`` (picklable)."""

    def __init__(
        self,
        fields: tuple[str, ...],
        sampler: AudioClipSampler,
        sample_rate: int | None,
        channels: int | None,
        seed: int,
        on_error: OnError,
        max_failures: int | None,
    ) -> None:
        self.fields, self.sampler = fields, sampler
        self.sample_rate, self.channels, self.seed = sample_rate, channels, seed
        self._policy = FailurePolicy(on_error, max_failures, stage="audio")
        self._epoch = SharedInt(0)  # (set_epoch reaches persistent workers too)
        self.stats = AudioDecodeStats()
        self.__name__ = "decode_member"

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = int(epoch)

    def __call__(self, sample: Mapping[str, Any], /) -> list[AudioSamples]:
        found = member_bytes(sample, self.fields, self._policy, AudioError, "audio")
        if found is None:
            return []
        name, data = found
        url, key = sample.get("__url__"), sample.get("__key__")
        out = list(
            decode_audio_clips(
                io.BytesIO(data),
                sampler=self.sampler,
                seed=self.seed,
                epoch=self._epoch.value,
                index=sample_index(url, key),
                sample_rate=self.sample_rate,
                channels=self.channels,
                policy=self._policy,
                stats=self.stats,
                name=name,
            )
        )
        out.sort(key=lambda c: int(c.clip_index))  # type: ignore[arg-type]
        return out


def decode_member(
    field: str | Sequence[str] = "flac",
    /,
    *,
    sampler: AudioClipSampler,
    sample_rate: int | None = None,
    channels: int | None = None,
    seed: int = 0,
    on_error: OnError = "raise",
    max_failures: int | None = None,
) -> AudioMemberDecoder:
    """A ``.map()`` function: sample dict -> the list of clips (sampler order) decoded
    from the audio bytes in ``sample[field]`` (``"flac"``, ``"wav"``, ``"mp3"``, or
    several to try in order); add ``.flatten()`` for one clip per sample."""
    fields_ = (field,) if isinstance(field, str) else tuple(field)
    if not fields_ or not all(isinstance(f, str) and f for f in fields_):
        raise ValueError(f"field={field!r} must be a field name like 'flac', or a list")
    _check(sampler, sample_rate, channels)
    _import_av()
    return AudioMemberDecoder(
        fields_, sampler, sample_rate, channels, int(seed), on_error, max_failures
    )
