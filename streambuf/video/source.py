"""``clips(videos, sampler=...)``: a ``Pipeline`` of clips decoded from many videos.

Data flow inside one DataLoader worker (or the main process without workers)::

    its share of the videos ──► ``threads`` lane threads, lane t decodes videos t, t+K, ...
        (open: local path, the node cache's copy, or an fsspec file object;
         decode_clips: probe, sample, decode)
    ──► Window(lanes=K, round_robin, max_bytes=stage budget) ──► later stages

* **Sharding.** Each video is a shard of the ``Pipeline``: the video order is permuted per
  (seed, epoch) when ``shuffle_videos``, split across rank x worker; with fewer videos
  than slots a video's clips are split by sampler position (slot ``offset`` keeps clips
  ``offset, offset + stride, ...``) and each slot decodes only the frames of its clips.
  Every clip of every video is delivered exactly once per epoch.
* **Determinism.** The sampler's generator is seeded by (seed, epoch, the video's index
  in the expanded list), and the buffer delivers the lanes round robin, so the output of
  one slot is a function of (seed, epoch, rank, world size, workers) and the files.
* **Memory.** A worker's clips, queued *and* being built, stay within the stage budget
  the ``Loader`` grants (``max_bytes // 4 // num_workers``; 256 MiB outside a Loader),
  split evenly over the lanes: a lane reserves one clip's bytes (the largest so far)
  in the buffer before decoding it (the package's one lane runner, ``streambuf._lanes``).
  A lane holding nothing may always build one clip, so a clip larger than a lane's slice
  is built and queued alone. Not counted: one converted frame per lane, the already-built
  part of a next clip that overlaps the current one, and FFmpeg's decoder buffers.
* **Positions.** A clip's position is (video, clip index); resuming decodes only the
  clips not yet delivered (``VideoAccess``).
* **Errors.** ``on_error="raise"``: the first failure reaches the consumer as a
  ``VideoError`` naming the file and stage, with a note naming the lane; clips held are
  dropped. ``"skip"``: the video is logged and counted (its clips before the damage are
  kept) and the lane goes on; more than ``max_failures`` skips per worker raise
  ``TooManyFailures``.
* **Counters.** ``pipe.stats().videos``: the ``DecodeStats`` of every worker, summed
  (videos, clips, frames decoded and converted, seeks, failures), published as each
  video ends.
* **Shutdown.** Closing the iterator (end, ``break``, an exception, Loader shutdown)
  closes the buffer; lanes stop at their next reservation or put, close their containers
  and files, and are joined (bounded).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import IO, Any, ClassVar

from .._contracts import ReaderRun, WorkerContext
from .._counters import THREAD_COUNTS, PipelineStats, SharedCounters, thread_gauge, thread_stats
from .._failures import FailurePolicy, OnError
from .._source_kinds import SequenceSource
from .._units import check_choice, check_count_or_auto, check_int, parse_count
from ..errors import StageError, VideoError, add_note
from ..io.urls import UrlSpec, expand_urls, redact, secrets_of
from ..pipeline import Pipeline
from ..sharding import Equalize, Sharding
from .audio import AudioMissing, AudioSpec, audio_spec
from .decode import _LAYOUTS, Clip, DecodeStats, Layout, decode_clips
from .gpu import check_decoder
from .probe import _import_av
from .samplers import ClipSampler

__all__ = ["VideoAccess", "VideoReader", "clips"]

log = logging.getLogger("streambuf")

_DEFAULT_STAGE_BYTES = 256 << 20  # the buffer's bound outside a Loader
_ITEMS_PER_LANE = 4
_STAGE = "video"
_DECODE = tuple(f.name for f in fields(DecodeStats))


def _is_remote(url: str) -> bool:
    head, sep, _ = url.partition("://")
    return bool(sep) and head.lower() != "file" and "/" not in head


def open_source(
    url: str,
    storage_options: Mapping[str, Any] | None,
    *,
    cache_dir: str | None = None,
    cache_limit: int | None = None,
) -> str | IO[bytes]:
    """A local path as is; any other URL as a seekable file object (caller closes): the
    node-local cache's copy when ``cache_dir`` is set and the video fits (downloaded into
    it first on a miss; ``streambuf.io.cached_file``), else an fsspec file object.

    Raises:
        ImportError: fsspec is missing (``pip install streambuf[remote]``).
    """
    if not _is_remote(url):
        return url[len("file://") :] if url.lower().startswith("file://") else url
    try:
        import fsspec
    except ImportError as exc:
        raise ImportError(
            f"reading videos from {url.partition('://')[0]}:// URLs needs fsspec: "
            "pip install streambuf[remote]"
        ) from exc
    if cache_dir is not None and cache_limit is not None:
        from ..io.cache import cached_file

        local = cached_file(
            url, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options
        )
        if local is not None:
            return local
    f: IO[bytes] = fsspec.open(url, "rb", **dict(storage_options or {})).open()
    return f


class VideoAccess:
    """How lanes decode videos (an ``Access`` of ``streambuf._source``).

    A sample's position is ``(video, clip index in the sampler's list)``; the hint after
    a clip is ``{"done": [clip indices handed out so far in this video]}``, so a resumed
    lane reopens its video and decodes only the clips not yet handed out (the sampler is
    a function of (seed, epoch, video)), and ``fetch`` decodes exactly the clips asked for.
    """

    threaded = True

    def __init__(
        self,
        reader: Any,  # a VideoReader (an AudioReader for streambuf.audio)
        source: Sequence[Any],
        *,
        ctx: WorkerContext,
        stride: int,
        offset: int,
    ) -> None:
        self.r = reader
        self.source = source
        self.ctx = ctx
        self.stride, self.offset = stride, offset
        self.policy = FailurePolicy(reader.on_error, reader.max_failures, stage=self.kind)
        self.stats = self.stats_type()
        self._lock = threading.Lock()

    def name(self, shard: int) -> str:
        return redact(self.source[shard][1], secrets=self.r._secrets)

    def _mine(self, ci: int) -> bool:
        return ci >= self.offset and (ci - self.offset) % self.stride == 0

    def _clips(self, shard: int, keep: Callable[[int], bool]) -> Iterator[Clip]:
        index, url = self.source[shard]
        name = redact(url, secrets=self.r._secrets)
        stats = self.stats_type()
        try:
            src = open_source(
                url,
                self.r.storage_options,
                cache_dir=self.r.cache_dir,
                cache_limit=self.r.cache_limit,
            )
        except ImportError:
            raise
        except Exception as exc:
            err = self.error_type(
                f"cannot open {self.kind}: {type(exc).__name__}: "
                f"{redact(exc, secrets=self.r._secrets)}",
                stage=f"{self.kind}.open",
                source=name,
            )
            stats.failures += 1
            self._add(stats)
            self.policy.handle(err, source=name, error_type=self.error_type)
            return
        gen = self._decode(src, index=index, name=name, stats=stats, keep=keep)
        try:
            yield from gen
        except BaseException as exc:
            add_note(exc, f"streambuf: while decoding {self.kind} {name}")
            raise
        finally:
            gen.close()
            if not isinstance(src, str):
                src.close()
            self._add(stats)

    kind = "video"  # in messages ("cannot open video") and error stages ("video.open")
    stats_type: type = DecodeStats  # the counters of one file, added up per worker
    error_type: type[StageError] = VideoError

    def _decode(
        self, src: Any, *, index: int, name: str, stats: Any, keep: Callable[[int], bool]
    ) -> Generator[Any, None, None]:
        """The clips of one opened file (``clip_index`` their sampler position)."""
        return decode_clips(
            src,
            sampler=self.r.sampler,
            seed=self.ctx.seed,
            epoch=self.ctx.epoch,
            index=index,
            width=self.r.width,
            height=self.r.height,
            layout=self.r.layout,
            threads=self.r.ffmpeg_threads,
            policy=self.policy,
            stats=stats,
            name=name,
            keep=keep,
            audio=self.r.audio,
            decoder=self.r.decoder,
        )

    def _add(self, stats: Any) -> None:
        with self._lock:
            for f in fields(self.stats_type):
                setattr(self.stats, f.name, getattr(self.stats, f.name) + getattr(stats, f.name))
            self.r.counters.add(self.ctx.worker, asdict(stats))

    def read(self, lane: int, shard: int, /, *, index: int, hint: Any) -> Iterator[tuple]:
        done = list(hint["done"]) if isinstance(hint, dict) else []
        skip = set(done)
        for clip in self._clips(shard, lambda ci: self._mine(ci) and ci not in skip):
            ci = int(clip.clip_index)
            done.append(ci)
            yield ci, None, {"done": sorted(done)}, clip

    def fetch(self, shard: int, wanted: list[tuple[int, Any]], /) -> Iterator[tuple[int, Any]]:
        want = {i for i, _ in wanted}
        for clip in self._clips(shard, want.__contains__):
            yield int(clip.clip_index), clip

    def close(self) -> None:
        pass  # lanes stop at their next reservation; each closes its container


# threads="auto": the files a worker decodes at once (the lanes: they fix the order, as
# a fixed count would); how many threads drive them is chosen at run time (ThreadTuner)
AUTO_DECODE_LANES = 4


class LaneReader:
    """``lanes()`` and ``open()`` of a reader whose files are decoded on lane threads
    (videos, audio files): one lane per thread, round robin, ``items_per_lane`` items
    queued per lane within the stage byte grant; a subclass names its ``Access`` and
    stage and holds ``threads``, ``default_bytes`` and ``thread_counters``.

    ``threads="auto"``: ``AUTO_DECODE_LANES`` lanes (the order is that fixed count's),
    driven by as many threads as the tuner finds pay (``streambuf._source``), shown in
    ``stats().threads`` under the stage's name."""

    access_type: ClassVar[type[VideoAccess]]
    stage_name: ClassVar[str]
    items_per_lane: ClassVar[int] = _ITEMS_PER_LANE
    threads: int | str
    default_bytes: int
    thread_counters: SharedCounters | None

    def __post_init__(self) -> None:
        if self.threads == "auto" and self.thread_counters is None:
            object.__setattr__(self, "thread_counters", SharedCounters(THREAD_COUNTS))

    def lanes(self) -> tuple[int, str]:
        """``(lanes, order)`` a slot's files are decoded with: one lane per thread
        (``"auto"``: ``AUTO_DECODE_LANES``)."""
        if self.threads == "auto":
            return AUTO_DECODE_LANES, "round_robin"
        return max(1, int(self.threads)), "round_robin"

    def thread_stats(self) -> tuple[Any, ...]:
        """``threads="auto"``: the threads over the lanes, for ``PipelineStats.threads``."""
        tc = self.thread_counters
        return () if tc is None else (thread_stats(self.stage_name, tc, AUTO_DECODE_LANES),)

    def workers_ended(self) -> None:
        """The workers are gone: none runs lane threads now (their gauges go to 0)."""
        if self.thread_counters is not None:
            self.thread_counters.zero(("threads", "running", "inline"))

    def open(
        self,
        source: Sequence[Any],
        /,
        *,
        ctx: WorkerContext,
        stage_bytes: int | None,
        stride: int,
        offset: int,
    ) -> ReaderRun:
        lanes, _ = self.lanes()
        return ReaderRun(
            access=self.access_type(self, source, ctx=ctx, stride=stride, offset=offset),
            lanes=lanes,
            order="round_robin",
            max_items=self.items_per_lane * lanes,
            max_bytes=stage_bytes or self.default_bytes,
            name=self.stage_name,
            threads="auto" if self.threads == "auto" else None,
            on_threads=(
                None
                if self.thread_counters is None
                else thread_gauge(self.thread_counters, ctx.worker)
            ),
        )


@dataclass(frozen=True)
class VideoReader(LaneReader):
    """The ``SourceReader`` of ``clips()``: configuration only, picklable.

    The pipeline's shards are ``(index, url)`` pairs; ``open`` is called inside each
    worker with that worker's share and builds a ``VideoAccess`` for its lanes.
    """

    sampler: ClipSampler
    width: int | None = None
    height: int | None = None
    layout: Layout = "TCHW"
    ffmpeg_threads: int = 1
    threads: int | str = 2
    on_error: OnError = "raise"
    max_failures: int | None = None
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_limit: int | None = None
    audio: AudioSpec | None = None
    decoder: str = "cpu"
    default_bytes: int = _DEFAULT_STAGE_BYTES
    _secrets: tuple[str, ...] = field(default=(), repr=False)
    access_type: ClassVar[type[VideoAccess]] = VideoAccess
    stage_name: ClassVar[str] = _STAGE
    counters: SharedCounters = field(
        default_factory=lambda: SharedCounters(_DECODE), compare=False, repr=False
    )
    thread_counters: SharedCounters | None = field(default=None, compare=False, repr=False)

    def stats(self) -> PipelineStats:
        """What the pipeline's workers decoded so far (``Pipeline.stats()``)."""
        return PipelineStats(
            videos=DecodeStats(**self.counters.totals()), threads=self.thread_stats()
        )


def fixed_clip_count(sampler: ClipSampler) -> int | None:
    """Clips per video when the sampler always returns the same number, else None."""
    kind = getattr(sampler, "kind", None)
    num = getattr(sampler, "num_clips", None)
    fixed = kind == "random" or (  # regular *timestamps* depend on the duration
        kind == "regular" and hasattr(sampler, "num_indices_between_frames")
    )
    return num if fixed and isinstance(num, int) and num > 0 else None


def clips(
    videos: UrlSpec,
    /,
    *,
    sampler: ClipSampler,
    width: int | None = None,
    height: int | None = None,
    layout: Layout = "TCHW",
    ffmpeg_threads: int = 1,
    threads: int | str = 2,
    seed: int = 0,
    shuffle_videos: bool = True,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    equalize: Equalize | None = None,
    clips_per_video: int | Sequence[int] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    audio: bool | dict[str, int | None] | None = None,
    audio_missing: AudioMissing = "raise",
    decoder: str = "cpu",
) -> Pipeline:
    """A ``Pipeline`` of ``Clip`` objects decoded from ``videos`` (see the module docstring).

    Example::

        pipe = sb.video.clips("videos/*.mp4",
                              sampler=sb.video.clips_at_random_indices(
                                  num_clips=2, num_frames_per_clip=16),
                              width=224, height=224).batch(8)
        loader = sb.Loader(pipe, num_workers=4, max_batches=8, max_bytes="2GiB")

    Args:
        videos: paths, globs (sorted), brace patterns, fsspec URLs (``s3://``,
            ``https://``, ``memory://``, ...), or a list of them; expanded here, once.
        sampler: which clips to take from each video, e.g. ``clips_at_random_indices``.
        width, height: output size (resized in swscale); one alone keeps the aspect ratio.
        layout: "TCHW" (default), "THWC" or "CTHW".
        ffmpeg_threads: FFmpeg threads per decoder (keep 1 inside DataLoader workers).
        threads: videos decoded concurrently per worker (lane threads); ``"auto"``:
            ``AUTO_DECODE_LANES`` (4) videos at once, driven by as many threads as
            measurably pay (the order is that of ``threads=4``).
        seed: seeds the video order and the samplers (with the epoch).
        shuffle_videos: permute the video order every epoch.
        on_error, max_failures: "raise" (default) or "skip" bad videos, at most this many
            per worker.
        storage_options: passed to ``fsspec.open`` (and to fsspec when globbing).
        cache_dir, cache_limit: a node-local folder caching remote videos, bounded by
            ``cache_limit`` bytes at every moment and shared by every worker and rank of
            the node (the shard cache: docs/cache.md). A remote video is downloaded
            whole into it before decoding (PyAV seeks), read from it in later epochs; one
            that does not fit is read remotely as without a cache. Local files never.
        equalize: None, "drop" or "pad": the same number of batches on every rank (DDP);
            needs ``.batch()`` and a known clip count per video.
        clips_per_video: clips each video yields (for ``equalize``): an int for all, or
            one count per video in the order of the list (videos of different lengths
            under a window sampler); inferred from ``clips_at_random_*`` and
            ``clips_at_regular_indices``.
        rank, world_size: override ``torch.distributed``.
        audio: True (each stream's own rate and channels) or ``{"sample_rate": 16000,
            "channels": 1}`` (resampled, downmixed: give both to batch clips of mixed
            sources): each clip carries ``Clip.audio`` (``AudioSamples``: float32
            ``[channels, samples]`` of exactly the clip's span, ``pts_seconds`` of its
            first sample); a batch pads to the longest with ``lengths``. Its bytes count
            against the byte budget like the frames. None: frames only.
        audio_missing: a video without audio: "raise" (``VideoError``, stage
            "video.audio", naming it) or "silence" (zeros, ``missing=True``; needs
            ``sample_rate``).
        decoder: "cpu" (default: FFmpeg's software decoders, swscale) or "cuda" /
            "cuda:N": NVDEC through PyAV's hwaccel, colour conversion and resize on the
            device, clips delivered on it (``streambuf.video.gpu``). Runs in the
            training process only: ``Loader(num_workers=0)``; ``max_bytes`` then bounds
            the clips held on the device.

    Raises:
        ValueError, TypeError: bad arguments (before any worker starts).
        FileNotFoundError: a glob matched nothing.
        ImportError: PyAV (``streambuf[video]``) or, for remote globs, fsspec is missing.
    """
    if not callable(getattr(sampler, "sample", None)):
        raise TypeError(
            f"sampler={sampler!r} has no sample(info, rng) method; use e.g. "
            "streambuf.video.clips_at_random_indices(...)"
        )
    check_choice(layout, name="layout", choices=_LAYOUTS)
    for arg, value in (("width", width), ("height", height)):
        if value is not None:
            check_int(value, name=arg, minimum=1)
    check_int(ffmpeg_threads, name="ffmpeg_threads")  # 0: FFmpeg decides
    check_count_or_auto(threads, name="threads")
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options={storage_options!r} must be a dict or None")
    FailurePolicy(on_error, max_failures, stage=_STAGE)  # validates both
    spec = audio_spec(audio, audio_missing)
    # here, not in the first lane: no CUDA is a ValueError now, and "cuda" is resolved
    # to the caller's current device (lane threads start on device 0)
    device = check_decoder(decoder)
    decoder = "cpu" if device is None else str(device)
    from ..sources.options import check_cache_options

    folder, limit = check_cache_options(cache_dir, cache_limit)
    counts: int | tuple[int, ...] | None = None
    if isinstance(clips_per_video, Sequence):
        counts = tuple(clips_per_video)  # one per video: checked by Sharding
    elif clips_per_video is not None:
        counts = parse_count(clips_per_video, name="clips_per_video")
    elif equalize is not None:
        counts = fixed_clip_count(sampler)
        if counts is None:
            raise ValueError(
                f"equalize={equalize!r} needs the number of clips per video; this sampler's "
                "count depends on each video's length: pass clips_per_video="
            )
    sharding = Sharding(
        shuffle_shards=shuffle_videos,
        seed=seed,
        samples_per_shard=counts,
        equalize=equalize,
        rank=rank,
        world_size=world_size,
        arg_names={"shuffle_shards": "shuffle_videos", "samples_per_shard": "clips_per_video"},
    )
    _import_av()
    urls = [os.fspath(u) for u in expand_urls(videos, storage_options=storage_options)]
    reader = VideoReader(
        sampler=sampler,
        width=width,
        height=height,
        layout=layout,
        ffmpeg_threads=ffmpeg_threads,
        threads=threads,
        on_error=on_error,
        max_failures=max_failures,
        storage_options=dict(storage_options) if storage_options else None,
        cache_dir=folder,
        cache_limit=limit,
        audio=spec,
        decoder=decoder,
        _secrets=secrets_of(storage_options),
    )
    from .._compact import IndexedStrList, StrList

    return Pipeline._of(SequenceSource(IndexedStrList(StrList(urls)), reader=reader), sharding)
