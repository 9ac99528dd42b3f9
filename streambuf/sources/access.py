"""``TarAccess``: how lanes read tar shards (an ``Access`` of ``streambuf._source``).

* ``read(lane, shard, index=, hint=)``: open the shard at byte ``hint`` (the start of
  sample ``index``, recorded while streaming; a ranged request for HTTP/S3) and stream
  its samples from there: a resumed shard never re-reads what is behind the consumer.
  Without a hint (a gzip shard, or a new shard) it starts at byte 0 and skips ``index``
  samples by parsing.
* ``fetch(shard, wanted)``: get particular samples back (the pending ones of a resume):
  each run of consecutive samples is one request from its first sample's offset.
* **Readahead**: when fewer than ``readahead_bytes`` of a lane's shard remain, its next
  shard (``prepare``) is opened on a helper thread and its first ``readahead_bytes``
  fetched, hiding the request latency between shards. Not while the lane reads a local
  file or a cache entry (opening the next costs microseconds; the helper thread cost a
  third of the samples/s on local shards).
* **Errors**: ``on_error="raise"``: the failure reaches the consumer as ``ShardError``
  (URL redacted, a note naming the shard); ``"skip"``: logged and counted, the lane goes
  on with its next shard, a failed shard keeping its good prefix; more than
  ``max_failures`` skips raise ``TooManyFailures``.
* **Cache** (``cache_dir``/``cache_limit``): every open of a remote shard goes through
  this reader's ``ShardCache``: an entry when there is a sound one (any offset and
  length: resumes and fetches too), else the network, teed into a new entry when the read
  starts at byte 0 (``streambuf.io.cache``). Local files are never cached.
* ``close()`` aborts every in-flight read (lanes then stop at once).

Counters (shards done/skipped, I/O, cache) are this access's, published to the
pipeline's ``SharedCounters`` by ``publish``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .._failures import FailurePolicy
from ..errors import ShardError, add_note
from ..io.cache import ShardCache, is_cacheable
from ..io.opener import IOCounters, ShardReader, not_data_hint, open_stream
from ..io.urls import redact, secrets_of
from .options import ShardOptions
from .tar import iter_tar_records

__all__ = ["TarAccess"]

log = logging.getLogger("streambuf")
_STAGE = "shards"
# pending samples closer than this are fetched with one request, reading what lies
# between (at ~20-100 MB/s per stream, 1 MiB costs about one request's latency)
_MERGE_GAP = 1 << 20


@contextmanager
def _parsed_from(stream: ShardReader) -> Iterator[None]:
    """A tar that fails to parse from an answer whose ``Content-Type`` is a page (an
    HTML "not found" served with status 200): the error says so, the parse error is
    kept as the cause (``opener.not_data_hint``)."""
    try:
        yield
    except ShardError as exc:
        hint = not_data_hint(stream.content_type) if exc.stage == "tar" else None
        if hint is None:
            raise
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise ShardError(
            f"{hint}; reading it as a tar: {cause}", stage="tar", source=exc.source
        ) from exc


class _Prefixed:
    """``read`` from ``head`` first, then from the stream (a shard read ahead)."""

    def __init__(self, head: bytes, stream: ShardReader) -> None:
        self._head = memoryview(head)
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out = bytes(self._head[:n] if n >= 0 else self._head)
            self._head = self._head[len(out) :]
            return out
        return self._stream.read(n)


class _Ahead:
    """A shard opened early on a helper thread, with its first bytes read."""

    def __init__(self, access: TarAccess, shard: int, index: int, hint: Any) -> None:
        self.key = (shard, index, hint)
        self.stream: ShardReader | None = None
        self.head = b""
        self.error: BaseException | None = None
        self._access = access
        self._thread = threading.Thread(
            target=self._run, name=f"streambuf-{_STAGE}-ahead", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self.stream = self._access._open(self.key[0], self.key[2] or 0)
            self.head = self.stream.read(self._access.options.readahead_bytes)  # type: ignore[arg-type]
        except BaseException as exc:
            self.error = exc

    def take(self) -> tuple[ShardReader, bytes]:
        self._thread.join()
        if self.error is not None:
            if self.stream is not None:
                self.stream.close()
            raise self.error
        assert self.stream is not None
        return self.stream, self.head

    def cancel(self, timeout_s: float = 1.0) -> None:
        if self.stream is not None:
            self.stream.abort()
        self._thread.join(timeout_s)
        if self.stream is not None:
            self.stream.close()


class TarAccess:
    """Reads ``urls[shard]`` for the lanes of one iteration (see the module docstring)."""

    threaded = True

    def is_local(self, shard: int) -> bool:
        """``shard`` is a local file or a cache entry: reading it in the consumer's thread
        is the likely winner (``streambuf._source``: where the lanes start)."""
        url = str(self.urls[shard])
        return not is_cacheable(url) or (self.cache is not None and self.cache.holds(url))

    def __init__(
        self,
        urls: Sequence[str],
        options: ShardOptions,
        *,
        lanes: int,
        stride: int = 1,
        offset: int = 0,
    ) -> None:
        self.urls = urls  # kept as given: a StrList stays compact (streambuf._compact)
        self.options = options
        self.stride, self.offset = stride, offset  # the slot's share of each shard
        self._sem = (
            threading.BoundedSemaphore(options.max_concurrent_io)
            if options.max_concurrent_io is not None
            else None
        )
        self.io = IOCounters()
        self.policy = FailurePolicy(options.on_error, options.max_failures, stage=_STAGE)
        self._secrets = secrets_of(options.storage_options)
        self._lock = threading.Lock()
        self.shards_done = 0
        self._current: list[ShardReader | None] = [None] * max(1, lanes)
        self._next: list[tuple[int, int, Any] | None] = [None] * max(1, lanes)
        self._ahead: list[_Ahead | None] = [None] * max(1, lanes)
        self._closed = False
        self.cache: ShardCache | None = None
        if options.cache_dir is not None and options.cache_limit is not None:
            try:
                self.cache = ShardCache(
                    options.cache_dir,
                    int(options.cache_limit),
                    keep=self.urls,
                    storage_options=options.storage_options,
                    secrets=self._secrets,
                )
            except OSError as exc:  # the cache never fails a read: stream instead
                log.warning(
                    "streambuf: cache_dir %s is unusable (%s); streaming", options.cache_dir, exc
                )

    def _open(self, shard: int, offset: int, length: int | None = None) -> ShardReader:
        """The one place a shard is opened: through the cache when there is one."""
        url = self.urls[shard]

        def remote(offset: int, length: int | None) -> ShardReader:
            return open_stream(
                url,
                offset=offset,
                length=length,
                max_concurrent_io=self._sem,
                counters=self.io,
                **self.options.transport(),
            )

        if self.cache is None or not is_cacheable(url):
            return remote(offset, length)
        return self.cache.open(
            url,
            offset=offset,
            length=length,
            remote=remote,
            block_bytes=int(self.options.block_bytes),
        )

    def name(self, shard: int) -> str:
        return redact(self.urls[shard], secrets=self._secrets)

    def prepare(self, lane: int, shard: int | None, index: int = 0, hint: Any = None) -> None:
        """Lane ``lane`` reads ``shard`` (from ``index``/``hint``) after its current one."""
        self._next[lane] = None if shard is None else (shard, index, hint)

    # -- sequential reads ---------------------------------------------------------------
    def read(self, lane: int, shard: int, /, *, index: int, hint: Any) -> Iterator[tuple]:
        name = self.name(shard)
        start = int(hint) if hint is not None else 0
        try:
            stream, head = self._stream_for(lane, shard, index, hint)
            with stream, _parsed_from(stream):
                self._current[lane] = stream
                src: Any = _Prefixed(head, stream) if head else stream
                records = iter_tar_records(
                    src,
                    url=name,
                    base_offset=start,
                    first_index=index if hint is not None else 0,
                    **self.options.tar(),
                )
                stride, offset = self.stride, self.offset
                for j, h0, h1, sample in records:
                    self._maybe_read_ahead(lane, stream)
                    if j >= index and j >= offset and (j - offset) % stride == 0:
                        # fetch hint: the sample's byte range; resume hint: where it ends
                        yield j, (None if h0 is None else [h0, h1]), h1, sample
            with self._lock:
                self.shards_done += 1
        except Exception as exc:
            if self._closed:
                return
            add_note(exc, f"streambuf: while reading shard {name}")
            self.policy.handle(exc, source=name, error_type=ShardError, what="shard failed")
        finally:
            self._current[lane] = None

    def _stream_for(
        self, lane: int, shard: int, index: int, hint: Any
    ) -> tuple[ShardReader, bytes]:
        ahead, self._ahead[lane] = self._ahead[lane], None
        if ahead is not None:
            if ahead.key == (shard, index, hint):
                return ahead.take()
            ahead.cancel()
        return self._open(shard, int(hint) if hint is not None else 0), b""

    def _maybe_read_ahead(self, lane: int, stream: ShardReader) -> None:
        ra = int(self.options.readahead_bytes)
        nxt = self._next[lane]
        if not ra or nxt is None or self._ahead[lane] is not None or stream.size is None:
            return
        if stream.local:  # a local file or a cache entry: the next is likely one too, and
            return  # a helper thread per shard cost a third of the read rate (#25)
        if stream.size - stream.offset <= ra:
            self._ahead[lane] = _Ahead(self, *nxt)
            self._next[lane] = None

    # -- fetching particular samples ----------------------------------------------------
    def fetch(self, shard: int, wanted: list[tuple[int, Any]], /) -> Iterator[tuple[int, Any]]:
        """The samples ``wanted`` (``(index, [start, end])``): samples less than
        ``_MERGE_GAP`` apart are one bounded ranged request (reading what lies between);
        without byte ranges (gzip), one read from the start that skips the others."""
        name = self.name(shard)
        wanted = sorted(wanted, key=lambda w: w[0])
        if any(h is None for _, h in wanted):
            want = {i for i, _ in wanted}
            with self._open(shard, 0, None) as stream, _parsed_from(stream):
                records = iter_tar_records(
                    stream, url=name, limit=wanted[-1][0] + 1, **self.options.tar()
                )
                for j, _, _, sample in records:
                    if j in want:
                        yield j, sample
            return
        runs: list[list[tuple[int, Any]]] = []
        for index, hint in wanted:  # one request per run; small gaps are read through
            if runs and int(hint[0]) - int(runs[-1][-1][1][1]) <= _MERGE_GAP:
                runs[-1].append((index, hint))
            else:
                runs.append([(index, hint)])
        for run in runs:
            want = {i for i, _ in run}
            start, end = int(run[0][1][0]), int(run[-1][1][1])
            with self._open(shard, start, end - start) as stream, _parsed_from(stream):
                records = iter_tar_records(
                    stream,
                    url=name,
                    base_offset=start,
                    first_index=run[0][0],
                    limit=run[-1][0] - run[0][0] + 1,
                    **self.options.tar(),
                )
                for j, _, _, sample in records:
                    if j in want:
                        yield j, sample

    def close(self) -> None:
        """Abort every in-flight read (called from the consumer's thread)."""
        self._closed = True
        for s in list(self._current):
            if s is not None:
                s.abort()
        for i, a in enumerate(self._ahead):
            if a is not None:
                a.cancel()
                self._ahead[i] = None
