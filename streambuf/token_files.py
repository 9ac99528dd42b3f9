"""``token_files``: flat token files read as fixed-length blocks by byte ranges.

The layout of nanoGPT-style and LitData-style pipelines: each file is a flat array of
token ids (``uint16`` for vocabularies up to 65,536, else ``uint32``), no header. Block
``b`` of a file is tokens ``[b * seq_len, b * seq_len + seq_len + overlap)`` (``overlap=1``:
the next-token target of the last position too), read with one ranged request of its
bytes (a local file: one ``os.pread`` on a descriptor kept per file and worker, at most
64, closed when the pipeline is collected; else
``streambuf.io.open_stream``: HTTP ``Range`` with
resume at the offset after a dropped connection, any fsspec URL). The blocks of all files
are the pipeline's items: shuffled across and within files by ``(seed, epoch)``, split
over rank x worker, resumed exactly or elastically by the pipeline's own machinery (a
block is an item: its position is its number). Each output is ``{"tokens": int64
[seq_len + overlap], "__url__": file, "block": b}`` (``keep_dtype=True``: the file's
dtype).

With ``cache_dir``, a remote file is copied whole into the node-local shard cache at its
first block and read from there (``os.pread`` on the copy, which is never evicted while
open); a file the cache cannot take now is read remotely and tried again a second later.

File sizes are read once, when the pipeline is built (a local ``stat``, a ranged request
elsewhere); a size that is not a multiple of the dtype's is a clear error naming the file.
Tokens at the end of a file that do not fill a block are not read (as nanoGPT's loader).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ._identity import shard_names
from ._units import check_bool, check_int, parse_count
from .io.cache import cached_file
from .io.opener import open_stream
from .io.urls import UrlSpec, expand_urls, redact, secrets_of
from .pipeline import Pipeline
from .sources.options import check_cache_options

__all__ = ["token_files"]

_MAX_FDS = 64  # descriptors kept open per worker (local files, the cache's copies)
_RETRY_S = 1.0  # a file the cache could not take now: read remotely, try again after
_DTYPES = ("uint8", "uint16", "int32", "uint32", "int64")


class _Blocks(Sequence[tuple[int, int]]):
    """Every block of every file as ``(file, block)``, by one global number.

    A saved position is a block number, which means a file and a block only for the
    same files in the same order: ``state_identity()`` (in the state's fingerprint) is a
    digest of the files' names (``streambuf._identity.shard_names``: a moved folder or a
    re-signed URL keeps it; the trailing folders that tell apart files of one name)
    and block counts, so a state does not load into a list that is reordered, or that
    swaps a file for another with as many blocks."""

    def __init__(self, counts: Sequence[int], names: Sequence[str | None] = ()) -> None:
        self.starts = [0]
        for c in counts:
            self.starts.append(self.starts[-1] + c)
        listed = json.dumps([list(names), list(counts)]).encode()
        self._identity = f"token_files:{len(counts)}:{hashlib.sha256(listed).hexdigest()[:16]}"

    def state_identity(self) -> str:
        return self._identity

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        f = bisect.bisect_right(self.starts, i) - 1
        return f, i - self.starts[f]


class _Handles:
    """This process's open files, by file number: at most ``_MAX_FDS``, the least
    recently used closed first once no thread reads it (thread-safe; opened outside the
    lock, so one slow open, a cache download, never holds up reads of other files)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: OrderedDict[int, list[Any]] = OrderedDict()  # f -> [fd, close, users]
        self.retry_at: dict[int, float] = {}  # f -> when to try caching it again
        # the descriptors are closed when these handles are collected (with the
        # pipeline that owns them), not left open for the life of the process
        # (not at exit: a daemon thread may still be in a pread there; the OS closes them)
        weakref.finalize(self, _close_all, self.open).atexit = False

    def acquire(
        self, f: int, opener: Callable[[], tuple[int, Callable[[], None]] | None]
    ) -> int | None:
        """A descriptor of file ``f`` (release it after), or None: read it remotely."""
        with self.lock:
            entry = self.open.get(f)
            if entry is not None:
                entry[2] += 1
                self.open.move_to_end(f)
                return int(entry[0])
            if self.retry_at.get(f, 0.0) > time.monotonic():
                return None
        got = opener()
        with self.lock:
            if got is None:
                self.retry_at[f] = time.monotonic() + _RETRY_S
                return None
            entry = self.open.get(f)
            if entry is not None:  # another thread opened it meanwhile: keep theirs
                got[1]()
            else:
                entry = self.open[f] = [got[0], got[1], 0]
            entry[2] += 1
            self.open.move_to_end(f)
            self._trim()
            return int(entry[0])

    def release(self, f: int) -> None:
        with self.lock:
            self.open[f][2] -= 1
            self._trim()

    def _trim(self) -> None:
        """Close the least recently used descriptors no thread reads, down to the bound
        (one in use stays open past it until released). Called holding the lock."""
        excess = len(self.open) - _MAX_FDS
        if excess > 0:
            for old in [k for k, e in self.open.items() if e[2] == 0][:excess]:
                self.open.pop(old)[1]()


def _close_all(handles: OrderedDict[int, list[Any]]) -> None:
    while handles:
        handles.popitem()[1][1]()


class _ReadBlock:
    """A block's tokens, read by one ranged request (picklable: runs in the workers)."""

    def __init__(
        self,
        urls: list[str],
        dtype: str,
        seq_len: int,
        overlap: int,
        kw: dict[str, Any],
        cache: tuple[str, int] | None,
        keep_dtype: bool = False,
    ) -> None:
        self.urls, self.dtype, self.seq_len, self.overlap, self.kw = (
            urls,
            dtype,
            seq_len,
            overlap,
            kw,
        )
        self.cache = cache
        self.keep_dtype = keep_dtype
        self.__name__ = "read_block"
        self._handles: _Handles | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": None, "_pid": 0}  # descriptors stay here

    def _opener(self, url: str) -> Callable[[], tuple[int, Callable[[], None]] | None]:
        if _is_local(url):

            def local() -> tuple[int, Callable[[], None]]:
                fd = os.open(url.removeprefix("file://"), os.O_RDONLY)
                return fd, lambda: os.close(fd)

            return local
        cache = self.cache
        assert cache is not None

        def cached() -> tuple[int, Callable[[], None]] | None:
            f = cached_file(url, cache_dir=cache[0], cache_limit=cache[1], **self.kw)
            return None if f is None else (f.fileno(), f.close)

        return cached

    def __call__(self, item: tuple[int, int]) -> dict[str, Any]:
        f, b = item
        size = np.dtype(self.dtype).itemsize
        count = self.seq_len + self.overlap
        url = self.urls[f]
        at, length = b * self.seq_len * size, count * size
        if self._pid != os.getpid():  # (a forked worker: its own descriptors)
            self._handles, self._pid = _Handles(), os.getpid()
        handles = self._handles
        assert handles is not None
        fd = None
        if self.cache is not None or _is_local(url):  # a local file or the cache's copy
            fd = handles.acquire(f, self._opener(url))
        if fd is not None:
            try:
                data = os.pread(fd, length, at)
            finally:
                handles.release(f)
        else:
            with open_stream(url, offset=at, length=length, **self.kw) as r:
                data = r.read(length)
        if len(data) != count * size:
            raise ValueError(
                f"token_files: {redact(url, secrets=secrets_of(self.kw.get('storage_options')))}"
                f" gave {len(data)} bytes for block {b}, expected {count * size}: the file "
                "shrank since the pipeline was built"
            )
        array = np.frombuffer(data, dtype=self.dtype)
        tokens = torch.from_numpy(array.copy() if self.keep_dtype else array.astype(np.int64))
        return {"tokens": tokens, "__url__": url, "block": b}


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _size(url: str, kw: dict[str, Any]) -> int:
    if _is_local(url):
        path = url.removeprefix("file://")
        if os.path.isdir(path):
            raise ValueError(
                f"token_files: {path} is a directory, not a token file: list the files in "
                f"it (e.g. {os.path.join(path, '*.bin')!r})"
            )
        return os.path.getsize(path)
    with open_stream(url, length=1, **kw) as r:
        size = r.size
    if size is None:
        raise ValueError(f"token_files: the size of {url} is unknown (the server sent none)")
    return size


def token_files(
    urls: UrlSpec,
    /,
    *,
    seq_len: int,
    dtype: str = "uint16",
    overlap: int = 0,
    shuffle: bool = True,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    threads: int | str = "auto",
    storage_options: Mapping[str, Any] | None = None,
    retries: int = 5,
    timeout_s: float = 30.0,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    keep_dtype: bool = False,
) -> Pipeline:
    """Flat token files as a ``Pipeline`` of blocks of ``seq_len`` (+ ``overlap``) tokens
    (module docstring). ``threads``: blocks read at once in each worker (the default
    ``"auto"`` measures: reads inline where a thread does not pay, a local file; more
    threads while they raise the rate, remote latency). ``cache_dir``/``cache_limit``: the node-local shard cache
    (docs/cache.md) for remote files: a file is downloaded whole into it at its first
    block, later blocks (and epochs) are local reads; a file that does not fit, or that
    another process is downloading, is read remotely meanwhile. ``keep_dtype=True``:
    tokens in the file's dtype (``torch.uint16`` for uint16 files: a quarter of int64's
    bytes through the workers and to the device; cast there, ``x.cuda().long()``), else
    int64. Add ``.batch(n)`` and give it to a ``Loader``."""
    seq_len = parse_count(seq_len, name="seq_len")
    overlap = check_int(overlap, name="overlap")
    if overlap < 0:
        raise ValueError(f"token_files(overlap={overlap}) must be >= 0 (1: next-token targets)")
    if dtype not in _DTYPES:
        raise ValueError(f"token_files(dtype={dtype!r}) must be one of {', '.join(_DTYPES)}")
    cache_dir, cache_limit = check_cache_options(cache_dir, cache_limit)
    files = expand_urls(urls, storage_options=storage_options)
    if not files:
        raise ValueError(f"token_files({urls!r}): no files")
    kw: dict[str, Any] = {"retries": retries, "timeout_s": timeout_s}
    if storage_options is not None:
        kw["storage_options"] = dict(storage_options)
    itemsize = np.dtype(dtype).itemsize
    counts = []
    for url in files:
        size = _size(url, kw)
        if size % itemsize:
            raise ValueError(
                f"token_files: {redact(url, secrets=secrets_of(storage_options))} has {size} "
                f"bytes, not a multiple of {itemsize} ({dtype}): not a flat {dtype} token "
                "file (another dtype=, or a header to strip?)"
            )
        counts.append(max(0, (size // itemsize - overlap) // seq_len))
    names = shard_names(files)  # (a/chunk-0.bin, b/chunk-0.bin: the folders tell)
    blocks = _Blocks(counts, names or ())
    pipe = Pipeline(
        blocks,
        shuffle_shards=shuffle,
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    cache = None if cache_dir is None or cache_limit is None else (cache_dir, cache_limit)
    read = _ReadBlock(
        files, dtype, seq_len, overlap, kw, cache, check_bool(keep_dtype, name="keep_dtype")
    )
    return pipe.map(read, threads=threads)
