"""``shards``: a ``Pipeline`` over tar shards on local disk, HTTP(S) or S3, read in lanes.

``shards(urls)`` expands the spec (``expand_urls``) in the calling process and returns
``Pipeline(urls, reader=LaneReader(...))``. The pipeline splits shards across rank x
DataLoader worker (``streambuf.sharding``: epoch-seeded order, every sample exactly once);
inside each worker the ``LaneReader`` streams that worker's shards with ``lanes`` threads
(``stream_shards``), so one worker keeps ``lanes`` requests in flight.

Invariants:

* **Exactly once.** Each worker yields ``islice(samples(shard), offset, None, stride)``
  for every shard it was given (a sample-level split when there are fewer shards than
  ranks x workers), so the union over ranks x workers is every sample once. Under
  ``on_error="skip"`` a failed shard contributes its good prefix (no duplicates).
* **Bytes.** Inside a ``Loader`` the lanes get the stage budget the Loader grants each
  worker (``stage_bytes``): the lanes' fixed overhead, ``lanes x (2 x block_bytes +
  readahead_bytes)`` (read buffers and the next shard's first bytes), is taken off it and
  the rest bounds the samples buffered between lanes and the pipeline (at least half of
  ``stage_bytes``). Outside a Loader, ``max_bytes`` bounds that buffer.
* **Picklable.** ``LaneReader`` holds configuration only; threads, the
  ``max_concurrent_io`` semaphore and the buffer are built inside each call (each worker).

Counters: ``shard_stats(pipe)`` (or ``counters.snapshot()``) returns a ``ShardTotals``
summed over every worker that read for this pipeline, published while reading (at least
every ``publish_every_s``) and when a worker's read ends. They live in shared memory, one
slot per DataLoader worker id, each written by one process only (so no lock is needed).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from .._failures import OnError
from .._units import parse_bytes
from ..buffer import Order
from .lanes import SourceStats, stream_shards
from .opener import IOStats
from .urls import UrlSpec, expand_urls

if TYPE_CHECKING:
    from ..pipeline import Pipeline, WorkerContext
    from ..sharding import Equalize

__all__ = ["LaneReader", "ShardCounters", "ShardTotals", "shard_stats", "shards"]

log = logging.getLogger("streambuf")

_FIELDS = ("shards_done", "shards_skipped", "samples", *(f.name for f in fields(IOStats)))
_SLOTS = 64


@dataclass(frozen=True)
class ShardTotals:
    """Counters of a ``shards()`` pipeline, summed over its workers since it was built.

    Attributes:
        shards_done: shard reads that reached the end (a shard split between ``m``
            readers counts ``m`` times). shards_skipped: shard reads that failed under
            ``on_error="skip"``. samples: samples delivered by the lanes.
        io: opens, requests, retries (failed attempts that were retried), bytes and
            discarded bytes (``IOStats``).
    """

    shards_done: int
    shards_skipped: int
    samples: int
    io: IOStats


def _spawning() -> bool:
    from multiprocessing import context

    return context.get_spawning_popen() is not None


class ShardCounters:
    """Totals shared by every process reading for one pipeline (see module docstring).

    Shared memory can only be handed to a process while it is created (DataLoader workers
    by fork or spawn); pickled at any other time, the copy gets private counters.
    """

    def __init__(self) -> None:
        self._raw: Any = multiprocessing.RawArray("q", _SLOTS * len(_FIELDS))

    def add(self, slot: int, stats: SourceStats, previous: SourceStats | None) -> None:
        """Add ``stats - previous`` to ``slot`` (one writer process per slot)."""
        base = (slot % _SLOTS) * len(_FIELDS)
        for k, (new, old) in enumerate(zip(_flat(stats), _flat(previous))):
            if new != old:
                self._raw[base + k] += new - old

    def snapshot(self) -> ShardTotals:
        n = len(_FIELDS)
        sums = [sum(self._raw[s * n + k] for s in range(_SLOTS)) for k in range(n)]
        return ShardTotals(sums[0], sums[1], sums[2], IOStats(*sums[3:]))

    def __getstate__(self) -> dict[str, Any]:
        if _spawning():
            return {"raw": self._raw}
        return {"raw": None, "values": list(self._raw)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._raw = state["raw"] if state["raw"] is not None else state["values"]


def _flat(stats: SourceStats | None) -> list[int]:
    if stats is None:
        return [0] * len(_FIELDS)
    io = stats.io
    return [stats.shards_done, stats.shards_skipped, stats.samples] + [
        getattr(io, f) for f in _FIELDS[3:]
    ]


@dataclass(frozen=True)
class LaneReader:
    """The ``ReadShards`` reader of ``shards()``: configuration only, picklable.

    Called in each worker as ``reader(shards, stride=, offset=, stage_bytes=, ctx=)``;
    see ``stream_shards`` for the fields (``max_concurrent_io`` is a count here: each
    call builds its own semaphore, shared by its lanes).
    """

    lanes: int
    max_items: int
    max_bytes: int
    order: Order
    max_concurrent_io: int | None
    readahead_bytes: int
    on_error: OnError
    max_failures: int | None
    storage_options: Mapping[str, Any] | None
    retries: int
    backoff_s: float
    max_backoff_s: float
    timeout_s: float
    block_bytes: int
    max_member_bytes: int
    max_sample_bytes: int | None
    max_shard_bytes: int | None
    counters: ShardCounters
    publish_every_s: float = 1.0

    def buffer_bytes(self, stage_bytes: int | None, *, lanes: int) -> int:
        """The byte bound of the lanes' buffer for a stage grant (module docstring)."""
        if stage_bytes is None:
            return self.max_bytes
        overhead = lanes * (2 * self.block_bytes + self.readahead_bytes)
        return max(stage_bytes - overhead, stage_bytes // 2, 1)

    def __call__(
        self,
        shards: Sequence[str],
        /,
        *,
        stride: int,
        offset: int,
        stage_bytes: int | None,
        ctx: WorkerContext,
    ) -> Iterator[dict[str, Any]]:
        if not shards:
            return
        lanes = min(self.lanes, len(shards))
        sem = None
        if self.max_concurrent_io is not None:
            sem = threading.BoundedSemaphore(self.max_concurrent_io)
        stream = stream_shards(
            shards,
            lanes=lanes,
            max_items=max(self.max_items, lanes),
            max_bytes=self.buffer_bytes(stage_bytes, lanes=lanes),
            order=self.order,
            max_concurrent_io=sem,
            readahead_bytes=self.readahead_bytes,
            on_error=self.on_error,
            max_failures=self.max_failures,
            storage_options=self.storage_options,
            retries=self.retries,
            backoff_s=self.backoff_s,
            max_backoff_s=self.max_backoff_s,
            timeout_s=self.timeout_s,
            block_bytes=self.block_bytes,
            max_member_bytes=self.max_member_bytes,
            max_sample_bytes=self.max_sample_bytes,
            max_shard_bytes=self.max_shard_bytes,
            stride=stride,
            offset=offset,
        )
        published: SourceStats | None = None
        next_publish = time.monotonic() + self.publish_every_s
        try:
            with stream:
                for sample in stream:
                    yield sample
                    if time.monotonic() >= next_publish:
                        now = stream.stats()
                        self.counters.add(ctx.worker, now, published)
                        published, next_publish = now, time.monotonic() + self.publish_every_s
        finally:
            final = stream.stats()
            self.counters.add(ctx.worker, final, published)
            log.info(
                "streambuf: shards read by rank %d worker %d (epoch %d): %d done, %d skipped, "
                "%d samples, %d requests, %d retries, %d bytes",
                ctx.rank,
                ctx.worker,
                ctx.epoch,
                final.shards_done,
                final.shards_skipped,
                final.samples,
                final.io.requests,
                final.io.retries,
                final.io.bytes,
            )


def shards(
    urls: UrlSpec,
    /,
    *,
    lanes: int = 3,
    storage_options: Mapping[str, Any] | None = None,
    shuffle_shards: bool = True,
    seed: int = 0,
    max_concurrent_io: int | None = None,
    readahead_bytes: int | str = "1MiB",
    max_items: int = 64,
    max_bytes: int | str = "256MiB",
    order: Order = "round_robin",
    on_error: OnError = "raise",
    max_failures: int | None = None,
    samples_per_shard: int | Sequence[int] | None = None,
    equalize: Equalize | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    retries: int = 5,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    timeout_s: float = 30,
    block_bytes: int | str = "1MiB",
    max_member_bytes: int | str = "1GiB",
    max_sample_bytes: int | str | None = None,
    max_shard_bytes: int | str | None = "64GiB",
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
        lanes: shards each worker reads at once (threads).
        storage_options: fsspec options (``endpoint_url``, ``key``, ``secret``, ``anon``).
        shuffle_shards, seed: shard order per epoch, seeded by (seed, epoch).
        max_concurrent_io: requests/reads in flight per worker at most (None: ``lanes``
            plus readahead, i.e. unbounded beyond the lanes).
        readahead_bytes: bytes of a lane's next shard fetched before it is needed (0: off).
        max_items, max_bytes: bounds of the lanes' buffer outside a ``Loader`` (inside one,
            ``max_bytes`` comes from the Loader's budget; see the module docstring).
        order: ``"round_robin"`` (deterministic) or ``"first_ready"`` (no head-of-line
            blocking; order depends on timing).
        on_error, max_failures: ``"raise"`` (default) or ``"skip"`` failed shards, counted
            and logged, at most ``max_failures`` per worker.
        samples_per_shard, equalize: equal batch counts across ranks (see ``Pipeline``).
        rank, world_size: override ``torch.distributed`` (see ``Pipeline``).
        retries, backoff_s, max_backoff_s, timeout_s, block_bytes: ``open_stream`` options.
        max_member_bytes, max_sample_bytes, max_shard_bytes: untrusted-shard limits.

    Returns:
        A ``streambuf.Pipeline``; chain ``.decode()``, ``.map()``, ``.shuffle()``,
        ``.batch()``. ``shard_stats(pipe)`` gives its ``ShardTotals``.

    Raises:
        ValueError, TypeError, FileNotFoundError: a bad spec or option (see
            ``expand_urls``); errors while reading surface from iteration.
    """
    from ..pipeline import Pipeline

    if lanes < 1:
        raise ValueError(f"lanes={lanes} must be >= 1")
    if max_concurrent_io is not None and max_concurrent_io < 1:
        raise ValueError(f"max_concurrent_io={max_concurrent_io} must be >= 1 or None")
    if order not in ("round_robin", "first_ready"):
        raise ValueError(f"order={order!r} must be 'round_robin' or 'first_ready'")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r} must be 'raise' or 'skip'")
    ra = 0 if readahead_bytes == 0 else parse_bytes(readahead_bytes, name="readahead_bytes")
    reader = LaneReader(
        lanes=lanes,
        max_items=max_items,
        max_bytes=parse_bytes(max_bytes, name="max_bytes"),
        order=order,
        max_concurrent_io=max_concurrent_io,
        readahead_bytes=ra,
        on_error=on_error,
        max_failures=max_failures,
        storage_options=dict(storage_options) if storage_options else None,
        retries=retries,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
        timeout_s=timeout_s,
        block_bytes=parse_bytes(block_bytes, name="block_bytes"),
        max_member_bytes=parse_bytes(max_member_bytes, name="max_member_bytes"),
        max_sample_bytes=_opt_bytes(max_sample_bytes, "max_sample_bytes"),
        max_shard_bytes=_opt_bytes(max_shard_bytes, "max_shard_bytes"),
        counters=ShardCounters(),
    )
    return Pipeline(
        expand_urls(urls, storage_options=storage_options),
        reader=reader,
        shuffle_shards=shuffle_shards,
        seed=seed,
        samples_per_shard=samples_per_shard,
        equalize=equalize,
        rank=rank,
        world_size=world_size,
    )


def _opt_bytes(value: int | str | None, name: str) -> int | None:
    return None if value is None else parse_bytes(value, name=name)


def shard_stats(pipeline: Pipeline, /) -> ShardTotals:
    """The ``ShardTotals`` of a pipeline built by ``shards()`` (any fluent descendant).

    Raises:
        TypeError: the pipeline was not built by ``shards()``.
    """
    reader = getattr(pipeline, "_reader", None)
    if not isinstance(reader, LaneReader):
        raise TypeError("shard_stats() needs a pipeline built by streambuf.shards()")
    return reader.counters.snapshot()
