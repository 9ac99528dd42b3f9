"""``clips(videos, sampler=...)``: a ``Pipeline`` of clips decoded from many videos.

Data flow inside one DataLoader worker (or the main process without workers)::

    its share of the videos ──► ``threads`` lane threads, lane t decodes videos t, t+K, ...
        (open: local path, or fsspec file object; decode_clips: probe, sample, decode)
    ──► ShardedBuffer(lanes=K, round_robin, max_bytes=stage budget) ──► later stages

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
  before decoding it and the reservation is released when the clip leaves the buffer
  (``_budget.LaneBudget``). A lane holding nothing may always build one clip, so a clip
  larger than a lane's slice is built and queued alone. Not counted: one converted frame
  per lane, the already-built part of a next clip that overlaps the current one, and
  FFmpeg's decoder buffers.
* **Errors.** ``on_error="raise"``: the first failure reaches the consumer as a
  ``VideoError`` naming the file and stage, with a note naming the lane; clips held are
  dropped. ``"skip"``: the video is logged and counted (its clips before the damage are
  kept) and the lane goes on; more than ``max_failures`` skips per worker raise
  ``TooManyFailures``.
* **Shutdown.** Closing the iterator (end, ``break``, an exception, Loader shutdown)
  closes the buffer and the reservations; lanes stop at their next reservation or put,
  close their containers and files, and are joined (bounded by ``join_timeout_s``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from .._failures import FailurePolicy, OnError
from .._threads import join_all
from .._units import parse_count
from ..buffer import ShardedBuffer
from ..errors import BufferClosed, VideoError, add_note
from ..pipeline import Pipeline, WorkerContext
from ..sharding import Equalize
from ..sizing import nbytes
from ..sources.urls import UrlSpec, expand_urls, redact, secrets_of
from ._budget import LaneBudget
from .decode import _LAYOUTS, Clip, DecodeStats, Layout, decode_clips
from .probe import _import_av
from .samplers import ClipSampler

__all__ = ["clips"]

log = logging.getLogger("streambuf")

_DEFAULT_STAGE_BYTES = 256 << 20  # the buffer's bound outside a Loader
_ITEMS_PER_LANE = 4
_STAGE = "video"


def _is_remote(url: str) -> bool:
    head, sep, _ = url.partition("://")
    return bool(sep) and head.lower() != "file" and "/" not in head


def open_source(url: str, storage_options: Mapping[str, Any] | None) -> str | IO[bytes]:
    """A local path as is; any other URL as a seekable fsspec file object (caller closes).

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
    f: IO[bytes] = fsspec.open(url, "rb", **dict(storage_options or {})).open()
    return f


@dataclass(frozen=True)
class _Subset:
    """The clips of ``sampler`` at positions ``offset, offset + stride, ...``."""

    sampler: ClipSampler
    stride: int
    offset: int

    def sample(self, info: Any, rng: Any, /) -> list[list[int]]:
        return self.sampler.sample(info, rng)[self.offset :: self.stride]


@dataclass(frozen=True)
class VideoReader:
    """The ``Pipeline`` reader of ``clips()`` (see ``streambuf.pipeline.ReadShards``).

    Shards are ``(index, url)`` pairs; called inside each worker with that worker's share.
    """

    sampler: ClipSampler
    width: int | None = None
    height: int | None = None
    layout: Layout = "TCHW"
    ffmpeg_threads: int = 1
    threads: int = 2
    on_error: OnError = "raise"
    max_failures: int | None = None
    storage_options: Mapping[str, Any] | None = None
    join_timeout_s: float = 2.0
    default_bytes: int = _DEFAULT_STAGE_BYTES
    _secrets: tuple[str, ...] = field(default=(), repr=False)

    def __call__(
        self,
        shards: Sequence[tuple[int, str]],
        /,
        *,
        stride: int,
        offset: int,
        stage_bytes: int | None,
        ctx: WorkerContext,
    ) -> Iterator[Clip]:
        if not shards:
            return
        run = _Run(self, min(self.threads, len(shards)), stride, offset, stage_bytes, ctx)
        yield from run.iterate(shards)


class _Run:
    """One call of a ``VideoReader``: lane threads, their buffer and byte reservations."""

    def __init__(
        self,
        reader: VideoReader,
        lanes: int,
        stride: int,
        offset: int,
        stage_bytes: int | None,
        ctx: WorkerContext,
    ) -> None:
        self.r = reader
        self.lanes = lanes
        max_bytes = stage_bytes or reader.default_bytes
        # items are (lane, size, clip): the consumer releases the lane's reservation
        self.buf: ShardedBuffer[tuple[int, int, Clip]] = ShardedBuffer(
            lanes=lanes,
            max_items=_ITEMS_PER_LANE * lanes,
            max_bytes=max_bytes,
            order="round_robin",
            sizeof=lambda item: item[1],
        )
        self.budget = LaneBudget(lanes, max_bytes)
        self.policy = FailurePolicy(reader.on_error, reader.max_failures, stage=_STAGE)
        self.stop = threading.Event()
        self.split = (stride, offset)
        self.sampler: ClipSampler = (
            reader.sampler if stride == 1 else _Subset(reader.sampler, stride, offset)
        )
        self.ctx = ctx
        self.clip_bytes = 0  # the largest clip so far: the reservation for the next one

    def iterate(self, shards: Sequence[tuple[int, str]]) -> Iterator[Clip]:
        workers = [
            threading.Thread(
                target=self._lane,
                args=(lane, shards[lane :: self.lanes]),
                name=f"streambuf-{_STAGE}-{lane}",
                daemon=True,
            )
            for lane in range(self.lanes)
        ]
        for th in workers:
            th.start()
        try:
            for lane, size, clip in self.buf:
                self.budget.release(lane, size)
                yield clip
        finally:
            self.stop.set()
            self.budget.close()
            self.buf.close()
            join_all(workers, timeout_s=self.r.join_timeout_s, stops_when="at its next frame")

    def _lane(self, lane: int, videos: Sequence[tuple[int, str]]) -> None:
        name = "?"
        stats = DecodeStats()
        try:
            for index, url in videos:
                if self.stop.is_set():
                    break
                name = redact(url, secrets=self.r._secrets)
                self._read_one(lane, index, url, name, stats)
        except BufferClosed:
            pass  # the consumer closed us: a normal stop
        except BaseException as exc:
            add_note(
                exc,
                f"streambuf: raised in stage {_STAGE!r} on lane {lane} (thread "
                f"{threading.current_thread().name!r}) decoding video {name}",
            )
            self.buf.abort(exc)
        finally:
            self.buf.finish(lane)

    def _read_one(self, lane: int, index: int, url: str, name: str, stats: DecodeStats) -> None:
        try:
            source = open_source(url, self.r.storage_options)
        except ImportError:
            raise
        except Exception as exc:
            err = VideoError(
                f"cannot open video: {type(exc).__name__}: {redact(exc, secrets=self.r._secrets)}",
                stage="video.open",
                source=name,
            )
            stats.failures += 1
            self.policy.handle(err, source=name, error_type=VideoError)
            return
        stride, offset = self.split
        gen = decode_clips(
            source,
            sampler=self.sampler,
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
        )
        try:
            while True:
                # reserve before decoding: the clip being built counts in the lane's slice
                estimate = self.clip_bytes or self.budget.slices[lane]
                self.budget.reserve(lane, estimate)
                try:
                    clip = next(gen)
                except BaseException:  # StopIteration included
                    self.budget.release(lane, estimate)
                    raise
                size = nbytes(clip)
                self.budget.adjust(lane, size - estimate)
                self.clip_bytes = max(self.clip_bytes, size)
                if stride != 1:  # back to the position in the full sampler's list
                    clip.clip_index = offset + stride * int(clip.clip_index)
                self.buf.put(lane, (lane, size, clip))
        except StopIteration:
            pass
        finally:
            gen.close()
            if not isinstance(source, str):
                source.close()


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
    threads: int = 2,
    seed: int = 0,
    shuffle_videos: bool = True,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    equalize: Equalize | None = None,
    clips_per_video: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
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
        threads: videos decoded concurrently per worker (lane threads).
        seed: seeds the video order and the samplers (with the epoch).
        shuffle_videos: permute the video order every epoch.
        on_error, max_failures: "raise" (default) or "skip" bad videos, at most this many
            per worker.
        storage_options: passed to ``fsspec.open`` (and to fsspec when globbing).
        equalize: None, "drop" or "pad": the same number of batches on every rank (DDP);
            needs ``.batch()`` and a known clip count per video.
        clips_per_video: clips each video yields (for ``equalize``); inferred from
            ``clips_at_random_*`` and ``clips_at_regular_indices``.
        rank, world_size: override ``torch.distributed``.

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
    if layout not in _LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {_LAYOUTS}")
    for arg, value in (("width", width), ("height", height)):
        if value is not None and value <= 0:
            raise ValueError(f"{arg}={value} must be > 0, or None for the coded size")
    if ffmpeg_threads < 0:
        raise ValueError(f"ffmpeg_threads={ffmpeg_threads} must be >= 0 (0: FFmpeg decides)")
    parse_count(threads, name="threads")
    FailurePolicy(on_error, max_failures, stage=_STAGE)  # validates both
    if clips_per_video is not None:
        parse_count(clips_per_video, name="clips_per_video")
    elif equalize is not None:
        clips_per_video = fixed_clip_count(sampler)
        if clips_per_video is None:
            raise ValueError(
                f"equalize={equalize!r} needs the number of clips per video; this sampler's "
                "count depends on each video's length: pass clips_per_video="
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
        _secrets=secrets_of(storage_options),
    )
    return Pipeline(
        list(enumerate(urls)),
        reader=reader,
        shuffle_shards=shuffle_videos,
        seed=seed,
        samples_per_shard=clips_per_video,
        equalize=equalize,
        rank=rank,
        world_size=world_size,
    )
