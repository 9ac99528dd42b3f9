"""Readahead helpers of ``ShardStream``: open the next shard early, then read it as one."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .opener import ShardReader

if TYPE_CHECKING:
    from .lanes import ShardStream

_STAGE = "shards"


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
    """Open a shard and read its first bytes on a helper thread."""

    def __init__(self, owner: ShardStream, url: str, lane: int) -> None:
        self.url = url
        self.stream: ShardReader | None = None
        self.head = b""
        self.error: BaseException | None = None
        self._owner = owner
        self._thread = threading.Thread(
            target=self._run, name=f"streambuf-{_STAGE}-ahead-{lane}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self.stream = self._owner._open(self.url)
            self.head = self.stream.read(self._owner._readahead)
        except BaseException as exc:
            self.error = exc

    def result(self) -> tuple[ShardReader, bytes]:
        self._thread.join()
        if self.error is not None:
            if self.stream is not None:
                self.stream.close()
            raise self.error
        assert self.stream is not None
        return self.stream, self.head

    def cancel(self, timeout_s: float) -> None:
        stream = self.stream
        if stream is not None:
            stream.abort()
        self._thread.join(timeout_s)
        if self.stream is not None:
            self.stream.close()
