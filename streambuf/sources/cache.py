"""``ShardCache``: a node-local cache of remote shards, shared by every process on the node.

A lane that reads a remote shard from byte 0 *tees* the bytes it streams into a temp
file; when the read reaches the object's size the file becomes an entry (no second
download). Later opens of that URL, at any offset and length (a new epoch, a resume, a
fetch), read the entry instead of the network. See docs/cache.md for the guarantees and
how to choose the limit.

Layout: the cache writes only under ``<folder>/.streambuf/``::

    manifest.json      entries and reservations: the authority (replaced atomically)
    lock               flock'ed (exclusive) around every manifest update
    data/<key>-<name>  entries: an object's bytes exactly as the source served them
    tmp/<pid>-<uuid>   entries being written, each one reserved in the manifest
    locks/<key>        flock'ed by the one process writing that key (never deleted:
                       deleting a lock file others hold open would break the exclusion)

Invariants:

* **Bound.** Entry sizes plus reserved sizes <= ``limit_bytes`` at every moment: a writer
  reserves the object's whole size (known from the first response) under the manifest
  lock before its first byte, evicting first; a temp file never grows past its
  reservation. When no room can be made (an object larger than the limit, nothing
  evictable) the shard streams without being cached: never a wait, never a deadlock.
* **Ownership.** Only files the manifest records (entries, reservations) are ever
  deleted; a file it does not record is never touched, wherever it lies.
* **One writer per key.** The writer holds ``locks/<key>`` (``LOCK_EX | LOCK_NB``); a
  second reader of a shard being written streams it without writing. A reservation whose
  key lock nobody holds belongs to a dead writer: it is dropped (temp file included).
* **Verified hits.** An entry is served only if its size equals the recorded size and
  its crc32 equals the one computed from the download, checked once per boot per file
  version (inode, size, mtime, ctime; recorded in the manifest, so one process's check
  serves every process until the machine restarts or the file is touched). Entries are
  not fsync'ed: after a crash or power loss the boot id differs, so every entry is
  checked again before use. A damaged entry is deleted, counted (``corrupt``) and
  re-fetched. Readers hold ``LOCK_SH`` on the entry; eviction takes ``LOCK_EX |
  LOCK_NB``, so an entry in use is never evicted.
* **Locks stay with their process.** A flock belongs to an open file, which a forked
  child shares: every descriptor holding a cache lock is registered, and a child forked
  while one is held points it at /dev/null at once (``_open_fd``), so the lock is never
  held by a process that does not know it has it (a DataLoader forking its workers while
  lanes of the same process read through the cache).
* **Never fails a read.** Locks are non-blocking or bounded by ``_LOCK_TIMEOUT_S``; any
  cache failure (disk full, a lock held too long, an unreadable manifest) is logged and
  the shard streams as if there were no cache.

Eviction: to make room, entries of objects the reading pipeline does not read (other
data sets, other jobs) go first, least recently used first; entries of the pipeline's
own data set (``keep``) are never traded for one another. An epoch reads every shard
once, so replacing one of them with another gains no hit; least-recently-used
replacement would evict the very shard a scan needs next (a limit of half the data set
saves ~15% of requests with shuffled epochs, 0% without; docs/cache.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

from .._units import parse_bytes
from ._resumable import IOCounters, _RawBase
from .opener import ShardReader
from .urls import redact

__all__ = ["CacheStats", "ShardCache", "cached_file", "is_cacheable"]

log = logging.getLogger("streambuf")

_LOCK_TIMEOUT_S = 10.0  # the manifest lock is held for milliseconds; longer means trouble
_DRAIN_BYTES = 1 << 16  # a reader that stops this close to the end is read to it (tar trailer)
_CRC_CHUNK = 1 << 20
_TOUCH_S = 60.0  # an entry's last use is recorded at most once a minute (LRU granularity)
_VERSION = 1
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""  # no boot id: every process checks each entry's crc32 once


_BOOT = _read_boot_id()
# file versions this process has checked: (dev, inode, size, mtime_ns, ctime_ns, crc32)
_VERIFIED: set[tuple[int, ...]] = set()


# -- descriptors that hold locks (see "Locks stay with their process") ---------------------
_FDS: set[int] = set()  # changed only under _FORK_LOCK, which a fork holds across itself
_FORK_LOCK = threading.Lock()


def _open_fd(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` for a descriptor that may hold a flock (registered until ``_close_fd``)."""
    with _FORK_LOCK:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        _FDS.add(fd)
    return fd


def _close_fd(fd: int) -> None:
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
    # the descriptors stay registered: whoever closes them later goes through _close_fd


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=lambda: _FORK_LOCK.acquire(),
        after_in_parent=lambda: _FORK_LOCK.release(),
        after_in_child=_after_fork_in_child,
    )


class _EntryFile(io.FileIO):
    """A read-only entry file holding its ``LOCK_SH`` (``open_file``)."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd, "rb", closefd=False)
        self._lock_fd = fd

    def close(self) -> None:
        if not self.closed:
            super().close()
            _close_fd(self._lock_fd)


@dataclass(frozen=True)
class CacheStats:
    """Snapshot of a cache's counters (of one reader, or summed by ``shard_stats``).

    Attributes:
        hits: opens served from an entry. misses: opens of a remote shard that were not.
        writes: entries written. evictions: entries evicted to make room. corrupt:
            entries found damaged (size or crc32) and deleted. bytes_saved: bytes read from
            entries instead of the network. bytes_written: bytes of the entries written.
    """

    hits: int = 0
    misses: int = 0
    writes: int = 0
    evictions: int = 0
    corrupt: int = 0
    bytes_saved: int = 0
    bytes_written: int = 0


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = dict.fromkeys((f.name for f in fields(CacheStats)), 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                self._c[k] += v

    def snapshot(self) -> CacheStats:
        with self._lock:
            return CacheStats(**self._c)


class _Unavailable(Exception):
    """The cache cannot be used right now (the caller streams instead)."""


def is_cacheable(url: str) -> bool:
    """Remote URLs are cached; local paths and ``file://`` never are."""
    return "://" in url and not url.lower().startswith("file://")


def _endpoint(storage_options: Mapping[str, Any] | None) -> str:
    """The part of the storage options that names *where* an object lives (the same
    ``s3://`` URL on two endpoints is two objects)."""
    o = dict(storage_options or {})
    client = o.get("client_kwargs") or {}
    return str(o.get("endpoint_url") or (client.get("endpoint_url") if client else "") or "")


class ShardCache:
    """The cache in ``folder`` for one reader (one DataLoader worker's lanes): see the
    module docstring. Thread-safe; every process builds its own over the same folder.

    Args:
        folder: the cache folder (created if missing), on a node-local filesystem.
        limit_bytes: the most bytes entries and reservations may hold together. Processes
            sharing a folder should pass the same limit (each keeps the folder within its
            own when it adds an entry).
        keep: URLs of the reading pipeline's data set: their entries are never evicted
            to admit another one of them (module docstring, "Eviction").
        storage_options: the reader's fsspec options (their endpoint is part of the key).
        secrets: strings to redact from what the manifest and the logs record.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        limit_bytes: int,
        *,
        keep: Iterable[str] = (),
        storage_options: Mapping[str, Any] | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.folder = Path(folder)
        self.limit = int(limit_bytes)
        self._root = self.folder / ".streambuf"
        self._data, self._tmp, self._locks = (self._root / n for n in ("data", "tmp", "locks"))
        for d in (self._data, self._tmp, self._locks):
            d.mkdir(parents=True, exist_ok=True)
        self._manifest = self._root / "manifest.json"
        self._endpoint = _endpoint(storage_options)
        self._secrets = secrets
        self._keep = frozenset(self.key(u) for u in keep)
        self.counters = _Counters()
        self._warned: set[str] = set()
        self._snap: tuple[tuple[int, ...], dict[str, Any]] | None = None

    # -- naming -----------------------------------------------------------------------
    def key(self, url: str) -> str:
        """The entry key of ``url``: a hash of the endpoint and the full URL."""
        return hashlib.sha256(f"{self._endpoint}\n{url}".encode()).hexdigest()[:32]

    def _file_name(self, key: str, url: str) -> str:
        base = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        return f"{key}-{_NAME.sub('_', base)[-64:]}"

    def stats(self) -> CacheStats:
        return self.counters.snapshot()

    def usage(self) -> int:
        """Bytes of entries plus reservations, as the manifest records them now."""
        return _used(self._read())

    # -- opening ----------------------------------------------------------------------
    def open(
        self,
        url: str,
        /,
        *,
        offset: int,
        length: int | None,
        remote: Callable[[int, int | None], ShardReader],
        block_bytes: int,
    ) -> ShardReader:
        """``url`` from ``offset`` (``length`` bytes, or to the end): the entry if there is
        a sound one, else ``remote(offset, length)``, teed into a new entry when the read
        starts at byte 0 and is unbounded and this process may write the key."""
        key = self.key(url)
        hit = self._open_entry(key, url, offset, length, block_bytes)
        lock: int | None = None
        if hit is None and offset == 0 and length is None:
            lock = self._try_key_lock(key)
            if lock is not None:  # the entry may have landed since we looked
                hit = self._open_entry(key, url, offset, length, block_bytes)
                if hit is not None:
                    _close_fd(lock)
                    lock = None
        if hit is not None:
            self.counters.add(hits=1)
            return hit
        self.counters.add(misses=1)
        try:
            stream = remote(offset, length)
        except BaseException:
            if lock is not None:
                _close_fd(lock)
            raise
        if lock is None:
            return stream
        writer = self._begin(key, url, stream.size, lock)
        if writer is None:
            return stream
        return ShardReader(_TeeRaw(_detach(stream), writer), buffer_size=block_bytes)

    def open_file(self, url: str, /, *, remote: Callable[[], ShardReader]) -> IO[bytes] | None:
        """A seekable local file of ``url`` (random access: videos): the entry if there is
        one, else the whole object downloaded into the cache first. None when it cannot be
        cached (no room, another process writing it): then open it remotely."""
        key = self.key(url)
        f = self._open_entry_file(key, url)
        lock: int | None = None
        if f is None:
            lock = self._try_key_lock(key)
            if lock is not None and (f := self._open_entry_file(key, url)) is not None:
                _close_fd(lock)
        if f is not None:
            self.counters.add(hits=1)
            return f
        self.counters.add(misses=1)
        if lock is None:
            return None
        try:
            stream = remote()
        except BaseException:
            _close_fd(lock)
            raise
        writer = self._begin(key, url, stream.size, lock)
        if writer is None:
            stream.close()
            return None
        with ShardReader(_TeeRaw(_detach(stream), writer), buffer_size=1 << 20) as tee:
            while tee.read(1 << 20):
                pass
        return self._open_entry_file(key, url)

    # -- hits -------------------------------------------------------------------------
    def _open_entry(
        self, key: str, url: str, offset: int, length: int | None, block_bytes: int
    ) -> ShardReader | None:
        found = self._locked_entry(key, url)
        if found is None:
            return None
        fd, path, size = found
        raw = _EntryRaw(fd, path, url=self._name(url), size=size, counters=self.counters)
        raw.offset = raw.start = offset
        raw.end = None if length is None else offset + length
        try:
            raw.open()
        except BaseException:
            raw.close()
            raise
        return ShardReader(raw, buffer_size=block_bytes)

    def _open_entry_file(self, key: str, url: str) -> IO[bytes] | None:
        found = self._locked_entry(key, url)
        if found is None:
            return None
        return io.BufferedReader(_EntryFile(found[0]))

    def _locked_entry(self, key: str, url: str) -> tuple[int, Path, int] | None:
        """``(fd holding LOCK_SH, path, size)`` of a sound entry of ``key``, or None."""
        try:
            rec = self._snapshot()["entries"].get(key)
        except _Unavailable:
            return None
        if rec is None:
            return None
        path = self._data / rec["file"]
        try:
            fd = _open_fd(path, os.O_RDONLY)
        except FileNotFoundError:
            self._drop(key, rec, why="its file is missing", corrupt=False)
            return None
        except OSError as exc:
            self._warn("open", f"cannot open cache entry {path} ({exc}); streaming instead")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            st = os.fstat(fd)
            if os.stat(path).st_ino != st.st_ino:  # evicted and rewritten since we opened
                raise BlockingIOError
            why, checked = _damage(fd, st, rec)
        except OSError:  # being evicted right now, or gone: a miss
            _close_fd(fd)
            return None
        if why is not None:
            _close_fd(fd)
            self._drop(key, rec, why=why, corrupt=True)
            return None
        now = time.time()
        if checked or now - float(rec.get("used", 0)) > _TOUCH_S:
            try:
                with self._update() as m:
                    cur = m["entries"].get(key)
                    if cur is not None and cur["file"] == rec["file"]:
                        cur["used"] = now
                        if checked:
                            cur["checked"] = checked
            except (_Unavailable, OSError):
                pass  # served anyway; only its place in the eviction order is stale
        return fd, path, int(rec["size"])

    def _drop(self, key: str, rec: dict[str, Any], *, why: str, corrupt: bool) -> None:
        """Forget entry ``rec`` of ``key`` (and delete its file: the manifest says we wrote
        it), unless another process replaced the record meanwhile."""
        path = self._data / rec["file"]
        if corrupt:
            log.warning("streambuf: cache entry %s is damaged (%s): fetching it again", path, why)
        try:
            with self._update() as m:
                cur = m["entries"].get(key)
                if cur is None or cur.get("crc32") != rec.get("crc32"):
                    return
                del m["entries"][key]
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        except (_Unavailable, OSError) as exc:
            self._warn("drop", f"cannot drop cache entry {path}: {exc}")
            return
        if corrupt:
            self.counters.add(corrupt=1)

    # -- writing ----------------------------------------------------------------------
    def _try_key_lock(self, key: str) -> int | None:
        try:
            fd = _open_fd(self._locks / key, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            self._warn("lock", f"cannot create lock file in {self._locks}: {exc}")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process (or lane) is writing this key
            _close_fd(fd)
            return None
        return fd

    def _begin(self, key: str, url: str, size: int | None, lock: int) -> _Writer | None:
        """Reserve ``size`` bytes for a new entry of ``key`` (evicting to make room) and
        open its temp file; None (and ``lock`` released) when it cannot be cached."""
        if not size or size > self.limit:
            _close_fd(lock)
            return None
        tmp = f"{os.getpid()}-{uuid.uuid4().hex}"
        name = self._file_name(key, url)
        try:
            with self._update() as m:
                # a record we could not use (a race with an eviction): leave it be
                if key in m["entries"] or not self._make_room(m, size):
                    _close_fd(lock)
                    return None
                m["reserved"][tmp] = {"key": key, "file": name, "size": size, "t": time.time()}
            f = open(self._tmp / tmp, "xb")
        except (_Unavailable, OSError) as exc:
            self._warn("reserve", f"cannot start a cache entry in {self._root}: {exc}")
            self._release(tmp)
            _close_fd(lock)
            return None
        return _Writer(self, key, url, name, size, tmp, f, lock)

    def _make_room(self, m: dict[str, Any], size: int) -> bool:
        """Under the manifest lock: evict until ``size`` more bytes fit (module docstring,
        "Eviction"); False, evicting nothing, when they cannot."""
        if _used(m) + size <= self.limit:
            return True
        self._drop_stale(m)
        need = _used(m) + size - self.limit
        if need <= 0:
            return True
        victims: list[tuple[str, int]] = []  # (key, fd holding LOCK_EX)
        try:
            order = sorted(
                (k for k in m["entries"] if k not in self._keep),
                key=lambda k: (m["entries"][k].get("used", 0), k),
            )
            for k in order:
                if need <= 0:
                    break
                rec = m["entries"][k]
                try:
                    fd = _open_fd(self._data / rec["file"], os.O_RDONLY)
                except FileNotFoundError:  # already gone: just forget it
                    del m["entries"][k]
                    need -= int(rec["size"])
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # in use by a reader
                    _close_fd(fd)
                    continue
                victims.append((k, fd))
                need -= int(rec["size"])
            if need > 0:
                return False
            for k, _ in victims:
                rec = m["entries"].pop(k)
                with contextlib.suppress(FileNotFoundError):
                    (self._data / rec["file"]).unlink()
            self.counters.add(evictions=len(victims))
            return True
        finally:
            for _, fd in victims:
                _close_fd(fd)

    def _drop_stale(self, m: dict[str, Any]) -> None:
        """Under the manifest lock: drop reservations whose writer died (nobody holds the
        key's lock), with their temp file and any entry file they had renamed into place."""
        for tmp, r in list(m["reserved"].items()):
            fd = self._try_key_lock(r["key"])
            if fd is None:
                continue  # its writer is alive
            try:
                del m["reserved"][tmp]
                with contextlib.suppress(FileNotFoundError):
                    (self._tmp / tmp).unlink()
                if r["key"] not in m["entries"]:  # a crash between rename and manifest
                    with contextlib.suppress(FileNotFoundError):
                        (self._data / r["file"]).unlink()
            finally:
                _close_fd(fd)

    def _commit(self, w: _Writer) -> bool:
        """Make ``w``'s complete temp file the entry of its key."""
        try:
            with self._update() as m:
                if m["reserved"].pop(w.tmp, None) is None:
                    return False
                final = self._data / w.name
                if final.exists():  # not ours to replace (the record was dropped above)
                    return False
                os.rename(self._tmp / w.tmp, final)
                # its crc32 is the one just computed from these bytes (until a reboot)
                ident = _ident(os.stat(final), w.crc)
                _VERIFIED.add(ident)
                now = time.time()
                m["entries"][w.key] = {
                    "file": w.name,
                    "url": self._name(w.url),
                    "size": w.size,
                    "crc32": w.crc,
                    "written": now,
                    "used": now,
                    "checked": [_BOOT, *ident] if _BOOT else None,
                }
        except (_Unavailable, OSError) as exc:
            self._warn("commit", f"cannot add a cache entry in {self._root}: {exc}")
            return False
        self.counters.add(writes=1, bytes_written=w.size)
        return True

    def _release(self, tmp: str) -> None:
        """Give up reservation ``tmp`` and its temp file."""
        with contextlib.suppress(FileNotFoundError):
            (self._tmp / tmp).unlink()
        try:
            with self._update() as m:
                m["reserved"].pop(tmp, None)
        except (_Unavailable, OSError) as exc:  # a dead-writer sweep will drop it
            self._warn("release", str(exc))

    # -- the manifest -----------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        """The manifest as it is now (a fresh copy: the caller may change it)."""
        try:
            text = self._manifest.read_bytes()
        except FileNotFoundError:
            return {"version": _VERSION, "entries": {}, "reserved": {}}
        except OSError as exc:
            raise _Unavailable(f"cannot read {self._manifest}: {exc}") from exc
        return self._parse(text)

    def _snapshot(self) -> dict[str, Any]:
        """The manifest for looking up (never to be changed): parsed once per version of
        the file (each write replaces it: a new inode)."""
        try:
            with open(self._manifest, "rb") as f:
                st = os.fstat(f.fileno())
                ident = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                snap = self._snap
                if snap is not None and snap[0] == ident:
                    return snap[1]
                text = f.read()
        except FileNotFoundError:
            return {"version": _VERSION, "entries": {}, "reserved": {}}
        except OSError as exc:
            raise _Unavailable(f"cannot read {self._manifest}: {exc}") from exc
        m = self._parse(text)
        self._snap = (ident, m)
        return m

    def _parse(self, text: bytes) -> dict[str, Any]:
        try:
            m = json.loads(text)
            _check_manifest(m)
        except ValueError as exc:
            self._warn(
                "manifest",
                f"the cache manifest {self._manifest} is unreadable ({exc}); the cache is off "
                f"until it is fixed: delete {self._root} to reset the cache",
            )
            raise _Unavailable(str(exc)) from exc
        return dict(m)

    @contextlib.contextmanager
    def _update(self) -> Iterator[dict[str, Any]]:
        """The manifest under the cross-process lock; written back (atomically) on exit."""
        try:
            fd = _open_fd(self._root / "lock", os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise _Unavailable(f"cannot open {self._root / 'lock'}: {exc}") from exc
        try:
            deadline = time.monotonic() + _LOCK_TIMEOUT_S
            delay = 0.001
            while True:  # flock has no timeout: poll, briefly (holders take milliseconds)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise _Unavailable(
                            f"the cache lock {self._root / 'lock'} was held for more than "
                            f"{_LOCK_TIMEOUT_S:g} s (a hung process?)"
                        ) from None
                    time.sleep(delay)
                    delay = min(2 * delay, 0.02)
            m = self._read()
            before = json.dumps(m, sort_keys=True)
            yield m
            text = json.dumps(m, sort_keys=True)
            if text != before:
                part = self._root / "manifest.json.part"
                try:
                    part.write_text(text, encoding="utf-8")
                    os.replace(part, self._manifest)
                except OSError as exc:  # what was done on disk meanwhile heals (see _drop_stale)
                    raise _Unavailable(f"cannot write {self._manifest}: {exc}") from exc
        finally:
            _close_fd(fd)

    def _name(self, url: str) -> str:
        return redact(url, secrets=self._secrets)

    def _warn(self, what: str, message: str) -> None:
        """WARNING once per kind of failure (per reader), DEBUG after that."""
        level = logging.DEBUG if what in self._warned else logging.WARNING
        self._warned.add(what)
        log.log(level, "streambuf: cache: %s", message)


_KEY = re.compile(r"[0-9a-f]{32}")
_ENTRY_FILE = re.compile(r"[0-9a-f]{32}-[A-Za-z0-9._-]{0,64}")
_TMP_FILE = re.compile(r"[0-9]+-[0-9a-f]{32}")


def _check_manifest(m: Any) -> None:
    """Raise ``ValueError`` unless ``m`` is a manifest this version wrote. File names are
    checked too: whatever the manifest says, nothing outside ``data/`` and ``tmp/`` is
    ever deleted."""
    if not isinstance(m, dict) or m.get("version") != _VERSION:
        raise ValueError(f"not a version {_VERSION} manifest")
    entries, reserved = m.get("entries"), m.get("reserved")
    if not isinstance(entries, dict) or not isinstance(reserved, dict):
        raise ValueError("no entries or reservations")
    for k, e in entries.items():
        if not (
            _KEY.fullmatch(k)
            and isinstance(e, dict)
            and isinstance(e.get("file"), str)
            and _ENTRY_FILE.fullmatch(e["file"])
            and isinstance(e.get("size"), int)
            and isinstance(e.get("crc32"), int)
        ):
            raise ValueError(f"a bad entry record {e!r}")
    for tmp, r in reserved.items():
        if not (
            _TMP_FILE.fullmatch(tmp)
            and isinstance(r, dict)
            and isinstance(r.get("key"), str)
            and _KEY.fullmatch(r["key"])
            and isinstance(r.get("file"), str)
            and _ENTRY_FILE.fullmatch(r["file"])
            and isinstance(r.get("size"), int)
        ):
            raise ValueError(f"a bad reservation record {r!r}")


def _used(m: Mapping[str, Any]) -> int:
    return sum(int(e["size"]) for e in m["entries"].values()) + sum(
        int(r["size"]) for r in m["reserved"].values()
    )


def _ident(st: os.stat_result, crc: int) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, crc)


def _crc_of(fd: int) -> int:
    crc, pos = 0, 0
    while chunk := os.pread(fd, _CRC_CHUNK, pos):
        crc = zlib.crc32(chunk, crc)
        pos += len(chunk)
    return crc


def _damage(fd: int, st: os.stat_result, rec: Mapping[str, Any]) -> tuple[str | None, Any]:
    """``(why entry file fd does not match its record or None, the "checked" value to
    record or None)``: the size every time, the crc32 once per boot per file version."""
    if st.st_size != int(rec["size"]):
        return f"{st.st_size} bytes, {rec['size']} expected", None
    ident = _ident(st, int(rec["crc32"]))
    if ident in _VERIFIED or (_BOOT and rec.get("checked") == [_BOOT, *ident]):
        return None, None
    crc = _crc_of(fd)
    if crc != int(rec["crc32"]):
        return f"crc32 {crc:08x}, {int(rec['crc32']):08x} expected", None
    _VERIFIED.add(ident)
    return None, ([_BOOT, *ident] if _BOOT else None)


class _Writer:
    """One entry being written: holds the key's lock and a reservation of ``size`` bytes.
    ``commit`` or ``discard`` ends it (exactly one of them takes effect)."""

    def __init__(
        self,
        cache: ShardCache,
        key: str,
        url: str,
        name: str,
        size: int,
        tmp: str,
        f: IO[bytes],
        lock: int,
    ) -> None:
        self.cache, self.key, self.url, self.name, self.size, self.tmp = (
            cache,
            key,
            url,
            name,
            size,
            tmp,
        )
        self._f: IO[bytes] | None = f
        self._lock = lock
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
            self.cache._warn("write", f"cannot write {self.cache._tmp / self.tmp}: {exc}")
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
            ok = self.written == self.size and self.cache._commit(self)
        except OSError as exc:
            self.cache._warn("write", f"cannot write {self.cache._tmp / self.tmp}: {exc}")
            ok = False
        if not ok:
            self.cache._release(self.tmp)
        _close_fd(self._lock)

    def discard(self) -> None:
        f, self._f = self._f, None
        if f is None:
            return
        with contextlib.suppress(OSError):
            f.close()
        self.cache._release(self.tmp)
        _close_fd(self._lock)


def _detach(stream: ShardReader) -> _RawBase:
    """The raw stream of ``stream``, which gives it up (nothing has been buffered yet)."""
    raw = stream.raw
    stream.detach()
    return raw


class _TeeRaw(io.RawIOBase):
    """A remote raw stream whose bytes are also written to a cache entry (``_Writer``).

    Mirrors the ``_RawBase`` attributes ``ShardReader`` exposes (``url``, ``size``,
    ``offset``, ``retries``, ``abort``). The entry is committed when the read reaches the
    object's size; a read closed within ``_DRAIN_BYTES`` of it (a tar reader stops at the
    end-of-archive marker) is read to the end first; otherwise, and after ``abort``, the
    entry is discarded. Writing never fails the read.
    """

    def __init__(self, inner: _RawBase, writer: _Writer) -> None:
        super().__init__()
        self._inner = inner
        self._writer = writer
        self._aborted = False

    url = property(lambda self: self._inner.url)
    size = property(lambda self: self._inner.size)
    offset = property(lambda self: self._inner.offset)
    retries = property(lambda self: self._inner.retries)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._inner.readinto(b)
        if n and self._writer.active:
            self._writer.write(memoryview(b)[:n])
            if self._inner.offset >= self._writer.size:
                self._writer.commit()
        return n

    def abort(self) -> None:
        self._aborted = True
        self._inner.abort()

    def close(self) -> None:
        if self.closed:
            return
        try:
            w = self._writer
            left = w.size - self._inner.offset
            if w.active and not self._aborted and 0 < left <= _DRAIN_BYTES:
                buf = bytearray(min(left, 1 << 16))
                with contextlib.suppress(Exception):  # best effort: else no entry
                    while w.active and self.readinto(buf):
                        pass
            w.discard()  # a no-op once committed
        finally:
            self._inner.close()
            super().close()


class _EntryRaw(_RawBase):
    """Reads an entry through ``fd`` (which holds the entry's ``LOCK_SH`` until closed)."""

    def __init__(self, fd: int, path: Path, *, url: str, size: int, counters: _Counters) -> None:
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
        self._cache_counters = counters
        self.size = size

    def _connect(self, offset: int) -> None:
        pass

    def _read_some(self, n: int) -> bytes:
        return os.pread(self._fd, n, self.offset)

    def _disconnect(self) -> None:
        pass

    def readinto(self, b: Any) -> int:
        n = super().readinto(b)
        self._cache_counters.add(bytes_saved=n)
        return n

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                _close_fd(self._fd)
        super().close()


_CACHES: dict[tuple[str, int, str], ShardCache] = {}
_CACHES_LOCK = threading.Lock()


def cached_file(
    url: str,
    /,
    *,
    cache_dir: str | os.PathLike[str],
    cache_limit: int | str,
    storage_options: Mapping[str, Any] | None = None,
    **transport: Any,
) -> IO[bytes] | None:
    """A seekable local copy of remote ``url`` from the cache in ``cache_dir`` (downloaded
    into it first on a miss, with ``open_stream``'s retries), or None: not remote, or it
    cannot be cached now (then open it remotely). For random-access readers (videos).

    One ``ShardCache`` per (folder, limit) per process; ``transport``: ``open_stream``
    keyword arguments (``retries``, ``timeout_s``, ...). Close the file when done (it
    holds the entry's shared lock, so it is never evicted while open).
    """
    from .opener import open_stream

    if not is_cacheable(url):
        return None
    limit = parse_bytes(cache_limit, name="cache_limit")
    k = (os.fspath(cache_dir), limit, _endpoint(storage_options))
    with _CACHES_LOCK:
        cache = _CACHES.get(k)
        if cache is None:
            cache = _CACHES[k] = ShardCache(cache_dir, limit, storage_options=storage_options)
    return cache.open_file(
        url, remote=lambda: open_stream(url, storage_options=storage_options, **transport)
    )
