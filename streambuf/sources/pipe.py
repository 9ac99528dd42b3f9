"""``shards``: a ``Pipeline`` over tar shards on local disk, HTTP(S) or S3, read in lanes.

``shards(urls)`` expands the spec (``expand_urls``) in the calling process, checks every
option (``ShardOptions``) and returns ``Pipeline(urls, reader=TarReader(...))``. The
pipeline splits shards across rank x DataLoader worker (``streambuf.sharding``:
epoch-seeded order, every sample exactly once); inside each worker the reader streams
that worker's shards with ``lanes`` threads (``streambuf._source.SourceRun`` over a
``TarAccess``), so one worker keeps ``lanes`` requests in flight.

Invariants:

* **Exactly once.** Each worker yields ``islice(samples(shard), offset, None, stride)``
  for every shard it was given (a sample-level split when there are fewer shards than
  ranks x workers), so the union over ranks x workers is every sample once. Under
  ``on_error="skip"`` a failed shard contributes its good prefix (no duplicates).
* **Positions.** Every sample's position is ``(shard, sample index)`` with the byte offset
  of its first header recorded, so a resumed run reopens each lane's shard at its next
  sample (one ranged request) and fetches the pending samples by offset.
* **Bytes.** The lanes' read buffers, ``lanes x (2 x block_bytes + readahead_bytes)``
  (each lane's read block and the next shard's first bytes; over fsspec also
  ``max_request_bytes``, what one grown request brings: ``FETCH_GROWTH x block_bytes``
  by default), are fixed bytes a worker: a ``Loader`` charges them to its ``max_bytes``
  (``read_bytes``, like ``pack``'s block: out of the batches' room) and hands each
  worker its charge (``WorkerContext.read_bytes``). Where they would take over half of
  ``max_bytes`` they are cut to fit that half (``TarReader.fit``): fsspec's largest
  request first (down to ``block_bytes``: the first request keeps its size), then
  ``block_bytes`` and ``readahead_bytes`` in proportion (the block to ``MIN_BLOCK``);
  the Loader says so when built (``cut_note``: the sizes, and the ``max_bytes`` that
  keeps them as set; a warning where not even the smallest fit). The stage grant (``stage_bytes``)
  bounds the samples buffered between lanes and the pipeline, samples being parsed
  included. Without a charge (outside a Loader's workers: a mix's sources, the
  torchdata nodes) the reads come off the stage grant, which keeps at least half for the
  samples. Outside a Loader, ``max_bytes`` bounds the samples.
* **Picklable.** ``TarReader`` holds configuration only; threads, semaphores and buffers
  are built inside each call (each worker).

Counters: ``pipe.stats().shards`` (or ``shard_stats(pipe)``) is a ``ShardTotals`` summed
over every worker that read for this pipeline, published while reading and when a
worker's read ends (``streambuf._counters.SharedCounters``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from .._counters import THREAD_COUNTS, PipelineStats, SharedCounters, thread_gauge, thread_stats
from .._failures import OnError
from ..buffer import Order
from ..io.cache import CacheStats
from ..io.opener import FETCH_GROWTH, IOStats
from ..io.urls import UrlSpec, expand_urls
from .access import TarAccess
from .options import ShardOptions

if TYPE_CHECKING:
    from .._contracts import ReaderRun, WorkerContext
    from ..pipeline import Pipeline
    from ..sharding import Equalize

__all__ = ["ShardTotals", "TarReader", "shard_stats", "shards"]

log = logging.getLogger("streambuf")

_IO = tuple(f.name for f in fields(IOStats))
_CACHE = tuple(f.name for f in fields(CacheStats))
_FIELDS = ("shards_done", "shards_skipped", "samples", *_IO, *(f"cache_{n}" for n in _CACHE))


@dataclass(frozen=True)
class ShardTotals:
    """Counters of a ``shards()`` pipeline, summed over its workers since it was built.

    Attributes:
        shards_done: shard reads that reached the end (a shard split between ``m``
            readers counts ``m`` times). shards_skipped: shard reads that failed under
            ``on_error="skip"``. samples: samples delivered by the lanes.
        io: opens, requests, retries (failed attempts that were retried), bytes and
            discarded bytes (``IOStats``) of the network (cache hits are not in it).
        cache: hits, misses, writes, evictions, corrupt entries, bytes saved and bytes
            written of the shard cache (``CacheStats``; zeros without ``cache_dir``).
    """

    shards_done: int
    shards_skipped: int
    samples: int
    io: IOStats
    cache: CacheStats = field(default_factory=CacheStats)

    @classmethod
    def of(cls, totals: Mapping[str, int]) -> ShardTotals:
        """From the totals of a ``SharedCounters`` over ``_FIELDS``."""
        return cls(
            totals["shards_done"],
            totals["shards_skipped"],
            totals["samples"],
            IOStats(**{n: totals[n] for n in _IO}),
            CacheStats(**{n: totals[f"cache_{n}"] for n in _CACHE}),
        )


def shard_counters() -> SharedCounters:
    """The counters a ``TarReader`` publishes (one per ``shards()`` pipeline)."""
    return SharedCounters(_FIELDS)


class _Counting(TarAccess):
    """A ``TarAccess`` that publishes its counters to the pipeline's ``SharedCounters``."""

    def __init__(
        self, *args: Any, counters: SharedCounters, worker: int, every_s: float, **kw: Any
    ):
        super().__init__(*args, **kw)
        self._counters, self._worker, self._every_s = counters, worker, every_s
        self._published = dict.fromkeys(_FIELDS, 0)
        self._next_publish = time.monotonic() + every_s
        self._pub_lock = threading.Lock()
        self.samples = 0

    def values(self) -> dict[str, int]:
        io = self.io.snapshot()
        cache = self.cache.stats() if self.cache is not None else CacheStats()
        return {
            "shards_done": self.shards_done,
            "shards_skipped": self.policy.skipped,
            "samples": self.samples,
            **{f: getattr(io, f) for f in _IO},
            **{f"cache_{f}": getattr(cache, f) for f in _CACHE},
        }

    def publish(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._next_publish:
            return
        with self._pub_lock:
            now = self.values()
            self._counters.add(self._worker, {k: v - self._published[k] for k, v in now.items()})
            self._published = now
            self._next_publish = time.monotonic() + self._every_s

    def read(self, lane: int, shard: int, /, *, index: int, hint: Any) -> Iterator[tuple]:
        for item in super().read(lane, shard, index=index, hint=hint):
            self.samples += 1
            self.publish()
            yield item

    def close(self) -> None:
        super().close()
        self.publish(force=True)


MIN_BLOCK = 64 << 10  # the smallest read block a small charge cuts block_bytes to


@dataclass(frozen=True)
class ReadSizes:
    """Read sizes that fit a worker's charge (``TarReader.fit``): the read block, the
    readahead, fsspec's largest request, and the bytes past the charge (0: within)."""

    block: int
    readahead: int
    request: int
    over: int


@dataclass(frozen=True)
class TarReader:
    """The ``SourceReader`` of ``shards()``: configuration only, picklable."""

    options: ShardOptions
    counters: SharedCounters = field(default_factory=shard_counters, compare=False)
    publish_every_s: float = 1.0
    # lanes="auto": the threads each worker runs over its lanes (``stats().threads``)
    thread_counters: SharedCounters | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.options.lanes == "auto" and self.thread_counters is None:
            object.__setattr__(self, "thread_counters", SharedCounters(THREAD_COUNTS))

    def stats(self) -> PipelineStats:
        """What the pipeline's workers read so far (``Pipeline.stats()``); with
        ``lanes="auto"`` the threads over the lanes (``threads``: stage ``"shards"``)."""
        tc = self.thread_counters
        threads = () if tc is None else (thread_stats("shards", tc, self.options.lane_count),)
        return PipelineStats(shards=ShardTotals.of(self.counters.totals()), threads=threads)

    def workers_ended(self) -> None:
        """The workers are gone: none runs lane threads now (their gauges go to 0)."""
        if self.thread_counters is not None:
            self.thread_counters.zero(("threads", "running", "inline"))

    def lanes(self) -> tuple[int, str]:
        """``(lanes, order)`` a slot's shards are read with (``Source.lanes``)."""
        return self.options.lane_count, self.options.order

    def read_bytes(self, urls: Sequence[Any], workers: int = 1) -> int:
        """A worker's read buffers with the options as set (module docstring), for
        ``workers`` workers sharing ``urls``."""
        o = self.options
        return self._reads(
            self.lanes_for(urls, workers),
            _fsspec(urls),
            int(o.block_bytes),
            0 if _local(urls) else int(o.readahead_bytes),
            self._request(int(o.block_bytes)),
        )

    def lanes_for(self, urls: Sequence[Any], workers: int) -> int:
        """The lanes a worker opens at most: ``lanes``, or fewer where its share of the
        shards is smaller (``SourceRun``)."""
        per_worker = -(-len(urls) // max(1, workers))
        return max(1, min(self.options.lane_count, per_worker))

    def _request(self, block: int) -> int:
        cap = self.options.max_request_bytes
        return max(block, int(cap) if cap is not None else FETCH_GROWTH * block)

    @staticmethod
    def _reads(lanes: int, fsspec: bool, block: int, ahead: int, request: int) -> int:
        return lanes * (2 * block + ahead + (request if fsspec else 0))

    def fit(
        self, allot: int, *, lanes: int, fsspec: bool = False, local: bool = False
    ) -> ReadSizes:
        """Read sizes whose buffers fit ``allot`` bytes (module docstring): as set where
        they do; else fsspec's largest request cut first (to ``block_bytes``), then the
        block and the readahead in proportion (the block to ``MIN_BLOCK``). ``over``:
        bytes past ``allot`` at the smallest (0: within)."""
        o = self.options
        block, ahead = int(o.block_bytes), int(o.readahead_bytes)
        request = self._request(block)
        if local:  # local files are not read ahead (``TarAccess``): nothing to count
            sizes = self._fit(allot, lanes, fsspec, block, 0, request)
            return ReadSizes(sizes.block, ahead, sizes.request, sizes.over)
        return self._fit(allot, lanes, fsspec, block, ahead, request)

    def _fit(
        self, allot: int, lanes: int, fsspec: bool, block: int, ahead: int, request: int
    ) -> ReadSizes:
        reads = functools.partial(self._reads, lanes, fsspec)
        if fsspec and reads(block, ahead, request) > allot:
            request = max(block, min(request, allot // max(1, lanes) - 2 * block - ahead))
        if reads(block, ahead, request) > allot:
            scale = allot / reads(block, ahead, block if fsspec else 0)
            block = min(block, max(MIN_BLOCK, int(block * scale)))
            ahead = int(ahead * scale)
            request = block
            while ahead and reads(block, ahead, request) > allot:  # rounding
                ahead = max(0, ahead - max(1, ahead // 16))
        return ReadSizes(block, ahead, request, max(0, reads(block, ahead, request) - allot))

    def cut_note(
        self, urls: Sequence[Any], allot: int, workers: int, other_fixed: int = 0
    ) -> tuple[str, bool] | None:
        """What a Loader's charge of ``allot`` bytes a worker does to the reads (a
        sentence, and whether they still pass it), or None where they are as set;
        ``other_fixed``: the other fixed bytes a worker (``pack``'s block)."""
        o, lanes = self.options, self.lanes_for(urls, workers)
        fsspec, local = _fsspec(urls), _local(urls)
        fit = self.fit(allot, lanes=lanes, fsspec=fsspec, local=local)
        given = (int(o.block_bytes), int(o.readahead_bytes), self._request(int(o.block_bytes)))
        if (fit.block, fit.readahead, fit.request) == given:
            return None
        need = 2 * workers * (self.read_bytes(urls, workers) + other_fixed)
        sizes = f"block_bytes={fit.block}" + ("" if local else f", readahead_bytes={fit.readahead}")
        sizes += f" and requests of at most {fit.request} bytes" if fsspec else ""
        text = (
            f"shards(): max_bytes leaves the {lanes} lanes' read buffers {allot} bytes a "
            f"worker (half of max_bytes over {workers} worker(s), less other fixed "
            f"buffers); they read with {sizes} (set: block_bytes={given[0]}"
            + ("" if local else f", readahead_bytes={given[1]}")
            + (f", requests of {given[2]}" if fsspec else "")
            + f"): smaller reads. max_bytes >= {need} keeps them as set"
        )
        if fit.over:
            text += (
                f"; even at the smallest they need {fit.over} bytes more a worker than "
                "max_bytes allows: raise max_bytes, use fewer lanes or fewer workers"
            )
        return text, fit.over > 0

    def buffer_bytes(self, stage_bytes: int | None, *, lanes: int, fsspec: bool = False) -> int:
        """The byte bound of the lanes' buffer for a stage grant when no Loader charged
        the read buffers: the grant less the reads as set, at least half of it."""
        o = self.options
        if stage_bytes is None:
            return int(o.max_bytes)
        reads = self._reads(
            lanes,
            fsspec,
            int(o.block_bytes),
            int(o.readahead_bytes),
            self._request(int(o.block_bytes)),
        )
        return max(stage_bytes - reads, stage_bytes // 2, 1)

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
        from .._contracts import ReaderRun

        o = self.options
        lanes = o.lane_count
        fsspec = _fsspec(source)
        allot = getattr(ctx, "read_bytes", None)  # a Loader's charge for the reads
        if allot is not None:  # fitted as the Loader counted them (``read_bytes``)
            counted = self.lanes_for(source, getattr(ctx, "num_workers", 1))
            sizes = self.fit(allot, lanes=counted, fsspec=fsspec, local=_local(source))
            o = replace(
                o,
                block_bytes=sizes.block,
                readahead_bytes=sizes.readahead,
                max_request_bytes=sizes.request,
            )
            buffer = int(stage_bytes) if stage_bytes is not None else int(o.max_bytes)
        else:
            buffer = self.buffer_bytes(stage_bytes, lanes=lanes, fsspec=fsspec)
        access = _Counting(
            source,
            o,
            lanes=lanes,
            stride=stride,
            offset=offset,
            counters=self.counters,
            worker=ctx.worker,
            every_s=self.publish_every_s,
        )
        return ReaderRun(
            access=access,
            lanes=lanes,
            order=o.order,
            adaptive=o.adaptive,
            max_items=max(o.max_items, lanes),
            max_bytes=buffer,
            name="shards",
            threads=o.threads,
            on_threads=(
                None
                if self.thread_counters is None
                else thread_gauge(self.thread_counters, ctx.worker)
            ),
        )


def _local(urls: Sequence[Any]) -> bool:
    """The shards are local files (a path or ``file://``)."""
    return bool(len(urls)) and (
        "://" not in str(urls[0]) or str(urls[0]).lower().startswith("file://")
    )


def _fsspec(urls: Sequence[Any]) -> bool:
    """The shards are read through fsspec (not a local path, ``file://`` or http(s))."""
    if not len(urls):
        return False
    scheme = str(urls[0]).split("://", 1)[0].lower() if "://" in str(urls[0]) else "file"
    return scheme not in ("file", "http", "https")


def shards(
    urls: UrlSpec,
    /,
    *,
    shuffle_shards: bool = True,
    seed: int = 0,
    samples_per_shard: int | Sequence[int] | None = None,
    equalize: Equalize | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    lanes: int | str = 3,
    max_items: int = 64,
    max_bytes: int | str = "256MiB",
    order: Order = "round_robin",
    adaptive: bool = True,
    max_concurrent_io: int | None = None,
    readahead_bytes: int | str = "1MiB",
    on_error: OnError = "raise",
    max_failures: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int = 5,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    timeout_s: float = 30.0,
    min_rate_bps: float | None = 1024,
    rate_window_s: float = 10.0,
    block_bytes: int | str = "1MiB",
    max_request_bytes: int | str | None = None,
    max_member_bytes: int | str = "1GiB",
    max_sample_bytes: int | str | None = None,
    max_shard_bytes: int | str | None = "64GiB",
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
) -> Pipeline:
    """A ``Pipeline`` of WebDataset samples from tar shards, read by lanes in each worker.

    Example::

        pipe = (sb.shards("s3://bucket/train-{000000..000127}.tar", lanes=3,
                          storage_options={"endpoint_url": "http://127.0.0.1:9000"})
                  .decode().shuffle(1000).batch(32))
        loader = sb.Loader(pipe, num_workers=4, max_batches=16, max_bytes="4GiB")

    Args:
        urls: a shard spec: local paths, ``file://``, ``http(s)://``, ``s3://`` or any
            fsspec URL; braces, globs, ``::`` and lists (``expand_urls``).
        shuffle_shards, seed: shard order per epoch, seeded by (seed, epoch).
        samples_per_shard, equalize: equal batch counts across ranks (see ``Pipeline``).
        rank, world_size: override ``torch.distributed`` (see ``Pipeline``).
        lanes: shards each worker reads at once (threads), or ``"auto"``: 8 (the count
            fixes the round-robin order, so it is not moved at run time; ``adaptive``
            measures whether the lanes run on threads or in the worker's own thread).
        max_items, max_bytes: bounds of the lanes' buffer outside a ``Loader`` (inside one,
            ``max_bytes`` comes from the Loader's budget; see the module docstring).
        order: ``"round_robin"`` (deterministic) or ``"first_ready"`` (no head-of-line
            blocking; order depends on timing).
        adaptive: read in the worker's own thread while that measures faster than the
            lane threads (cheap local reads: the hand-off costs more than the overlap
            gains), the same order, bounds and resume state; re-measured now and then.
            Local files start inline. False: always the lane threads.
        max_concurrent_io: requests/reads in flight per worker at most (None: ``lanes``
            plus readahead).
        readahead_bytes: bytes of a lane's next shard fetched before it is needed (0: off).
        on_error, max_failures: ``"raise"`` (default) or ``"skip"`` failed shards, counted
            and logged, at most ``max_failures`` per worker.
        storage_options: fsspec options (``endpoint_url``, ``key``, ``secret``, ``anon``).
        retries, backoff_s, max_backoff_s, timeout_s, min_rate_bps, rate_window_s,
            block_bytes, max_request_bytes: ``open_stream`` options (retries resume at the
            byte offset; a connection slower than ``min_rate_bps`` is a fault). Inside a
            ``Loader`` the lanes' read buffers are charged to its ``max_bytes`` (module
            docstring) and cut where they would take over half of it.
        max_member_bytes, max_sample_bytes, max_shard_bytes: untrusted-shard limits.
        cache_dir, cache_limit: a node-local folder to cache remote shards in (shared by
            every worker and rank on the node; written while the shards stream, read
            instead of the network when present) and the most bytes it may hold
            (required with ``cache_dir``; int or "200GiB"). Local files are never cached.
            See docs/cache.md and ``ShardTotals.cache``.

    Returns:
        A ``streambuf.Pipeline``; chain ``.decode()``, ``.map()``, ``.shuffle()``,
        ``.batch()``. ``shard_stats(pipe)`` gives its ``ShardTotals``.

    Raises:
        ValueError, TypeError, FileNotFoundError: a bad spec or option (named, with the
            fix), here, before any worker starts; errors while reading surface from
            iteration.
    """
    from .._compact import StrList
    from .._source_kinds import SequenceSource
    from ..pipeline import Pipeline
    from ..sharding import Sharding

    sharding = Sharding.pick(locals())
    options = ShardOptions.pick(locals())
    reader = TarReader(options)
    source = SequenceSource(
        StrList(expand_urls(urls, storage_options=storage_options)), reader=reader
    )
    return Pipeline._of(source, sharding)


def shard_stats(pipeline: Pipeline, /) -> ShardTotals:
    """The ``ShardTotals`` of a pipeline built by ``shards()`` (any fluent descendant):
    ``pipeline.stats().shards``.

    Raises:
        TypeError: the pipeline was not built by ``shards()``.
    """
    stats = getattr(pipeline, "stats", None)
    totals = stats().shards if callable(stats) else None
    if totals is None:
        raise TypeError("shard_stats() needs a pipeline built by streambuf.shards()")
    return totals
