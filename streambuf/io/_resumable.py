"""Resumable sequential reads: the retry/backoff loop shared by every transport.

``_RawBase`` is a raw binary stream whose ``readinto`` retries transient failures and
reconnects at ``offset`` (the bytes delivered so far); subclasses implement
``_connect(offset)``, ``_read_some(n)`` and ``_disconnect()``. See ``opener`` for the rules.

Progress rule (every transport): ``timeout_s`` bounds each wait for bytes, so a source
that sends a byte now and then never times out. So a connection must also deliver at
least ``min_rate_bps`` bytes per second, measured over each ``rate_window_s`` seconds
spent *inside* ``_read_some`` (time the consumer spends elsewhere, e.g. blocked on a
full buffer, does not count, so backpressure never looks like a slow source). A window
below the rate is a transient fault (``_TooSlow``): the connection is dropped and resumed
at ``offset``. Slow windows count as consecutive failures until a window meets the rate,
so a source that stays slow fails after ``retries`` reconnects, naming the rate.
"""

from __future__ import annotations

import http.client
import io
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from .._counters import Counters
from ..errors import ShardError
from .urls import redact

__all__ = ["IOCounters", "IOStats"]

log = logging.getLogger("streambuf")


@dataclass(frozen=True)
class IOStats:
    """Snapshot of I/O counters.

    Attributes:
        opens: streams opened. requests: requests issued (first GETs, resumes, ranged reads).
        retries: failed attempts that were retried. bytes: bytes delivered to readers.
        discarded_bytes: bytes re-received and dropped (servers that ignore ``Range``).
    """

    opens: int = 0
    requests: int = 0
    retries: int = 0
    bytes: int = 0
    discarded_bytes: int = 0


class IOCounters(Counters[IOStats]):
    """Thread-safe counters shared by streams (e.g. all lanes of one worker):
    ``add(opens=1)``, ``snapshot()`` an ``IOStats``."""

    def __init__(self) -> None:
        super().__init__(IOStats)


class _Fault(Exception):
    """A failure described by its message alone (messages show no type name)."""


class _Missing(_Fault):
    """The object does not exist or access is refused: never retried."""


class _Changed(_Fault):
    """The object changed between two requests of one read: never retried (the bytes
    delivered so far belong to the old version, so no resume can be correct)."""


class _Transient(_Fault):
    """A failure worth retrying (5xx, short body, bad Content-Range)."""


class _TooSlow(_Transient):
    """Bytes flow, but below ``min_rate_bps``: a stalled, trickling or throttled connection."""


_FATAL = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    _Missing,
    _Changed,
)
_TRANSIENT = (OSError, http.client.HTTPException, _Transient, TimeoutError, EOFError)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, _FATAL):
        return False
    if isinstance(exc, _TRANSIENT):
        return True
    if type(exc).__module__.split(".")[0] in ("aiohttp", "botocore", "aiobotocore", "urllib3"):
        response = getattr(exc, "response", None)  # botocore ClientError: a dict
        status = None
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status is None or status >= 500 or status in (408, 429)
    return False


class _RawBase(io.RawIOBase):
    """Sequential reader with resume-at-offset retries; subclasses do the transport."""

    def __init__(
        self,
        url: str,
        *,
        retries: int,
        backoff_s: float,
        max_backoff_s: float,
        timeout_s: float,
        block_bytes: int,
        semaphore: threading.BoundedSemaphore | None,
        counters: IOCounters | None,
        secrets: tuple[str, ...],
        min_rate_bps: float | None = None,
        rate_window_s: float = 10.0,
    ) -> None:
        super().__init__()
        self.url = redact(url, secrets=secrets)
        self.size: int | None = None
        self.offset = 0
        self.start = 0  # where this read began (a resume opens past byte 0)
        self.end: int | None = None  # stop before this byte (a ranged fetch), or None
        self.retries = 0
        self._target = url
        self._max_retries = retries
        self._backoff_s, self._max_backoff_s = backoff_s, max_backoff_s
        self._timeout_s = timeout_s
        self._block = block_bytes
        self._sem = semaphore
        self._counters = counters or IOCounters()
        self._secrets = secrets
        self._cancel = threading.Event()
        self._connected = False
        self._rng = random.Random()
        self._min_rate = min_rate_bps or None
        self._window_s = rate_window_s
        self._win_bytes, self._win_busy_s = 0, 0.0  # this connection's current window
        self._slow = 0  # consecutive windows below the rate
        self.content_type: str | None = None  # the first answer's, where the transport has one

    # transport hooks
    def _connect(self, offset: int) -> None:
        raise NotImplementedError

    def _read_some(self, n: int) -> bytes:
        raise NotImplementedError

    def _disconnect(self) -> None:
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.offset

    def open(self) -> None:
        """First request, eagerly, so a missing object fails here with stage ``"open"``."""
        self._counters.add(opens=1)
        self._attempt(lambda: self._ensure_connected(), stage="open")

    def _ensure_connected(self) -> None:
        if not self._connected:
            self._counters.add(requests=1)
            self._win_bytes, self._win_busy_s = 0, 0.0  # a new connection, a new window
            with self._sem or _NULL:
                self._connect(self.offset)
            self._connected = True

    def _read_some_into(self, view: memoryview) -> int:
        """Read up to ``len(view)`` bytes into ``view``: through ``_read_some`` unless the
        transport reads in place (a local file: one copy of every byte fewer)."""
        data = self._read_some(len(view))
        k = len(data)
        view[:k] = data
        return k

    def _attempt_read(self, view: memoryview) -> int:
        self._ensure_connected()
        with self._sem or _NULL:
            self._check_rate()
            t0 = time.monotonic()
            k = self._read_some_into(view)
            self._win_busy_s += time.monotonic() - t0
            self._win_bytes += k
        if not k and self.size is not None and self.offset < self.size:
            raise http.client.IncompleteRead(b"", self.size - self.offset)
        return k

    def _timed_read(self, n: int) -> bytes:
        """``_read_some(n)`` under the progress rule (module docstring): first check the
        window that is complete, if any, then read and add the time spent to it."""
        self._check_rate()
        t0 = time.monotonic()
        data = self._read_some(n)
        self._win_busy_s += time.monotonic() - t0
        self._win_bytes += len(data)
        return data

    def _check_rate(self) -> None:
        """The progress rule on the window that is complete, if any (module docstring)."""
        if self._min_rate is not None and self._win_busy_s >= self._window_s:
            got, spent = self._win_bytes, self._win_busy_s
            self._win_bytes, self._win_busy_s = 0, 0.0
            if got >= self._min_rate * spent:
                self._slow = 0
            else:
                self._slow += 1
                raise _TooSlow(
                    f"{got} bytes in {spent:.2f} s of reading ({got / spent:.0f} B/s), below "
                    f"min_rate_bps={self._min_rate:g} (a trickling or stalled source; lower "
                    "min_rate_bps, or pass None, if it is really this slow)"
                )

    def _attempt(self, fn: Any, *, stage: str) -> Any:
        failures = 0
        while True:
            if self._cancel.is_set():
                raise ShardError("stream aborted", stage=stage, source=self.url)
            try:
                return fn()
            except BaseException as exc:
                self._drop()
                if self._cancel.is_set():
                    raise ShardError("stream aborted", stage=stage, source=self.url) from exc
                what = redact(exc, secrets=self._secrets)
                if not isinstance(exc, _Fault):
                    what = f"{type(exc).__name__}: {what}"
                if not _is_transient(exc):
                    if isinstance(exc, ImportError) or not isinstance(exc, Exception):
                        raise
                    if isinstance(exc, FileNotFoundError | PermissionError):
                        stage = "open"  # missing or refused: an open failure wherever seen
                    verb = (
                        "cannot open" if stage == "open" else f"read failed at byte {self.offset}"
                    )
                    raise ShardError(f"{verb}: {what}", stage=stage, source=self.url) from exc
                failures += 1
                if isinstance(exc, _TooSlow):  # slow windows in a row, across reads
                    failures = max(failures, self._slow)
                if failures > self._max_retries:
                    raise ShardError(
                        f"gave up at byte offset {self.offset}"
                        + (f" of {self.size}" if self.size is not None else "")
                        + f" after {failures - 1} retries; last error: {what}",
                        stage=stage,
                        source=self.url,
                    ) from exc
                self.retries += 1
                self._counters.add(retries=1)
                delay = min(self._max_backoff_s, self._backoff_s * 2 ** (failures - 1))
                delay *= self._rng.uniform(0.5, 1.0)
                log.info(
                    "streambuf: retry %d of %s at byte %d in %.2f s after %s",
                    failures,
                    self.url,
                    self.offset,
                    delay,
                    what,
                )
                if self._cancel.wait(delay):
                    raise ShardError("stream aborted", stage=stage, source=self.url) from exc

    def _drop(self) -> None:
        self._connected = False
        try:
            self._disconnect()
        except Exception:  # best effort: the connection is already broken
            pass

    def readinto(self, b: Any) -> int:
        n = len(b)
        if self.end is not None:
            n = min(n, self.end - self.offset)
        if n <= 0 or (self.size is not None and self.offset >= self.size):
            return 0
        m = min(n, self._block)
        mv = memoryview(b)
        if mv.c_contiguous:
            view = mv.cast("B")[:m]
            k = self._attempt(lambda: self._attempt_read(view), stage="read")
        else:  # a strided view: read into a temporary, then copy
            tmp = bytearray(m)
            k = self._attempt(lambda: self._attempt_read(memoryview(tmp)), stage="read")
            mv[:k] = tmp[:k]
        self.offset += k
        self._counters.add(bytes=k)
        return k

    def readall(self) -> bytes:
        chunks = []
        buf = bytearray(self._block)
        while n := self.readinto(buf):
            chunks.append(bytes(buf[:n]))
        return b"".join(chunks)

    def abort(self) -> None:
        """Make a blocked or later read fail fast (from another thread). Idempotent."""
        self._cancel.set()
        self._interrupt()

    def _interrupt(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self._drop()
        super().close()


class _NullCtx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


_NULL = _NullCtx()
