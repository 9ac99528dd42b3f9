"""``iter_tar_samples``: a streaming tar reader yielding WebDataset samples.

Its own 512-byte header parser (ustar, GNU long names, pax ``path``/``size``) rather than
``tarfile``: ``tarfile`` reads GNU long-name and pax header payloads whole, with a size
taken from the (untrusted) header, before the caller sees anything. Here every size is
checked before a byte of it is read, and memory is bounded by one sample.

Grouping follows webdataset exactly (``webdataset.tariterators``):

* key = member path up to the first dot of its basename, directories kept
  (``a/b/000001.jpg`` -> key ``a/b/000001``, field ``jpg``; ``x.seg.png`` -> field
  ``seg.png``); fields are lower-cased; a member without a dot in its basename is skipped;
* consecutive members with the same key form one sample; a field repeated within one
  sample is an error;
* skipped: non-regular members (directories, links, devices) and names matching
  ``__[^/]*__($|/)`` at the start (webdataset's metadata entries, e.g. ``__meta__/x``).

Each sample is ``{"__key__": key, "__url__": url, field: bytes, ...}``; ``__url__`` is the
redacted URL. A gzip stream (``.tar.gz``/``.tgz``, detected by its magic bytes) is
inflated on the fly, never more than the bytes asked for at a time.

Limits (all checked before reading the bytes they bound):
``max_member_bytes`` per member, ``max_sample_bytes`` per sample, ``max_shard_bytes`` for
the whole (decompressed) tar stream, which bounds the work a decompression bomb can cause.

Errors: ``ShardError`` with stage ``"tar"`` naming the URL and the member (a truncated
stream, a bad checksum, a size over a limit, a missing end-of-archive marker; a stream
ending exactly between members is also truncation). Errors from ``fileobj.read`` keep
their type and get a note naming the member.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import Any, Protocol

from ..errors import ShardError, StageError, add_note
from .urls import redact

__all__ = ["iter_tar_samples"]

_BLOCK = 512
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_MAX_META_BYTES = 1 << 20  # GNU long names and pax records
_REGULAR = (b"0", b"\0", b"7")
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16


class Readable(Protocol):
    """What ``iter_tar_samples`` needs: ``read(n)`` returning up to ``n`` bytes."""

    def read(self, n: int = ..., /) -> bytes: ...


class _TarError(Exception):
    pass


class _Input:
    """Exact reads from a binary stream, optionally gunzipped, with a total-bytes bound."""

    def __init__(self, fileobj: Readable, *, max_bytes: int | None) -> None:
        self._f = fileobj
        self._max = max_bytes
        self.pos = 0  # bytes of the (decompressed) tar stream consumed
        head = self._raw(2)
        self._pending = head
        self._gz: Any = zlib.decompressobj(31) if head == _GZIP_MAGIC else None

    def _raw(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self._f.read(n - len(out))
            if not chunk:
                break
            out += chunk
        return out

    def _inflate(self, n: int) -> bytes:
        parts: list[bytes] = []
        need = n
        while need:
            d = self._gz
            data = d.unconsumed_tail or self._pending or self._f.read(_CHUNK)
            self._pending = b""
            if not data:
                if d.eof:
                    break
                raise _TarError("truncated gzip stream")
            piece = d.decompress(data, need)
            parts.append(piece)
            need -= len(piece)
            if d.eof:  # concatenated gzip members are one stream
                rest = d.unused_data
                self._gz = zlib.decompressobj(31)
                self._pending = rest
                if not rest:
                    nxt = self._f.read(_CHUNK)
                    if not nxt:
                        self._gz = d  # remember we ended cleanly
                        break
                    self._pending = nxt
        return b"".join(parts)

    def read(self, n: int) -> bytes:
        if self._max is not None:
            n = min(n, self._max - self.pos + 1)  # read at most one byte past the limit
        if self._gz is not None:
            try:
                data = self._inflate(n)
            except zlib.error as exc:
                raise _TarError(f"corrupt gzip stream: {exc}") from exc
        else:
            data = self._pending[:n]
            self._pending = self._pending[n:]
            if len(data) < n:
                data += self._raw(n - len(data))
        self.pos += len(data)
        if self._max is not None and self.pos > self._max:
            raise _TarError(
                f"the tar stream is larger than max_shard_bytes={self._max} "
                "(a decompression bomb or a limit set too low)"
            )
        return data

    def skip(self, n: int) -> int:
        got = 0
        while got < n:
            chunk = self.read(min(_CHUNK, n - got))
            if not chunk:
                break
            got += len(chunk)
        return got

    def drain(self) -> None:
        """Read a gzip stream to its end so that its CRC is checked (bounded by max_bytes)."""
        if self._gz is not None:
            while self.read(_CHUNK):
                pass


def _number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        if field[0] == 0xFF:
            raise _TarError("negative number in header")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise _TarError(f"invalid number field {field!r} in header") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _checksum_ok(hdr: bytes) -> bool:
    stored = _number(hdr[148:156])
    unsigned = sum(hdr[:148]) + 8 * 32 + sum(hdr[156:])
    signed = unsigned - 2 * sum(b for b in hdr[:148] + hdr[156:] if b > 127)
    return stored in (unsigned, signed)


def _pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        m = re.match(rb"(\d+) ", data[pos:])
        if not m or int(m.group(1)) <= 0:
            raise _TarError("malformed pax header")
        length = int(m.group(1))
        record = data[pos + m.end() : pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def iter_tar_samples(
    fileobj: Readable,
    /,
    *,
    url: str,
    max_member_bytes: int = 1 << 30,
    max_sample_bytes: int | None = None,
    max_shard_bytes: int | None = 64 << 30,
) -> Iterator[dict[str, Any]]:
    """Stream ``fileobj`` (a tar or tar.gz) and yield one dict per sample.

    Args:
        fileobj: a binary stream, read sequentially; never rewound or closed here.
        url: the shard's URL or path, for ``__url__`` and messages (redacted here).
        max_member_bytes: refuse a member whose header claims more bytes than this.
        max_sample_bytes: refuse a sample whose fields add up to more than this.
        max_shard_bytes: refuse a (decompressed) tar stream longer than this.

    Yields:
        ``{"__key__": str, "__url__": str, "<field>": bytes, ...}``, in tar order.

    Raises:
        ShardError: stage ``"tar"``, naming the URL and the member (see module docstring).
    """
    source = redact(url)
    member = "<first header>"
    try:
        inp = _Input(fileobj, max_bytes=max_shard_bytes)
        sample: dict[str, Any] | None = None
        sample_bytes = 0
        long_name: str | None = None
        pax: dict[str, str] = {}
        while True:
            hdr = inp.read(_BLOCK)
            if not hdr:
                raise _TarError("stream ended without an end-of-archive marker")
            if len(hdr) < _BLOCK:
                raise _TarError(f"truncated header ({len(hdr)} of 512 bytes)")
            if hdr == bytes(_BLOCK):
                break
            if not _checksum_ok(hdr):
                raise _TarError(f"bad header checksum at byte {inp.pos - _BLOCK}")
            kind = hdr[156:157]
            size = _number(hdr[124:136])
            name = _text(hdr[0:100])
            if hdr[257:263] == b"ustar\x00" and hdr[345] != 0:
                name = _text(hdr[345:500]) + "/" + name
            if long_name is not None:
                name, long_name = long_name, None
            if "path" in pax:
                name = pax["path"]
            if "size" in pax:
                size = int(pax["size"])
            pax = {}
            member = name
            padded = -size % _BLOCK
            if kind in (b"L", b"K", b"x", b"g"):
                if size > _MAX_META_BYTES:
                    raise _TarError(f"extended header of {size} bytes (limit {_MAX_META_BYTES})")
                data = inp.read(size)
                if len(data) < size or inp.skip(padded) < padded:
                    raise _TarError("truncated extended header")
                if kind == b"L":
                    long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif kind == b"x":
                    pax = _pax(data)
                continue
            if size > max_member_bytes:
                raise _TarError(
                    f"member claims {size} bytes, more than max_member_bytes={max_member_bytes}"
                )
            m = _KEY.match(name) if kind in _REGULAR and not _META.match(name) else None
            if m is None:
                if inp.skip(size + padded) < size + padded:
                    raise _TarError(f"truncated member data (expected {size} bytes)")
                continue
            key, field = m.group(1), m.group(2).lower()
            if sample is not None and sample["__key__"] != key:
                yield sample
                sample, sample_bytes = None, 0
            if sample is None:
                sample = {"__key__": key, "__url__": source}
            if field in sample:
                raise _TarError(f"field {field!r} appears twice in sample {key!r}")
            if max_sample_bytes is not None and sample_bytes + size > max_sample_bytes:
                raise _TarError(f"sample {key!r} exceeds max_sample_bytes={max_sample_bytes}")
            data = inp.read(size)
            if len(data) < size:
                raise _TarError(f"truncated member data ({len(data)} of {size} bytes)")
            if inp.skip(padded) < padded:
                raise _TarError("truncated padding after member data")
            sample[field] = data
            sample_bytes += size
        if sample is not None:
            yield sample
        inp.drain()
    except _TarError as exc:
        raise ShardError(f"{exc} (member {member!r})", stage="tar", source=source) from exc
    except StageError as exc:
        add_note(exc, f"streambuf: while reading tar member {member!r} of {source}")
        raise
    except (OSError, EOFError, ValueError) as exc:
        raise ShardError(
            f"{type(exc).__name__}: {redact(exc)} (member {member!r})", stage="tar", source=source
        ) from exc
