"""``iter_tar_samples``: a streaming tar reader yielding WebDataset samples.

Its own 512-byte header parser (ustar, GNU long names, pax ``path``/``size``) rather than
``tarfile``: ``tarfile`` reads GNU long-name and pax header payloads whole, with a size
taken from the (untrusted) header, before the caller sees anything. Here every size is
checked before a byte of it is read, and memory is bounded by one sample.

No smuggling: every member yielded is one that ``tarfile`` (and so webdataset) lists for
the same bytes, with the same name and data (``tests/sources/test_tar_fuzz.py`` checks
this against ``tarfile``). Names are read as ``tarfile`` reads them (the ustar prefix
joined in any header but GNU long-name ones, a pax ``path`` without trailing slashes);
what two tar readers may read differently is refused rather than guessed:

* number fields that are not plain octal (signs, ``_``, ``0o``, non-ASCII; GNU base-256
  is accepted, negative only where a size is not involved); a pax ``size`` that is not a
  non-negative decimal integer (``size=-512`` would make a member's data parse as
  headers);
* pax records that do not exactly fill their header, non-zero padding after an extended
  header, two pax or two long-name headers for one member, or both a long name and a
  pax ``path``; a global pax header setting ``path`` or ``size``; GNU sparse members;
* a directory, link, device or FIFO entry claiming data bytes (``tarfile`` skips none,
  POSIX skips them for directories). Solaris ``X`` headers are pax headers, as in
  ``tarfile``.

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
from ..io.urls import redact

__all__ = ["iter_tar_records", "iter_tar_samples"]

_BLOCK = 512
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_MAX_META_BYTES = 1 << 20  # GNU long names and pax records
_REGULAR = (b"0", b"\0", b"7")
_EXTENDED = (b"L", b"K", b"x", b"X", b"g")  # GNU long name/link, pax (X: Solaris), global
_NO_DATA = {b"1": "hard link", b"2": "symlink", b"3": "device", b"4": "device"}
_NO_DATA |= {b"5": "directory", b"6": "FIFO"}
_NUMBERS = {"mode": (100, 108), "uid": (108, 116), "gid": (116, 124), "mtime": (136, 148)}
_NUMBERS |= {"devmajor": (329, 337), "devminor": (337, 345)}
# mode, uid, gid, mtime and dev fields (header bytes 100-124, 136-148, 329-345) already
# checked: a tar's members mostly share them, so each distinct value is parsed once
_VALID_NUMBERS: set[bytes] = set()
_OCTAL = re.compile(rb"[0-7]*")
_PAX_RECORD = re.compile(rb"([0-9]{1,20}) ([^=]+)=")
_PAX_CHARSET = re.compile(rb"\d+ hdrcharset=([^\n]+)\n")
_PAX_SIZE = re.compile(r"[0-9]{1,20}")
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
        self.owed = 0  # padding after the last member's data, skipped by ``header()``
        head = self._raw(2)
        self._pending = head
        self._gz: Any = zlib.decompressobj(31) if head == _GZIP_MAGIC else None
        self.plain = self._gz is None  # byte offsets of the stream are offsets of the file

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
        elif self._pending:
            data = self._pending[:n]
            self._pending = self._pending[n:]
            if len(data) < n:
                data += self._raw(n - len(data))
        else:  # the common case: one call, a full read unless the stream ends or is split
            data = self._f.read(n)
            if 0 < len(data) < n:
                data += self._raw(n - len(data))
        self.pos += len(data)
        if self._max is not None and self.pos > self._max:
            raise _TarError(
                f"the tar stream is larger than max_shard_bytes={self._max} "
                "(a decompression bomb or a limit set too low)"
            )
        return data

    def header(self) -> bytes:
        """The next 512-byte block, after the padding ``owed`` by the last member (one read
        for both); raises when the stream ends inside that padding."""
        owed, self.owed = self.owed, 0
        if not owed:
            return self.read(_BLOCK)
        block = self.read(owed + _BLOCK)
        if len(block) < owed:
            raise _TarError("truncated padding after member data")
        return block[owed:]

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


def _number(field: bytes, *, what: str, signed: bool = False) -> int:
    """A header number as ``tarfile`` reads it, but stricter: octal digits padded with
    spaces/NULs, or GNU base-256 (first byte 0x80; 0xFF for negative, refused unless
    ``signed``). Signs, underscores, ``0o`` and non-ASCII digits are refused."""
    if field[:1] in (b"\x80", b"\xff"):
        n = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            if not signed:
                raise _TarError(f"negative {what} in header")
            n -= 256 ** (len(field) - 1)
        return n
    text = field.split(b"\0", 1)[0].strip(b" ")
    if text.isdigit() and not text.translate(None, b"01234567"):  # the common case
        return int(text, 8)
    if not _OCTAL.fullmatch(text):
        raise _TarError(f"invalid {what} field {field!r} in header")
    return int(text or b"0", 8)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


_HIGH = bytes(range(128, 256))


def _checksum_ok(hdr: bytes) -> bool:
    """The header checksum, as unsigned bytes (POSIX) or signed chars (old tars)."""
    stored = _number(hdr[148:156], what="checksum", signed=True)
    unsigned = sum(hdr) - sum(hdr[148:156]) + 8 * 32  # the field counts as 8 spaces
    if stored == unsigned:
        return True
    body = hdr[:148] + hdr[156:]
    high = len(body) - len(body.translate(None, _HIGH))  # bytes > 127, as signed chars
    return stored == unsigned - 256 * high


def _pax(data: bytes) -> dict[str, str]:
    """Records ``"<length> <key>=<value>\\n"`` that exactly fill ``data``; else an error
    (``tarfile`` silently stops at the first bad record and keeps the ones before)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        m = _PAX_RECORD.match(data, pos)
        end = pos + int(m.group(1)) if m else 0
        if m is None or not m.end() < end <= len(data) or data[end - 1] != 0x0A:
            raise _TarError(f"malformed pax record at byte {pos} of a pax header")
        key = m.group(2).decode("utf-8", "surrogateescape")
        out[key] = data[m.end() : end - 1].decode("utf-8", "surrogateescape")
        pos = end
    charset = _PAX_CHARSET.search(data)  # tarfile looks for it anywhere, then decodes it
    if charset is not None and not charset.group(1).isascii():
        raise _TarError("pax hdrcharset is not ASCII")
    return out


def _sparse(key: str) -> bool:
    return key.startswith("GNU.sparse.")


def _pax_size(value: str) -> int:
    if not _PAX_SIZE.fullmatch(value):
        raise _TarError(f"pax size {value[:40]!r} is not a non-negative decimal integer")
    return int(value)


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
    for _, _, _, sample in iter_tar_records(
        fileobj,
        url=url,
        max_member_bytes=max_member_bytes,
        max_sample_bytes=max_sample_bytes,
        max_shard_bytes=max_shard_bytes,
    ):
        yield sample


def iter_tar_records(
    fileobj: Readable,
    /,
    *,
    url: str,
    base_offset: int = 0,
    first_index: int = 0,
    limit: int | None = None,
    max_member_bytes: int = 1 << 30,
    max_sample_bytes: int | None = None,
    max_shard_bytes: int | None = 64 << 30,
) -> Iterator[tuple[int, int | None, int | None, dict[str, Any]]]:
    """``iter_tar_samples`` with positions: yields ``(index, start, end, sample)``.

    ``index`` counts samples from ``first_index``; ``start`` is the byte offset (in the
    shard) of the sample's first header (extended headers included) and ``end`` that of
    whatever follows it, so a reader can resume after sample ``index`` by opening the
    shard at ``end`` with ``first_index=index + 1``, or fetch it alone by opening at
    ``start`` with ``limit=1``. ``fileobj`` starts at ``base_offset`` of the shard (a
    header boundary). Offsets are None for a gzip stream (it cannot be entered in the
    middle: resume it by index). With ``limit``, stop after that many samples, reading
    nothing further (no end-of-archive check; the stream may end right after the last
    one, as a bounded ranged fetch does).
    """
    source = redact(url)
    member = "<first header>"
    try:
        inp = _Input(fileobj, max_bytes=max_shard_bytes)
        plain = inp.plain
        sample: dict[str, Any] | None = None
        sample_bytes = 0
        long_name: str | None = None
        pax: dict[str, str] | None = None
        index = first_index
        start = chain = base_offset
        while True:
            if long_name is None and pax is None:  # a member's first header starts here
                chain = base_offset + inp.pos + inp.owed
            hdr = inp.header()
            if not hdr:
                if limit is not None and sample is not None:  # a bounded fetch ends here
                    yield index, start if plain else None, chain if plain else None, sample
                    return
                raise _TarError("stream ended without an end-of-archive marker")
            if len(hdr) < _BLOCK:
                raise _TarError(f"truncated header ({len(hdr)} of 512 bytes)")
            if hdr == bytes(_BLOCK):
                chain = base_offset + inp.pos - _BLOCK
                break
            if not _checksum_ok(hdr):
                raise _TarError(f"bad header checksum at byte {inp.pos - _BLOCK}")
            kind = hdr[156:157]
            raw_name, prefix = _text(hdr[0:100]), _text(hdr[345:500])
            name = f"{prefix}/{raw_name}" if prefix and kind not in (b"L", b"K") else raw_name
            member = name
            size = _number(hdr[124:136], what="size")
            numbers = hdr[100:124] + hdr[136:148] + hdr[329:345]  # mostly the same in a tar
            if numbers not in _VALID_NUMBERS:
                for what, (a, b) in _NUMBERS.items():  # tarfile stops at a header it cannot read
                    _number(hdr[a:b], what=what, signed=True)
                if len(_VALID_NUMBERS) > 4096:
                    _VALID_NUMBERS.clear()
                _VALID_NUMBERS.add(numbers)
            if kind in _EXTENDED:
                if size > _MAX_META_BYTES:
                    raise _TarError(f"extended header of {size} bytes (limit {_MAX_META_BYTES})")
                data, pad = inp.read(size), inp.read(-size % _BLOCK)
                if len(data) < size or len(pad) < -size % _BLOCK:
                    raise _TarError("truncated extended header")
                if pad.strip(b"\0"):  # tarfile parses the padding too; others do not
                    raise _TarError("non-zero padding after an extended header")
                if kind == b"L":
                    if long_name is not None:
                        raise _TarError("two GNU long-name headers for one member")
                    long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif kind in (b"x", b"X"):
                    if pax is not None:
                        raise _TarError("two pax headers for one member")
                    pax = _pax(data)
                elif kind == b"g":
                    bad = [k for k in _pax(data) if k in ("path", "size") or _sparse(k)]
                    if bad:
                        raise _TarError(
                            f"a global pax header sets {bad[0]!r}, which tar readers apply "
                            "to later members differently"
                        )
                continue
            pax = pax or {}
            if long_name is not None and "path" in pax:
                raise _TarError("both a GNU long name and a pax path for one member")
            if "path" in pax:
                name = pax["path"].rstrip("/")
            elif long_name is not None:
                name = long_name
            member = name
            if kind == b"S" or any(_sparse(k) for k in pax):
                raise _TarError("GNU sparse members are not supported")
            if "size" in pax:
                size = _pax_size(pax["size"])
            long_name, pax = None, None
            padded = -size % _BLOCK
            if kind in _NO_DATA or (kind == b"\0" and raw_name.endswith("/")):
                if size:  # tarfile skips no data for these types, POSIX does for directories
                    raise _TarError(
                        f"a {_NO_DATA.get(kind, 'directory')} entry claims {size} data bytes; "
                        "tar readers disagree on whether they follow"
                    )
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
                yield index, start if plain else None, chain if plain else None, sample
                index += 1
                sample, sample_bytes = None, 0
                if limit is not None and index - first_index >= limit:
                    return
            if sample is None:
                sample = {"__key__": key, "__url__": source}
                start = chain
            if field in sample:
                raise _TarError(f"field {field!r} appears twice in sample {key!r}")
            if max_sample_bytes is not None and sample_bytes + size > max_sample_bytes:
                raise _TarError(f"sample {key!r} exceeds max_sample_bytes={max_sample_bytes}")
            data = inp.read(size)
            if len(data) < size:
                raise _TarError(f"truncated member data ({len(data)} of {size} bytes)")
            inp.owed = padded  # skipped with the next header's read
            sample[field] = data
            sample_bytes += size
        if sample is not None:
            yield index, start if plain else None, chain if plain else None, sample
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
