"""``stream_shards``: K lane threads stream tar shards into one ``ShardedBuffer``.

Inside one process, lane ``t`` reads its shards one after the other (open with retries,
parse the tar stream, ``put`` each sample into lane ``t`` of a ``ShardedBuffer``), so the
consumer sees samples interleaved across K shards at once.

* ``order="round_robin"`` (default): shard ``i`` goes to lane ``i % lanes`` and the buffer
  delivers lane 0, 1, ..., so the output order is a function of the URL list alone,
  whatever the timing; the byte and item budgets are split per lane (deadlock-free).
* ``order="first_ready"``: a lane takes the next unclaimed shard when it needs one and
  samples come out as they arrive; one pooled budget; order depends on timing.

Sample-level split: with ``stride``/``offset`` each shard contributes only the samples
``islice(samples, offset, None, stride)`` (index ``i`` in the shard with ``i >= offset``
and ``(i - offset) % stride == 0``); the other samples are parsed and dropped, never put.
``streambuf.shards`` uses this when there are fewer shards than ranks x workers.

Memory: at most ``max_bytes``/``max_items`` of samples in the buffer (oversize rule as in
``ShardedBuffer``), plus per lane one sample being parsed, one read block, and up to
``readahead_bytes`` of the *next* shard: when fewer than ``readahead_bytes`` of the
current shard remain to be received, the lane opens its next shard on a helper thread
and fetches its first ``readahead_bytes`` (hiding the request latency between shards).
``max_concurrent_io`` (a ``threading.BoundedSemaphore`` shared by every lane, including
readahead) caps requests and reads in flight.

Errors: ``on_error="raise"`` hands the first failure to the consumer (``ShardError``
naming the stage and the redacted URL, with a note naming the lane); held samples are
dropped. ``on_error="skip"`` logs and counts the failed shard and the lane goes on with
its next shard; more than ``max_failures`` skips raise ``TooManyFailures``. A shard that
fails part-way keeps its good prefix: samples already put are delivered (a skipped,
truncated shard contributes the samples before the damage, each exactly once).

Shutdown: leaving the loop (``break``, an exception, ``close()``, ``with``) closes the
buffer and aborts in-flight HTTP reads, so lanes stop at once; threads are joined within
``join_timeout_s`` (an fsspec read cannot be interrupted: that daemon thread is logged
and exits when the read returns).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._failures import FailurePolicy, OnError
from .._threads import join_all
from .._units import parse_bytes, parse_count
from ..buffer import BufferStats, Order, ShardedBuffer
from ..errors import BufferClosed, ShardError, add_note
from ..sizing import nbytes
from ._ahead import _Ahead, _Prefixed
from .opener import IOCounters, IOStats, ShardReader, open_stream
from .tar import iter_tar_samples
from .urls import redact, secrets_of

__all__ = ["ShardStream", "SourceStats", "stream_shards"]

log = logging.getLogger("streambuf")
_STAGE = "shards"


@dataclass(frozen=True)
class SourceStats:
    """Snapshot of a ``ShardStream``.

    Attributes:
        shards_done: shards read to their end. shards_skipped: shards that failed
            under ``on_error="skip"``. samples: samples put into the buffer (only this
            reader's share under ``stride``/``offset``).
        io: request/retry/byte counters (``IOStats``). buffer: the buffer's stats.
    """

    shards_done: int
    shards_skipped: int
    samples: int
    io: IOStats
    buffer: BufferStats


class ShardStream:
    """Iterable of samples streamed from tar shards by lane threads (see module docstring).

    Iterate it once (``for sample in ...``), or use ``with``; ``stats()`` any time.
    """

    def __init__(
        self,
        urls: Sequence[str],
        /,
        *,
        lanes: int = 3,
        max_items: int = 64,
        max_bytes: int | str = "256MiB",
        order: Order = "round_robin",
        max_concurrent_io: threading.BoundedSemaphore | None = None,
        readahead_bytes: int | str = 1 << 20,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        timeout_s: float = 30,
        block_bytes: int | str = 1 << 20,
        max_member_bytes: int = 1 << 30,
        max_sample_bytes: int | None = None,
        max_shard_bytes: int | None = 64 << 30,
        sizeof: Callable[[Any], int] = nbytes,
        join_timeout_s: float = 1.0,
        stride: int = 1,
        offset: int = 0,
    ) -> None:
        if stride < 1 or offset < 0:
            raise ValueError(f"stride={stride} must be >= 1 and offset={offset} >= 0")
        self._stride, self._offset = int(stride), int(offset)
        if isinstance(urls, str) or not isinstance(urls, Sequence):
            raise TypeError("urls must be a list of URLs; use expand_urls(spec) for a pattern")
        self._urls = [str(u) for u in urls]
        self._nlanes = max(1, min(parse_count(lanes, name="lanes"), len(self._urls)))
        if readahead_bytes != 0:  # 0 turns readahead off; anything else is a byte size
            readahead_bytes = parse_bytes(readahead_bytes, name="readahead_bytes")
        self._readahead = int(readahead_bytes)
        self._buf: ShardedBuffer[dict[str, Any]] = ShardedBuffer(
            lanes=self._nlanes,
            max_items=max_items,
            max_bytes=max_bytes,
            order=order,
            sizeof=sizeof,
        )
        self._order = order
        self._policy = FailurePolicy(on_error, max_failures, stage=_STAGE)
        self._counters = IOCounters()
        self._open_kw: dict[str, Any] = dict(
            storage_options=storage_options,
            retries=retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            timeout_s=timeout_s,
            block_bytes=parse_bytes(block_bytes, name="block_bytes"),
            max_concurrent_io=max_concurrent_io,
            counters=self._counters,
        )
        self._tar_kw: dict[str, Any] = dict(
            max_member_bytes=max_member_bytes,
            max_sample_bytes=max_sample_bytes,
            max_shard_bytes=max_shard_bytes,
        )
        self._secrets = secrets_of(storage_options)
        self._join_timeout_s = join_timeout_s
        self._lock = threading.Lock()
        self._next_shard = 0
        self._done = self._samples = 0
        self._stop = threading.Event()
        self._current: list[ShardReader | None] = [None] * self._nlanes
        self._ahead: list[_Ahead | None] = [None] * self._nlanes
        self._threads: list[threading.Thread] = []
        self._started = False

    # -- lanes --------------------------------------------------------------------------
    def _open(self, url: str) -> ShardReader:
        return open_stream(url, **self._open_kw)

    def _claim(self, lane: int, j: int) -> int | None:
        """Index of the lane's ``j``-th shard (round robin) or of the next free shard."""
        if self._order == "round_robin":
            i = lane + j * self._nlanes
            return i if i < len(self._urls) else None
        with self._lock:
            i = self._next_shard
            if i >= len(self._urls):
                return None
            self._next_shard += 1
            return i

    def _run(self, lane: int) -> None:
        url = "?"
        try:
            j = 0
            index = self._claim(lane, 0)
            while index is not None and not self._stop.is_set():
                url = self._urls[index]
                nxt = self._read_shard(lane, url, j)
                j += 1
                index = nxt if nxt is not None else self._claim(lane, j)
        except BufferClosed:
            pass  # the consumer closed us: a normal stop
        except BaseException as exc:
            add_note(
                exc,
                f"streambuf: raised in stage {_STAGE!r} on lane {lane} (thread "
                f"{threading.current_thread().name!r}) reading shard {self._redact(url)}",
            )
            self._buf.abort(exc)
        finally:
            ahead, self._ahead[lane] = self._ahead[lane], None
            if ahead is not None:
                ahead.cancel(self._join_timeout_s)
            self._buf.finish(lane)

    def _read_shard(self, lane: int, url: str, j: int) -> int | None:
        """Stream one shard into ``lane``; return the already-claimed next index, if any."""
        next_index: int | None = None
        try:
            ahead, self._ahead[lane] = self._ahead[lane], None
            if ahead is not None and ahead.url == url:
                stream, head = ahead.result()
            else:
                if ahead is not None:
                    ahead.cancel(self._join_timeout_s)
                stream, head = self._open(url), b""
            with stream:
                self._current[lane] = stream
                source = _Prefixed(head, stream) if head else stream
                samples = iter_tar_samples(source, url=self._redact(url), **self._tar_kw)
                for i, sample in enumerate(samples):
                    if self._ahead[lane] is None and next_index is None and self._near_end(stream):
                        next_index = self._claim(lane, j + 1)
                        if next_index is not None:
                            self._ahead[lane] = _Ahead(self, self._urls[next_index], lane)
                    if i < self._offset or (i - self._offset) % self._stride:
                        continue  # another slot's sample (sample-level split)
                    self._buf.put(lane, sample)
                    with self._lock:
                        self._samples += 1
            with self._lock:
                self._done += 1
        except BufferClosed:
            raise
        except Exception as exc:
            if self._stop.is_set():
                raise BufferClosed("stopped") from exc
            self._policy.handle(
                exc, source=self._redact(url), error_type=ShardError, what="shard failed"
            )
        finally:
            self._current[lane] = None
        return next_index

    def _near_end(self, stream: ShardReader) -> bool:
        size = stream.size
        return self._readahead > 0 and size is not None and size - stream.offset <= self._readahead

    def _redact(self, url: str) -> str:
        return redact(url, secrets=self._secrets)

    # -- consumer -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._started:
            raise RuntimeError("a ShardStream can be iterated only once")
        self._started = True
        for lane in range(self._nlanes):
            th = threading.Thread(
                target=self._run, args=(lane,), name=f"streambuf-{_STAGE}-{lane}", daemon=True
            )
            self._threads.append(th)
            th.start()
        try:
            yield from self._buf
        finally:
            self.close()

    def close(self) -> None:
        """Stop every lane and join the threads (bounded by ``join_timeout_s``). Idempotent."""
        self._stop.set()
        self._buf.close()
        for s in [*self._current, *(a.stream for a in self._ahead if a is not None)]:
            if s is not None:
                s.abort()
        join_all(self._threads, timeout_s=self._join_timeout_s, stops_when="when its read returns")

    def __enter__(self) -> ShardStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> SourceStats:
        with self._lock:
            done, samples = self._done, self._samples
        return SourceStats(
            shards_done=done,
            shards_skipped=self._policy.skipped,
            samples=samples,
            io=self._counters.snapshot(),
            buffer=self._buf.stats(),
        )


def stream_shards(
    urls: Sequence[str],
    /,
    *,
    lanes: int = 3,
    max_items: int = 64,
    max_bytes: int | str = "256MiB",
    order: Order = "round_robin",
    max_concurrent_io: threading.BoundedSemaphore | None = None,
    readahead_bytes: int | str = 1 << 20,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int = 5,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    timeout_s: float = 30,
    block_bytes: int | str = 1 << 20,
    max_member_bytes: int = 1 << 30,
    max_sample_bytes: int | None = None,
    max_shard_bytes: int | None = 64 << 30,
    sizeof: Callable[[Any], int] = nbytes,
    join_timeout_s: float = 1.0,
    stride: int = 1,
    offset: int = 0,
) -> ShardStream:
    """Stream WebDataset samples from ``urls`` with lane threads (see the module docstring).

    Example::

        urls = expand_urls("s3://bucket/train-{000000..000127}.tar")
        for sample in stream_shards(urls, lanes=3, max_bytes="512MiB",
                                    storage_options={"endpoint_url": ...}):
            ...

    Args:
        urls: the shard URLs/paths, in order (``expand_urls`` makes them from a pattern).
        lanes: shards read at once (threads); capped at ``len(urls)``.
        max_items, max_bytes: bounds of the buffer between lanes and consumer.
        order: ``"round_robin"`` (deterministic) or ``"first_ready"``.
        max_concurrent_io: a semaphore capping requests/reads in flight across lanes.
        readahead_bytes: bytes of the next shard fetched early (int or "1MiB"; 0: off).
        on_error, max_failures: ``"raise"`` or ``"skip"`` failed shards, at most this many.
        storage_options, retries, backoff_s, max_backoff_s, timeout_s, block_bytes:
            passed to ``open_stream``.
        max_member_bytes, max_sample_bytes, max_shard_bytes: ``iter_tar_samples`` limits.
        sizeof: bytes of one sample for the budget (``streambuf.nbytes``).
        join_timeout_s: how long ``close()`` waits for the lane threads, in total.
        stride, offset: deliver only ``islice(samples, offset, None, stride)`` of each
            shard (a sample-level split between readers of the same shards).

    Returns:
        A ``ShardStream``: iterate it once; ``stats()`` gives a ``SourceStats`` snapshot.

    Raises (from iteration):
        ShardError: a shard failed under ``on_error="raise"`` (stage ``"open"``, ``"read"``
            or ``"tar"``; the URL redacted; a note names the lane).
        TooManyFailures: more than ``max_failures`` shards were skipped.
    """
    return ShardStream(
        urls,
        lanes=lanes,
        max_items=max_items,
        max_bytes=max_bytes,
        order=order,
        max_concurrent_io=max_concurrent_io,
        readahead_bytes=readahead_bytes,
        on_error=on_error,
        max_failures=max_failures,
        storage_options=storage_options,
        retries=retries,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
        timeout_s=timeout_s,
        block_bytes=block_bytes,
        max_member_bytes=max_member_bytes,
        max_sample_bytes=max_sample_bytes,
        max_shard_bytes=max_shard_bytes,
        sizeof=sizeof,
        join_timeout_s=join_timeout_s,
        stride=stride,
        offset=offset,
    )
