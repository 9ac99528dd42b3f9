"""Fuzz ``iter_tar_samples`` with Python's ``tarfile`` as the oracle.

Inputs: (a) random bytes and random 512-byte headers with valid checksums; (b) small valid
shards written by ``tarfile`` (ustar, GNU, pax; long names, directories, links, members
whose data is itself a tar header, gzip), then mutated: flipped bytes, truncation,
spliced or deleted ranges, header fields overwritten (size, type, name, prefix, numbers,
checksum) with the checksum recomputed, and extended headers (pax ``x``/``X``/``g``, GNU
``L``) inserted with crafted records, so that mutations get past the checksum and reach
the parser's logic.

The oracle, and why: webdataset reads the layout through ``tarfile``, so "the members of
these bytes" means what ``tarfile`` lists. The danger is *smuggling*: a member that one
reader sees and another does not, or other bytes for the same member. So, for any input:

1. the parser terminates (input in memory; a guard fails the test if it keeps calling
   ``read`` after the end; a per-example deadline; the pytest timeout) and raises nothing
   but ``ShardError``;
2. the ``(key, field, bytes)`` members it yields, in order, are a subsequence of
   ``tarfile``'s view: the regular members (same grouping rules) that ``tarfile`` lists,
   with the bytes ``extractfile`` returns, up to where ``tarfile`` stops. ``tarfile``
   stops at the end marker, *silently* at a header it finds invalid, at an exception
   (also when it cannot open the bytes at all: then nothing may be yielded), and here
   also at a member with a negative size, where the 3.11 ``tarfile`` would seek backwards
   (and can loop). streambuf may refuse more (it is stricter: ``ShardError``), never show
   more;
3. if it ends without an error, it yielded exactly ``tarfile``'s view (it skipped no
   member that ``tarfile`` sees, which would also be a disagreement).
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
import zlib
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streambuf.errors import ShardError
from streambuf.sources import iter_tar_samples

SCALE = int(os.environ.get("STREAMBUF_FUZZ_SCALE", "1"))  # e.g. 100 for a long local run
pytestmark = pytest.mark.timeout(60 * SCALE)
SETTINGS = settings(
    max_examples=100 * SCALE,
    deadline=timedelta(seconds=2),  # generous on a loaded 2-core machine; a hang is minutes
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's grouping rule
_META = re.compile(r"__[^/]*__($|/)")
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
Member = tuple[str, str, bytes]
Mutation = tuple[Any, ...]


class Runaway(Exception):
    """The parser kept reading after the end of its input."""


class Guarded:
    """``read`` over bytes in memory that fails once called far more often than a
    forward parse needs (a loop at end-of-input would otherwise spin until the timeout)."""

    def __init__(self, data: bytes) -> None:
        self._f = io.BytesIO(data)
        self._calls_left = 64 + 8 * (len(data) // 512)

    def read(self, n: int = -1, /) -> bytes:
        self._calls_left -= 1
        if self._calls_left < 0:
            raise Runaway("read called too often: the parser does not progress")
        return self._f.read(n)


def streambuf_view(data: bytes) -> tuple[list[Member], ShardError | None]:
    got: list[Member] = []
    try:
        for s in iter_tar_samples(Guarded(data), url="fuzz://x.tar", max_shard_bytes=1 << 20):
            assert s["__url__"] == "fuzz://x.tar"
            got += [(s["__key__"], k, v) for k, v in s.items() if not k.startswith("__")]
    except ShardError as exc:
        assert exc.stage == "tar" and "fuzz://x.tar" in str(exc)
        return got, exc
    return got, None


def _gzip_header_end(data: bytes) -> int | None:
    """Offset of the deflate data of the gzip member at the start of ``data``."""
    if len(data) < 10 or data[:2] != b"\x1f\x8b" or data[2] != 8:
        return None
    flags, pos = data[3], 10
    if flags & 4:  # FEXTRA
        if len(data) < pos + 2:
            return None
        pos += 2 + int.from_bytes(data[pos : pos + 2], "little")
    for bit in (8, 16):  # FNAME, FCOMMENT: zero-terminated
        if flags & bit:
            end = data.find(b"\0", pos)
            if end < 0:
                return None
            pos = end + 1
    if flags & 2:  # FHCRC
        pos += 2
    return pos if pos <= len(data) else None


def gunzip_prefix(data: bytes) -> bytes:
    """What a streaming inflater can hand out of a (maybe damaged) .tar.gz before it
    fails: raw deflate output, byte by byte, members concatenated. The CRC is only known
    at a member's end, so damaged-but-inflatable bytes before it are seen too."""
    out: list[bytes] = []
    while (start := _gzip_header_end(data)) is not None:
        d = zlib.decompressobj(-15)
        try:
            for i in range(start, len(data)):
                out.append(d.decompress(data[i : i + 1]))
                if d.eof:
                    break
        except zlib.error:
            break
        if not d.eof:
            break
        data = d.unused_data[8:]  # the CRC and size trailer
    return b"".join(out)


def tarfile_view(data: bytes) -> list[Member]:
    """Members Python's tarfile lists; for gzip, in the bytes that inflate before any
    damage (tarfile's own gzip reader reads ahead and fails earlier than a stream does)."""
    out: list[Member] = []
    if data[:2] == b"\x1f\x8b":
        data = gunzip_prefix(data)
    try:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except Exception:
        return out
    with tf:
        last = -1
        while True:
            try:
                m = tf.next()
            except Exception:
                return out
            if m is None or m.size < 0 or m.offset <= last:
                return out
            last = m.offset
            k = _KEY.match(m.name)
            if m.type not in _REGULAR or _META.match(m.name) or k is None:
                continue
            try:
                f = tf.extractfile(m)
                body = f.read() if f is not None else b""
            except Exception:
                return out
            if len(body) != m.size:
                return out
            out.append((k.group(1), k.group(2).lower(), body))


def is_subsequence(small: list[Member], big: list[Member]) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def check(data: bytes) -> None:
    got, err = streambuf_view(data)
    want = tarfile_view(data)
    assert is_subsequence(got, want), f"smuggled: {got} not within tarfile's {want}"
    if err is None:
        assert got == want, "streambuf skipped members that tarfile lists"


# -- building and mutating shards --------------------------------------------------------


def checksum(block: bytearray) -> None:
    block[148:156] = b"%06o\0 " % (256 + sum(block[:148]) + sum(block[156:]))


def has_checksum(block: bytes) -> bool:
    try:
        stored = int(block[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return False
    return stored == 256 + sum(block[:148]) + sum(block[156:])


def record(key: str, value: str, delta: int = 0) -> bytes:
    body = f" {key}={value}\n".encode(errors="surrogateescape")
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return f"{n + delta}".encode() + body


def ext_header(kind: bytes, payload: bytes, pad: bytes = b"\0") -> bytes:
    ti = tarfile.TarInfo("././@PaxHeader")
    ti.type, ti.size = kind, len(payload)
    return ti.tobuf(format=tarfile.USTAR_FORMAT) + payload + (pad * 512)[: -len(payload) % 512]


def build(members: list[tuple[str, bytes, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data, kind in members:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mtime = kind, 1_700_000_000
            if kind == tarfile.SYMTYPE:
                ti.linkname = "target.txt"
            ti.size = len(data) if kind in _REGULAR else 0
            tf.addfile(ti, io.BytesIO(data) if kind in _REGULAR else None)
    return buf.getvalue()


def inner_tar(name: str, data: bytes) -> bytes:
    """A header and data with no end marker: hidden members if misparsed as headers."""
    return build([(name, data, tarfile.REGTYPE)], tarfile.USTAR_FORMAT)[:-1024].rstrip(b"\0")


NAMES = st.sampled_from(
    ["000001", "000001", "000002", "a/b/000003", "x.y/000004", "__meta__/i", "noext", "d" * 130]
)
FIELDS = st.sampled_from(["txt", "cls", "JPG", "seg.png", "json", ""])
HIDDEN = st.builds(
    inner_tar, st.sampled_from(["hidden.txt", "s/hidden.cls"]), st.binary(max_size=40)
)
NAME = st.builds(lambda n, f: f"{n}.{f}" if f else n, NAMES, FIELDS)
MEMBER = st.tuples(
    NAME,
    st.one_of(st.binary(max_size=700), HIDDEN),
    st.sampled_from([tarfile.REGTYPE] * 6 + [tarfile.DIRTYPE, tarfile.SYMTYPE]),
)
# Every shard holds a member whose data is a tar header: a parser that loses its place
# (a negative size, a size it reads differently) then shows a member that is not there.
SHARD = st.tuples(
    st.lists(MEMBER, max_size=4),
    st.tuples(NAME, HIDDEN, st.just(tarfile.REGTYPE)),
    st.integers(0, 4),
).map(lambda t: [*t[0][: t[2]], t[1], *t[0][t[2] :]])
FORMAT = st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])

NUMBERS = [b"-0000001000", b"+0000001000", b"00000001000", b"1_0", b" 12 ", b"0o17", b"\t7"]
NUMBERS += [b"\x80" + bytes(10) + b"\x05", b"\xff" * 12, b"\x81abc", b"7777777777\0", b""]
FIELD_VALUES = {
    (124, 136): NUMBERS,  # size
    (100, 108): NUMBERS,  # mode
    (136, 148): NUMBERS,  # mtime
    (329, 337): NUMBERS,  # devmajor
    (156, 157): [bytes([c]) for c in b"0\x001234567xXgLKSDVM"],  # type
    (0, 100): [b"hidden.txt\0", b"a.txt/\0", b"dir/\0", b"__x__/y.txt\0", b"\xff\xfe.txt\0"],
    (345, 500): [b"pre\0", b"\0", b"x" * 155],
    (257, 265): [b"ustar\x0000", b"ustar  \0", bytes(8)],
    (148, 156): [b"0000000\0", b"\xff" * 8, b"-1"],  # not recomputed afterwards
}
SIZES = ["-512", "-1024", "-1", "0", "5", "512", "1024", " 5", "+5", "1_0", "\u0665", "1.5", ""]
NAMES_PAX = ["hidden.txt", "a.txt/", "__x__/y.txt", "k.TXT", "", "\udcff.txt"]
OTHER_KEYS = ["linkpath", "mtime", "comment", "GNU.sparse.name", "GNU.sparse.size", "hdrcharset"]
OTHER_KEYS += ["", "a=b"]
DELTA = st.sampled_from([0] * 6 + [-2, -1, 1, 3])  # record length errors
SIZE_RECORD = st.tuples(st.just("size"), st.sampled_from(SIZES), DELTA)
RECORD = st.one_of(
    SIZE_RECORD,
    SIZE_RECORD,
    st.tuples(st.just("path"), st.sampled_from(NAMES_PAX), DELTA),
    st.tuples(st.sampled_from(OTHER_KEYS), st.sampled_from(["x", "BINARY", "-1", "\xff"]), DELTA),
)
PAX = st.tuples(
    st.sampled_from([b"x", b"x", b"X", b"g", b"L"]),
    st.lists(RECORD, min_size=1, max_size=3),
    st.sampled_from([b"\0", b"\0", b"A"]),
)
FIELD = st.tuples(
    st.just("field"),
    st.integers(0, 64),
    st.sampled_from(sorted(FIELD_VALUES)).flatmap(
        lambda f: st.tuples(st.just(f), st.sampled_from(FIELD_VALUES[f]))
    ),
)
EXT = st.tuples(st.just("ext"), st.integers(0, 64), PAX)
MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16)),
    st.tuples(
        st.just("splice"), st.integers(0, 1 << 16), st.integers(0, 1 << 16), st.integers(1, 1024)
    ),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 1024)),
    FIELD,
    FIELD,  # twice each: these get past the checksum, so they reach the parser's logic
    EXT,
    EXT,
)


def headers(data: bytes) -> list[int]:
    return [i for i in range(0, len(data) - 511, 512) if has_checksum(data[i : i + 512])]


def mutate(data: bytes, m: Mutation) -> bytes:
    kind, *args = m
    if not data:
        return data
    if kind == "flip":
        pos, mask = args
        b = bytearray(data)
        b[pos % len(b)] ^= mask
        return bytes(b)
    if kind == "truncate":
        return data[: args[0] % (len(data) + 1)]
    if kind == "splice":
        pos, src, n = args
        pos, src = pos % len(data), src % len(data)
        return data[:pos] + data[src : src + n] + data[pos:]
    if kind == "delete":
        pos, n = args
        pos %= len(data)
        return data[:pos] + data[pos + n :]
    offsets = headers(data)
    if not offsets:
        return data
    at = offsets[args[0] % len(offsets)]
    if kind == "field":
        (start, end), value = args[1]
        block = bytearray(data[at : at + 512])
        block[start:end] = (value + bytes(end - start))[: end - start]
        if start != 148:
            checksum(block)
        return data[:at] + bytes(block) + data[at + 512 :]
    ext_kind, records, pad = args[1]
    if ext_kind == b"L":
        payload = records[0][1].encode(errors="surrogateescape") + b"\0"
    else:
        payload = b"".join(record(k, v, d) for k, v, d in records)
    return data[:at] + ext_header(ext_kind, payload, pad) + data[at:]


@SETTINGS
@given(st.binary(max_size=3000))
def test_random_bytes(data: bytes) -> None:
    check(data)


@SETTINGS
@given(
    st.lists(st.tuples(st.binary(min_size=512, max_size=512), st.binary(max_size=600)), max_size=4),
    st.booleans(),
)
def test_random_headers_with_valid_checksums(blocks: list[tuple[bytes, bytes]], end: bool) -> None:
    out = b""
    for raw, body in blocks:
        block = bytearray(raw)
        checksum(block)
        out += bytes(block) + body
    check(out + bytes(1024) * end)


@settings(SETTINGS, max_examples=250 * SCALE)
@given(
    SHARD,
    FORMAT,
    st.lists(MUTATION, max_size=3),
    st.sampled_from(["plain"] * 4 + ["gzip before", "gzip after"]),
)
def test_mutated_shards(
    members: list[tuple[str, bytes, bytes]], fmt: int, mutations: list[Mutation], gz: str
) -> None:
    if fmt == tarfile.USTAR_FORMAT and any(len(n) > 100 for n, _, _ in members):
        fmt = tarfile.GNU_FORMAT
    data = build(members, fmt)
    for m in mutations[:-1] if gz == "gzip after" else mutations:
        data = mutate(data, m)
    if gz != "plain":
        data = gzip.compress(data, mtime=0)
    if gz == "gzip after" and mutations:
        data = mutate(data, mutations[-1])
    check(data)
