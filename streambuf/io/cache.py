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
  while one is held points it at /dev/null at once (``open_fd``), so the lock is never
  held by a process that does not know it has it (a DataLoader forking its workers while
  lanes of the same process read through the cache).
* **Never fails a read.** Locks are non-blocking or bounded
  (``_manifest.LOCK_TIMEOUT_S``, paid once: a lock still held is then not waited for); any
  cache failure (disk full, a lock held too long, an
  unreadable manifest) is logged and the shard streams as if there were no cache.

Eviction: to make room, only entries of objects the reading pipeline does not read
(other data sets, other jobs) are evicted, least recently used first; entries of the
pipeline's own data set (``keep``) are never traded for one another. An epoch reads every shard
once, so replacing one of them with another gains no hit; least-recently-used
replacement would evict the very shard a scan needs next (a limit of half the data set
saves ~15% of requests with shuffled epochs, 0% without; docs/cache.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._counters import Counters
from .._units import parse_bytes
from ._cache_io import (
    EntryFile,
    EntryRaw,
    TeeRaw,
    Writer,
    close_fd,
    damage,
    detach,
    file_version,
    open_fd,
    verified,
)
from ._manifest import Manifest, Unavailable, make_room, used_bytes
from .opener import ShardReader, not_data_hint, open_range
from .urls import redact

__all__ = ["CacheStats", "ShardCache", "cached_file", "is_cacheable"]

log = logging.getLogger("streambuf")

_TOUCH_S = 60.0  # an entry's last use is recorded at most once a minute (LRU granularity)
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class CacheStats:
    """Snapshot of a cache's counters (of one reader, or summed in ``pipe.stats().shards``).

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
        self._m = Manifest(self._root, warn=self._warn)
        self._endpoint = _endpoint(storage_options)
        self._secrets = secrets
        self._keep = frozenset(self.key(u) for u in keep)
        self.counters = Counters(CacheStats)
        self._warned: set[str] = set()

    # -- naming -----------------------------------------------------------------------
    def key(self, url: str) -> str:
        """The entry key of ``url``: a hash of the endpoint and the full URL."""
        return hashlib.sha256(f"{self._endpoint}\n{url}".encode()).hexdigest()[:32]

    def _file_name(self, key: str, url: str) -> str:
        base = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        return f"{key}-{_NAME.sub('_', base)[-64:]}"

    def stats(self) -> CacheStats:
        return self.counters.snapshot()

    def holds(self, url: str) -> bool:
        """The manifest lists an entry of ``url`` (a hint: opening it checks it)."""
        try:
            return self.key(url) in self._m.snapshot()["entries"]
        except Unavailable:
            return False

    def usage(self) -> int:
        """Bytes of entries plus reservations, as the manifest records them now."""
        return used_bytes(self._m.read())

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
                    close_fd(lock)
                    lock = None
        if hit is not None:
            self.counters.add(hits=1)
            return hit
        self.counters.add(misses=1)
        try:
            stream = remote(offset, length)
        except BaseException:
            if lock is not None:
                close_fd(lock)
            raise
        if lock is None:
            return stream
        if not_data_hint(stream.content_type) is not None:  # an error page is no entry
            close_fd(lock)
            return stream
        writer = self._begin(key, url, stream.size, lock)
        if writer is None:
            return stream
        return ShardReader(TeeRaw(detach(stream), writer), buffer_size=block_bytes)

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
                close_fd(lock)
        if f is not None:
            self.counters.add(hits=1)
            return f
        self.counters.add(misses=1)
        if lock is None:
            return None
        try:
            stream = remote()
        except BaseException:
            close_fd(lock)
            raise
        writer = self._begin(key, url, stream.size, lock)
        if writer is None:
            stream.close()
            return None
        with ShardReader(TeeRaw(detach(stream), writer), buffer_size=1 << 20) as tee:
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
        raw = EntryRaw(
            fd,
            path,
            url=self._name(url),
            size=size,
            on_bytes=lambda n: self.counters.add(bytes_saved=n),
        )
        return open_range(raw, offset, length, block_bytes)

    def _open_entry_file(self, key: str, url: str) -> IO[bytes] | None:
        found = self._locked_entry(key, url)
        if found is None:
            return None
        return io.BufferedReader(EntryFile(found[0]))

    def _locked_entry(self, key: str, url: str) -> tuple[int, Path, int] | None:
        """``(fd holding LOCK_SH, path, size)`` of a sound entry of ``key``, or None."""
        try:
            rec = self._m.snapshot()["entries"].get(key)
        except Unavailable:
            return None
        if rec is None:
            return None
        path = self._data / rec["file"]
        try:
            fd = open_fd(path, os.O_RDONLY)
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
            why, checked = damage(fd, st, rec)
        except OSError:  # being evicted right now, or gone: a miss
            close_fd(fd)
            return None
        if why is not None:
            close_fd(fd)
            self._drop(key, rec, why=why, corrupt=True)
            return None
        now = time.time()
        if checked or now - float(rec.get("used", 0)) > _TOUCH_S:
            try:
                with self._m.update() as m:
                    cur = m["entries"].get(key)
                    if cur is not None and cur["file"] == rec["file"]:
                        cur["used"] = now
                        if checked:
                            cur["checked"] = checked
            except (Unavailable, OSError) as exc:  # served anyway: only its place in the
                self._warn("touch", f"cannot mark {path} used: {exc}")  # eviction order is stale
        return fd, path, int(rec["size"])

    def _drop(self, key: str, rec: dict[str, Any], *, why: str, corrupt: bool) -> None:
        """Forget entry ``rec`` of ``key`` (and delete its file: the manifest says we wrote
        it), unless another process replaced the record meanwhile."""
        path = self._data / rec["file"]
        if corrupt:
            log.warning("streambuf: cache entry %s is damaged (%s): fetching it again", path, why)
        try:
            with self._m.update() as m:
                cur = m["entries"].get(key)
                if cur is None or cur.get("crc32") != rec.get("crc32"):
                    return
                del m["entries"][key]
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        except (Unavailable, OSError) as exc:
            self._warn("drop", f"cannot drop cache entry {path}: {exc}")
            return
        if corrupt:
            self.counters.add(corrupt=1)

    # -- writing ----------------------------------------------------------------------
    def _try_key_lock(self, key: str) -> int | None:
        try:
            fd = open_fd(self._locks / key, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            self._warn("lock", f"cannot create lock file in {self._locks}: {exc}")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process (or lane) is writing this key
            close_fd(fd)
            return None
        return fd

    def _begin(self, key: str, url: str, size: int | None, lock: int) -> Writer | None:
        """Reserve ``size`` bytes for a new entry of ``key`` (evicting to make room) and
        open its temp file; None (and ``lock`` released) when it cannot be cached."""
        tmp = f"{os.getpid()}-{uuid.uuid4().hex}"
        name = self._file_name(key, url)
        f: IO[bytes] | None = None
        if size and size <= self.limit:
            reserved = False
            try:
                with self._m.update() as m:
                    # a record we could not use (a race with an eviction): leave it be
                    if key not in m["entries"] and self._make_room(m, size):
                        m["reserved"][tmp] = {
                            "key": key,
                            "file": name,
                            "size": size,
                            "t": time.time(),
                        }
                        reserved = True
                if reserved:
                    f = open(self._tmp / tmp, "xb")
            except (Unavailable, OSError) as exc:
                self._warn("reserve", f"cannot start a cache entry in {self._root}: {exc}")
                if reserved:
                    self._release(tmp)
        if f is None:
            close_fd(lock)
            return None
        return Writer(
            key=key,
            url=url,
            name=name,
            size=size or 0,
            tmp=tmp,
            f=f,
            lock=lock,
            on_commit=self._commit,
            on_release=self._release,
            warn=self._warn,
        )

    def _make_room(self, m: dict[str, Any], size: int) -> bool:
        """Under the manifest lock: evict until ``size`` more bytes fit (module docstring,
        "Eviction"); False, evicting nothing, when they cannot."""
        evicted = make_room(
            m,
            size,
            limit=self.limit,
            keep=self._keep,
            data=self._data,
            tmp=self._tmp,
            writer_alive=self._writer_alive,
        )
        if evicted:
            self.counters.add(evictions=evicted)
        return evicted is not None

    def _writer_alive(self, key: str) -> bool:
        fd = self._try_key_lock(key)
        if fd is None:
            return True
        close_fd(fd)
        return False

    def _commit(self, w: Writer) -> bool:
        """Make ``w``'s complete temp file the entry of its key. If the manifest cannot
        be written after the rename, the file is taken back out (an orphan no record
        names would block the key's later commits: a file at an entry's path is never
        replaced unless a dead writer's reservation names it)."""
        final = self._data / w.name
        renamed = False
        try:
            with self._m.update() as m:
                if m["reserved"].pop(w.tmp, None) is None:
                    return False
                if final.exists():
                    dead = [t for t, r in m["reserved"].items() if r["file"] == w.name]
                    if not dead or any(e["file"] == w.name for e in m["entries"].values()):
                        return False  # an entry's, or no record's: not ours to replace
                    for t in dead:  # (we hold the key's lock: its other writers are dead)
                        del m["reserved"][t]
                        with contextlib.suppress(FileNotFoundError):
                            (self._tmp / t).unlink()
                os.rename(self._tmp / w.tmp, final)
                renamed = True
                # its crc32 is the one just computed from these bytes (until a reboot)
                checked = verified(file_version(os.stat(final), w.crc))
                now = time.time()
                m["entries"][w.key] = {
                    "file": w.name,
                    "url": self._name(w.url),
                    "size": w.size,
                    "crc32": w.crc,
                    "written": now,
                    "used": now,
                    "checked": checked,
                }
        except (Unavailable, OSError) as exc:
            if renamed:  # the manifest was not written: no record names the file
                with contextlib.suppress(OSError):
                    final.unlink()
            self._warn("commit", f"cannot add a cache entry in {self._root}: {exc}")
            return False
        self.counters.add(writes=1, bytes_written=w.size)
        return True

    def _release(self, tmp: str) -> None:
        """Give up reservation ``tmp`` and its temp file."""
        with contextlib.suppress(FileNotFoundError):
            (self._tmp / tmp).unlink()
        try:
            with self._m.update() as m:
                m["reserved"].pop(tmp, None)
        except (Unavailable, OSError) as exc:  # a dead-writer sweep will drop it
            self._warn("release", str(exc))

    def _name(self, url: str) -> str:
        return redact(url, secrets=self._secrets)

    def _warn(self, what: str, message: str) -> None:
        """WARNING once per kind of failure (per reader), DEBUG after that."""
        level = logging.DEBUG if what in self._warned else logging.WARNING
        self._warned.add(what)
        log.log(level, "streambuf: cache: %s", message)


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
