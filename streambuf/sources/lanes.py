"""``stream_shards``: lane threads stream tar shards into one bounded buffer, in process.

The building block under ``shards()``, usable alone: the same lanes
(``streambuf._source.SourceRun`` over a ``TarAccess``, on the package's one
``LaneRunner``), without a ``Pipeline`` or a ``Loader`` around it.

* ``order="round_robin"`` (default): shard ``i`` goes to lane ``i % lanes`` and the window
  delivers lane 0, 1, ..., so the output order is a function of the URL list alone,
  whatever the timing; the byte and item budgets are split per lane (deadlock-free).
* ``order="first_ready"``: a lane takes the next unclaimed shard when it needs one and
  samples come out as they arrive; one pooled budget; order depends on timing.

Sample-level split: with ``stride``/``offset`` each shard contributes only the samples
``islice(samples, offset, None, stride)``; the other samples are parsed and dropped.

Memory: at most ``max_bytes``/``max_items`` of samples, queued or being parsed (each lane
reserves room before it parses its next sample), plus per lane one read block and up to
``readahead_bytes`` of its *next* shard. Errors and shutdown: see ``TarAccess`` and
``streambuf._lanes``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._ledger import Ledger
from .._source import SourceRun
from .._units import check_int, parse_count
from ..buffer import BufferStats
from ..io.opener import IOStats
from .access import TarAccess
from .options import ShardOptions

__all__ = ["ShardStream", "SourceStats", "stream_shards"]


@dataclass(frozen=True)
class SourceStats:
    """Snapshot of a ``ShardStream``.

    Attributes:
        shards_done: shards read to their end. shards_skipped: shards that failed under
            ``on_error="skip"``. samples: samples handed out (only this reader's share
            under ``stride``/``offset``).
        io: request/retry/byte counters (``IOStats``). buffer: the lanes' buffer stats.
    """

    shards_done: int
    shards_skipped: int
    samples: int
    io: IOStats
    buffer: BufferStats | None


class ShardStream:
    """Iterable of samples streamed from tar shards by lane threads (see module docstring).

    Iterate it once (``for sample in ...``), or use ``with``; ``stats()`` any time.
    """

    def __init__(
        self, urls: Sequence[str], options: ShardOptions, *, stride: int = 1, offset: int = 0
    ) -> None:
        if isinstance(urls, str) or not isinstance(urls, Sequence):
            raise TypeError("urls must be a list of URLs; use expand_urls(spec) for a pattern")
        self._stride = parse_count(stride, name="stride")
        self._offset = check_int(offset, name="offset")
        self._urls = [str(u) for u in urls]
        self._options = options
        lanes = max(1, min(options.lane_count, len(self._urls)))
        self._access = TarAccess(
            self._urls, options, lanes=lanes, stride=self._stride, offset=self._offset
        )
        self._run = SourceRun(
            self._access,
            range(len(self._urls)),
            ledger=_Forgetful(),
            lanes=lanes,
            order=options.order,
            adaptive=options.adaptive,
            stride=self._stride,
            offset=self._offset,
            max_items=max(options.max_items, lanes),
            max_bytes=int(options.max_bytes),
            name="shards",
            threads=options.threads,
        )
        self._samples = 0
        self._iter: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._iter is not None:
            raise RuntimeError("a ShardStream can be iterated only once")
        self._iter = iter(self._run)
        try:
            for rec in self._iter:
                self._samples += 1
                yield rec.value
        finally:
            self.close()

    def close(self) -> None:
        """Stop every lane and join the threads (bounded). Idempotent."""
        it, self._iter = self._iter, iter(())
        close = getattr(it, "close", None)
        if close is not None:
            close()
        self._access.close()

    def __enter__(self) -> ShardStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> SourceStats:
        return SourceStats(
            shards_done=self._access.shards_done,
            shards_skipped=self._access.policy.skipped,
            samples=self._samples,
            io=self._access.io.snapshot(),
            buffer=self._run.buffer_stats(),
        )


class _Forgetful(Ledger):
    """A ledger that keeps nothing: a plain stream owes no resumable state."""

    def issued(self, seq: int, pos: Any, hint: Any, settled: Any = None) -> None:
        pass


def stream_shards(
    urls: Sequence[str], /, *, stride: int = 1, offset: int = 0, **options: Any
) -> ShardStream:
    """Stream WebDataset samples from ``urls`` with lane threads (see the module docstring).

    Example::

        urls = expand_urls("s3://bucket/train-{000000..000127}.tar")
        for sample in stream_shards(urls, lanes=3, max_bytes="512MiB",
                                    storage_options={"endpoint_url": ...}):
            ...

    Args:
        urls: the shard URLs/paths, in order (``expand_urls`` makes them from a pattern).
        stride, offset: deliver only ``islice(samples, offset, None, stride)`` of each
            shard (a sample-level split between readers of the same shards).
        options: any of ``ShardOptions`` (the reading options of ``streambuf.shards``:
            ``lanes``, ``max_items``, ``max_bytes``, ``order``, ``max_concurrent_io``,
            ``readahead_bytes``, ``on_error``, ``max_failures``, ``storage_options``,
            ``retries``, ``timeout_s``, ... ``max_shard_bytes``).

    Raises:
        TypeError, ValueError: a bad option (named), here. From iteration: ``ShardError``
        (a shard failed under ``on_error="raise"``), ``TooManyFailures``.
    """
    unknown = set(options) - set(ShardOptions.names())
    if unknown:
        raise TypeError(
            f"stream_shards() got unknown option(s) {sorted(unknown)}; options are "
            f"{', '.join(ShardOptions.names())}"
        )
    return ShardStream(urls, ShardOptions(**options), stride=stride, offset=offset)
