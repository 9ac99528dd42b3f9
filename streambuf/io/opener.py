"""``open_stream``: read one shard sequentially, retrying and resuming at the byte offset.

Three transports, chosen by the URL:

* a local path or ``file://``: plain ``open`` (no retries: local errors are not transient;
  so a read slower than ``min_rate_bps``, e.g. from a hung network mount, fails at once).
* ``http://``/``https://``: the standard library (``urllib.request``), one streaming GET
  per connection. Chosen over fsspec's HTTP filesystem because resuming needs control
  fsspec does not give: after a dropped connection, a 5xx or a timeout we send
  ``Range: bytes=<offset>-`` and check that the ``206`` answer's ``Content-Range`` starts
  exactly at ``offset`` (a server that ignores ``Range`` and answers ``200`` is handled by
  discarding the first ``offset`` bytes, logged, so nothing is ever delivered twice).
  A resume sends ``If-Range`` with the first answer's strong ``ETag`` (else its
  ``Last-Modified``); an answer from another version of the object (validator or size
  differs) raises ``ShardError`` stage ``"read"`` at once, "the object changed while it was
  being read": bytes of two versions are never mixed.
  A body shorter than its ``Content-Length`` is an error (``IncompleteRead``), never a
  silent end. ``user:password@`` in the URL becomes an ``Authorization: Basic`` header;
  proxies and redirects follow urllib's rules (``http_proxy``/``no_proxy``).
* any other protocol (``s3://``, ``gs://``, ...): fsspec (``pip install streambuf[remote]``).
  Each read is one ranged GET of at most ``block_bytes`` at the current offset (the file
  is opened with ``cache_type="none"``), so a failed read is simply re-issued at the same
  offset on a fresh file object. ``storage_options`` go to the filesystem
  (``endpoint_url``, ``key``, ``secret``, ``anon``, ...). s3fs also retries some errors
  itself (``S3FileSystem.retries``); those attempts do not show in ``retries``.

Invariants: bytes come out in order, exactly once; ``offset`` counts the bytes delivered
so far; a retry never restarts from byte 0. Transient errors (5xx, 408, 429, reset or
dropped connections, timeouts, short bodies, a connection slower than ``min_rate_bps``
over ``rate_window_s`` of reading: see ``_resumable``) are retried up to ``retries`` times *in a
row* (the count restarts once bytes flow again) with exponential backoff and jitter. A
missing object (404/410, ``NoSuchKey``, ``FileNotFoundError``) or a refusal (401/403)
raises ``ShardError`` at once, stage ``"open"``. Every message is passed through
``redact`` (credentials and sensitive ``storage_options`` values never appear).
"""

from __future__ import annotations

import io
import math
import os
import threading
from collections.abc import Mapping
from typing import Any

from .._units import parse_bytes, parse_optional_bytes
from ._http import _HTTPRaw
from ._resumable import IOCounters, IOStats, _RawBase
from .urls import secrets_of

__all__ = ["IOCounters", "IOStats", "ShardReader", "not_data_hint", "open_stream"]

_PAGES = ("application/json", "application/xml", "application/xhtml+xml", "application/problem")


def not_data_hint(content_type: str | None) -> str | None:
    """For a read that failed to parse: a sentence saying the server answered a page
    (``text/*``, HTML, JSON, XML: an error or login page served with status 200 for a
    missing object), or None when the answer's type says nothing of the kind."""
    if not content_type:
        return None
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind.startswith("text/") or kind.startswith(_PAGES):
        return (
            f"the server answered Content-Type {kind}, not a tar: is the URL right? (a "
            "missing object served as a page with status 200)"
        )
    return None


class _FsspecRaw(_RawBase):
    """fsspec (``s3://``, ``gs://``, ...): each read is one ranged request, so requests
    grow: ``block_bytes`` first (the first sample arrives as soon as from one block),
    doubling while the stream is read on, up to ``max_request_bytes`` (by default
    ``FETCH_GROWTH x block_bytes``; a 1 GiB
    shard over S3 is ~130 requests, not 1024, each paying the request latency once);
    what is left of the object (or range) is taken in one request once it fits in a
    full-grown one, so an object of at most ``FETCH_GROWTH x block_bytes`` (8 MiB by
    default) is one GET, like webdataset's (s3fs costs ~3 ms of CPU per request);
    what a request brought and the reader has not taken yet waits here (counted by the
    shard reader's stage overhead, ``sources.pipe``)."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None,
        max_request: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(url, **kw)
        self._options = dict(storage_options or {})
        self._fs: Any = None
        self._path = ""
        self._f: Any = None
        self._got: memoryview = memoryview(b"")  # fetched, not yet read
        self._want = self._block
        # the largest request (what one brings waits here until read)
        self._cap = max(self._block, int(max_request or FETCH_GROWTH * self._block))

    def _connect(self, offset: int) -> None:
        if self._fs is None:
            try:
                import fsspec
            except ImportError as exc:
                raise ImportError(
                    f"reading {self.url.split('://')[0]}:// URLs needs fsspec (and s3fs for "
                    "s3://): pip install streambuf[remote]"
                ) from exc
            self._fs, self._path = fsspec.core.url_to_fs(self._target, **self._options)
        f = self._fs.open(self._path, "rb", block_size=self._block, cache_type="none")
        self.size = f.size
        f.seek(offset)
        self._f = f
        self._got = memoryview(b"")
        self._want = self._block

    def _read_some(self, n: int) -> Any:
        if not self._got:
            want = self._want
            stop = self.end if self.end is not None else self.size
            if stop is not None:  # never request past a bounded range or the object
                rest = stop - self.offset
                # what is left fits in one full-grown request: take it in one (a small
                # object is one GET, paying the request's latency and CPU once)
                want = rest if rest <= self._cap else min(want, rest)
            self._got = memoryview(bytes(self._f.read(max(want, n))))
            self._want = min(2 * self._want, self._cap)
        out, self._got = self._got[:n], self._got[n:]
        return out

    def _disconnect(self) -> None:
        self._got = memoryview(b"")  # a retry resumes at ``offset``: what was read
        f, self._f = self._f, None
        if f is not None:
            f.close()


class _LocalRaw(_RawBase):
    local = True

    def _connect(self, offset: int) -> None:
        path = (
            self._target[len("file://") :] if self._target.startswith("file://") else self._target
        )
        self._file = open(path, "rb", buffering=0)
        self.size = os.fstat(self._file.fileno()).st_size
        self._file.seek(offset)

    def _read_some(self, n: int) -> bytes:
        return self._file.read(n) or b""

    def _read_some_into(self, view: memoryview) -> int:
        return self._file.readinto(view) or 0

    def _disconnect(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()


FETCH_GROWTH = 8  # an fsspec stream's requests grow to this many block_bytes


class ShardReader(io.BufferedReader):
    """The buffered binary stream ``open_stream`` returns.

    Attributes (read-only): ``url`` (redacted), ``size`` (bytes, or None if unknown),
    ``offset`` (bytes received from the source so far, >= ``tell()``), ``retries``.
    ``abort()`` makes a blocked read fail fast from another thread.
    """

    raw: _RawBase

    @property
    def url(self) -> str:
        return self.raw.url

    @property
    def size(self) -> int | None:
        return self.raw.size

    @property
    def offset(self) -> int:
        return self.raw.offset

    @property
    def retries(self) -> int:
        return self.raw.retries

    @property
    def local(self) -> bool:
        """True when the bytes come from a local file (a path, ``file://``, a cache
        entry): opening another costs microseconds, so nothing is read ahead."""
        return bool(getattr(self.raw, "local", False))

    @property
    def content_type(self) -> str | None:
        """The server's ``Content-Type`` (http(s)); None where there is none."""
        return getattr(self.raw, "content_type", None)

    def abort(self) -> None:
        self.raw.abort()


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def open_stream(
    url: str | os.PathLike[str],
    /,
    *,
    storage_options: Mapping[str, Any] | None = None,
    retries: int = 5,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    timeout_s: float = 30,
    block_bytes: int | str = 1 << 20,
    max_concurrent_io: threading.BoundedSemaphore | None = None,
    counters: IOCounters | None = None,
    min_rate_bps: float | None = 1024,
    rate_window_s: float = 10.0,
    offset: int = 0,
    length: int | None = None,
    max_request_bytes: int | str | None = None,
) -> ShardReader:
    """Open ``url`` for sequential reading with retries that resume at the byte offset.

    Args:
        url: local path, ``file://``, ``http(s)://`` or any fsspec URL.
        offset: the byte to start at (a ranged request for remote objects).
        length: read at most this many bytes from ``offset`` (a bounded ranged request:
            fetching one sample costs its bytes, not the rest of the shard); None: to
            the end.
        storage_options: fsspec filesystem options (``endpoint_url``, ``key``, ``secret``,
            ``anon``...); values of sensitive keys are redacted from every message.
        retries: consecutive failed attempts allowed without progress (>= 0).
        backoff_s, max_backoff_s: the delay before retry k is
            ``min(max_backoff_s, backoff_s * 2**(k-1))`` times a jitter in [0.5, 1].
        timeout_s: socket timeout (connect, and each wait for bytes) for http(s).
        block_bytes: read size (int or "8MiB"); for fsspec URLs, the size of the first
            ranged GET (the next ones double, up to ``max_request_bytes``).
        max_request_bytes: for fsspec URLs, the largest ranged GET (what one brings is
            held until it is read); None: ``FETCH_GROWTH`` (8) x ``block_bytes``. An
            object (or range) that fits in one is one GET.
        max_concurrent_io: held while a request or a read is in flight (shared by lanes).
        counters: where to count opens, requests, retries and bytes (e.g. shared by lanes).
        min_rate_bps: the slowest a connection may deliver, in bytes (not bits) per
            second, measured over each ``rate_window_s`` seconds spent waiting for it
            (``timeout_s`` alone lets a source that sends a byte now and then hold a lane
            for hours). A slower window drops the connection and resumes at the offset,
            counted as a retry; ``retries`` slow windows in a row give up. 0 or None:
            no rate rule. The default, 1 KiB/s, is a liveness rule, not a performance
            one: ~100x below a connection of a heavily shared link, and a shard at that
            rate takes days; a false alarm costs one reconnect.
        rate_window_s: the window of reading time (> 0) over which the rate is
            measured: long enough to average out TCP stalls and slow start.

    Returns:
        A ``ShardReader`` (a binary ``io.BufferedReader``); close it (or use ``with``).

    Raises:
        ShardError: stage ``"open"`` for a missing or forbidden object (no retries) or
            when the first request kept failing; stage ``"read"`` (from ``read``) once
            retries are exhausted, naming the offset and the last error (for a slow
            source, the rate observed), or at once when the object changed mid-read.
        ImportError: fsspec/s3fs missing for a remote protocol (names the extra).
    """
    if retries < 0:
        raise ValueError(f"retries={retries!r} must be >= 0")
    if timeout_s <= 0 or backoff_s < 0 or max_backoff_s < 0:
        raise ValueError("timeout_s must be > 0 and backoff_s, max_backoff_s >= 0")
    if min_rate_bps is not None and not (_finite(min_rate_bps) and min_rate_bps >= 0):
        raise ValueError(
            f"min_rate_bps={min_rate_bps!r} must be a number of bytes per second >= 0 "
            "(0 or None turns the rate rule off)"
        )
    if not (_finite(rate_window_s) and rate_window_s > 0):
        raise ValueError(f"rate_window_s={rate_window_s!r} must be a number of seconds > 0")
    block = parse_bytes(block_bytes, name="block_bytes")
    max_request = parse_optional_bytes(max_request_bytes, name="max_request_bytes")
    target = os.fspath(url)
    secrets = secrets_of(storage_options)
    kw: dict[str, Any] = dict(
        retries=retries,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
        timeout_s=timeout_s,
        block_bytes=block,
        semaphore=max_concurrent_io,
        counters=counters,
        secrets=secrets,
        min_rate_bps=min_rate_bps,
        rate_window_s=rate_window_s,
    )
    proto = target.split("://", 1)[0].lower() if "://" in target else "file"
    raw: _RawBase
    if proto == "file":
        raw = _LocalRaw(target, **{**kw, "retries": 0})
    elif proto in ("http", "https"):
        raw = _HTTPRaw(target, **kw)
    else:
        raw = _FsspecRaw(target, storage_options=storage_options, max_request=max_request, **kw)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset={offset!r} must be an int >= 0")
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int) or length < 1
    ):
        raise ValueError(f"length={length!r} must be an int >= 1 or None")
    return open_range(raw, offset, length, block)


def open_range(raw: Any, offset: int, length: int | None, block: int) -> ShardReader:
    """``raw`` (a resumable raw stream, not yet open) positioned at ``offset`` for
    ``length`` bytes (None: to the end), opened (closed again if opening fails) and
    buffered in a ``ShardReader``; the one place a ranged read starts."""
    raw.offset = raw.start = offset
    raw.end = None if length is None else offset + length
    try:
        raw.open()
    except BaseException:
        raw.close()
        raise
    return ShardReader(raw, buffer_size=block)
