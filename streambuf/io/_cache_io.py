"""The pieces under ``ShardCache`` (``streambuf.io.cache``): descriptors that hold
cache locks and are never left locked in a forked child, the streams (a remote stream
teed into an entry, an entry read like a shard) and entry checks.
Invariants: see ``streambuf.io.cache``."""

from __future__ import annotations

import contextlib
import io
import os
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from ._resumable import IOCounters, _RawBase
from .opener import ShardReader

DRAIN_BYTES = 1 << 16  # this close to the end, the rest is received at once (tar trailer)
_CRC_CHUNK = 1 << 20


def _read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""  # no boot id: every process checks each entry's crc32 once


BOOT = _read_boot_id()
# file versions this process has checked: (dev, inode, size, mtime_ns, ctime_ns, crc32)
VERIFIED: set[tuple[int, ...]] = set()


# -- descriptors that hold locks (see "Locks stay with their process") ---------------------
_FDS: set[int] = set()  # changed only under _FORK_LOCK, which a fork holds across itself
_FORK_LOCK = threading.Lock()


def open_fd(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` for a descriptor that may hold a flock (registered until ``close_fd``)."""
    with _FORK_LOCK:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        _FDS.add(fd)
    return fd


def close_fd(fd: int) -> None:
    with _FORK_LOCK:
        _FDS.discard(fd)
        os.close(fd)


def _after_fork_in_child() -> None:
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()
    if _FDS:
        null = os.open(os.devnull, os.O_RDONLY)
        for fd in _FDS:  # the number stays valid, the lock is the parent's alone
            os.dup2(null, fd)
        os.close(null)
    # the descriptors stay registered: whoever closes them later goes through close_fd


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=lambda: _FORK_LOCK.acquire(),
        after_in_parent=lambda: _FORK_LOCK.release(),
        after_in_child=_after_fork_in_child,
    )


class EntryFile(io.FileIO):
    """A read-only entry file holding its ``LOCK_SH`` (``open_file``)."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd, "rb", closefd=False)
        self._lock_fd = fd

    def close(self) -> None:
        if not self.closed:
            super().close()
            close_fd(self._lock_fd)


def file_version(st: os.stat_result, crc: int) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, crc)


def _crc_of(fd: int) -> int:
    crc, pos = 0, 0
    while chunk := os.pread(fd, _CRC_CHUNK, pos):
        crc = zlib.crc32(chunk, crc)
        pos += len(chunk)
    return crc


def damage(fd: int, st: os.stat_result, rec: Mapping[str, Any]) -> tuple[str | None, Any]:
    """``(why entry file fd does not match its record or None, the "checked" value to
    record or None)``: the size every time, the crc32 once per boot per file version."""
    if st.st_size != int(rec["size"]):
        return f"{st.st_size} bytes, {rec['size']} expected", None
    version = file_version(st, int(rec["crc32"]))
    if version in VERIFIED or (BOOT and rec.get("checked") == [BOOT, *version]):
        return None, None
    crc = _crc_of(fd)
    if crc != int(rec["crc32"]):
        return f"crc32 {crc:08x}, {int(rec['crc32']):08x} expected", None
    return None, verified(version)


def verified(version: tuple[int, ...]) -> list[Any] | None:
    """Note that file ``version`` matches its crc32: in this process, and (returned: the
    manifest's ``checked``) for every process until the next boot."""
    VERIFIED.add(version)
    return [BOOT, *version] if BOOT else None


class Writer:
    """One entry being written: holds the key's lock (``lock``) and a reservation of
    ``size`` bytes for temp file ``tmp`` (open as ``f``). ``commit`` or ``discard`` ends it,
    exactly once: ``commit`` hands a complete file to ``on_commit`` (which makes it the
    entry, or returns False), anything else goes to ``on_release`` (temp file and
    reservation dropped); the lock is released either way. Write errors are reported to
    ``warn`` and end it: the stream it tees goes on."""

    def __init__(
        self,
        *,
        key: str,
        url: str,
        name: str,
        size: int,
        tmp: str,
        f: IO[bytes],
        lock: int,
        on_commit: Callable[[Writer], bool],
        on_release: Callable[[str], None],
        warn: Callable[[str, str], None],
    ) -> None:
        self.key, self.url, self.name, self.size, self.tmp = key, url, name, size, tmp
        self._f: IO[bytes] | None = f
        self._lock = lock
        self._on_commit, self._on_release, self._warn = on_commit, on_release, warn
        self.written = 0
        self.crc = 0

    @property
    def active(self) -> bool:
        return self._f is not None

    def write(self, data: memoryview) -> None:
        if self._f is None:
            return
        if self.written + len(data) > self.size:  # more than the object's size: no entry
            self.discard()
            return
        try:
            self._f.write(data)
        except OSError as exc:  # disk full, ...: keep streaming, without the entry
            self._warn("write", f"cannot write the cache's temp file {self.tmp}: {exc}")
            self.discard()
            return
        self.crc = zlib.crc32(data, self.crc)
        self.written += len(data)

    def commit(self) -> None:
        f, self._f = self._f, None
        if f is None:
            return
        try:
            f.close()
            ok = self.written == self.size and self._on_commit(self)
        except OSError as exc:
            self._warn("write", f"cannot write the cache's temp file {self.tmp}: {exc}")
            ok = False
        if not ok:
            self._on_release(self.tmp)
        close_fd(self._lock)

    def discard(self) -> None:
        f, self._f = self._f, None
        if f is None:
            return
        with contextlib.suppress(OSError):
            f.close()
        self._on_release(self.tmp)
        close_fd(self._lock)


def detach(stream: ShardReader) -> _RawBase:
    """The raw stream of ``stream``, which gives it up (nothing has been buffered yet)."""
    raw = stream.raw
    stream.detach()
    return raw


class TeeRaw(io.RawIOBase):
    """A remote raw stream whose bytes are also written to a cache entry (``Writer``).

    Mirrors the ``_RawBase`` attributes ``ShardReader`` exposes (``url``, ``size``,
    ``offset``, ``retries``, ``abort``). Once a read lands within ``DRAIN_BYTES`` of the
    object's end, the rest is received at once (held in ``_tail`` for the reader) and the
    entry committed: a tar reader yields its last sample when it sees the end-of-archive
    marker, and its loader may abort the stream right after, before the bytes that follow
    the marker were read. A read closed or aborted before that makes no entry. Writing
    never fails the read; a failure while receiving the tail is raised to the reader once
    it has had the tail's bytes, as the stream would have raised it.
    """

    def __init__(self, inner: _RawBase, writer: Writer) -> None:
        super().__init__()
        self._inner = inner
        self._writer = writer
        self._aborted = False
        self._tail = bytearray()
        self._error: Exception | None = None

    url = property(lambda self: self._inner.url)
    size = property(lambda self: self._inner.size)
    offset = property(lambda self: self._inner.offset)
    retries = property(lambda self: self._inner.retries)
    content_type = property(lambda self: getattr(self._inner, "content_type", None))

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._inner.offset - len(self._tail)

    def readinto(self, b: Any) -> int:
        if self._tail:
            k = min(len(b), len(self._tail))
            b[:k] = self._tail[:k]
            del self._tail[:k]
            return k
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        n = self._inner.readinto(b)
        w = self._writer
        if n and w.active:
            w.write(memoryview(b)[:n])
            if w.active and not self._aborted and 0 < w.size - self._inner.offset <= DRAIN_BYTES:
                self._receive_tail()
            if self._inner.offset >= w.size:
                w.commit()
        return n

    def _receive_tail(self) -> None:
        buf = bytearray(DRAIN_BYTES)
        try:
            while k := self._inner.readinto(buf):
                self._tail += buf[:k]
                self._writer.write(memoryview(buf)[:k])
        except Exception as exc:  # the reader gets it after the bytes received before it
            self._error = exc

    def abort(self) -> None:
        self._aborted = True
        self._inner.abort()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._writer.discard()  # a no-op once committed
        finally:
            self._inner.close()
            super().close()


class EntryRaw(_RawBase):
    """Reads an entry through ``fd`` (which holds the entry's ``LOCK_SH`` until closed)."""

    local = True

    def __init__(
        self, fd: int, path: Path, *, url: str, size: int, on_bytes: Callable[[int], None]
    ) -> None:
        super().__init__(
            str(path),
            retries=0,
            backoff_s=0.0,
            max_backoff_s=0.0,
            timeout_s=30.0,
            block_bytes=1 << 20,
            semaphore=None,  # a local read: not one of the worker's network requests
            counters=IOCounters(),  # nor counted in its I/O stats (``bytes_saved`` is)
            secrets=(),
        )
        self.url = f"{url} (cache entry {path})"
        self._fd = fd
        self._on_bytes = on_bytes
        self.size = size

    def _connect(self, offset: int) -> None:
        pass

    def _read_some(self, n: int) -> bytes:
        return os.pread(self._fd, n, self.offset)

    def _read_some_into(self, view: memoryview) -> int:
        return os.preadv(self._fd, [view], self.offset)

    def _disconnect(self) -> None:
        pass

    def readinto(self, b: Any) -> int:
        n = super().readinto(b)
        self._on_bytes(n)
        return n

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                close_fd(self._fd)
        super().close()
