"""Readers of the non-image field formats webdataset decodes, each bounded and safe.

Every reader takes the field's ``bytes``; the ones whose output can be much larger than
their input (``gunzip``, ``decode_npz``) also take ``limit``, the most bytes they may
produce, and refuse (``ValueError``) before producing more. None of them runs code from
the data: ``npy``/``npz`` load with ``allow_pickle=False`` (object arrays refused),
``pth`` with ``weights_only=True``, and there is no pickle reader.

* ``gunzip``: gzip (several members, zero padding after them, as ``gzip.open`` reads),
  decompressed in steps of at most 4 MiB, so a bomb costs at most ``limit`` bytes and the
  time to inflate them.
* ``decode_npz``: ``dict`` of name -> array, like ``dict(numpy.load(f))``; each member's
  size is read from its ``.npy`` header and counted against ``limit`` before its data is.
* ``decode_tenbin`` (``ten``/``tb``): webdataset's tensor binary format, read here from
  its documented layout (no webdataset import): a sequence of chunks, each the 8 magic
  bytes ``~TenBin~``, an int64 length, the bytes, zero padding to a multiple of 64; the
  chunks alternate header / data; a header is int64s: dtype code (``"f4"``, ``"u1"`` ...,
  8 ASCII bytes), an info string (8 bytes), ndim, then the dims. Little-endian (what
  webdataset writes on x86 and ARM). Returns a list of arrays, like webdataset. Every
  length, rank, dim and code is checked; the data size must match the shape exactly.
* ``decode_cbor`` (``cbor2``), ``decode_msgpack`` (``msgpack``): optional packages; a
  missing one is an ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from typing import Any

__all__ = [
    "DecodedSizeError",
    "decode_cbor",
    "decode_int",
    "decode_json",
    "decode_msgpack",
    "decode_npy",
    "decode_npz",
    "decode_pth",
    "decode_tenbin",
    "decode_text",
    "gunzip",
]

_STEP = 4 << 20  # bytes inflated per call: bounds the overshoot past ``limit``
_EXTRA = "pip install 'streambuf[formats]'"


def decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def decode_int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def decode_json(data: bytes) -> Any:
    return json.loads(data)


def decode_npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_pth(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def decode_cbor(data: bytes) -> Any:
    try:
        import cbor2
    except ImportError as exc:
        raise ImportError(f"decoding .cbor fields needs cbor2: {_EXTRA} (or cbor2)") from exc
    return cbor2.loads(data)


def decode_msgpack(data: bytes) -> Any:
    try:
        import msgpack
    except ImportError as exc:
        raise ImportError(f"decoding .mp/.msg fields needs msgpack: {_EXTRA}") from exc
    return msgpack.unpackb(data)  # its default limits are the input's length


class DecodedSizeError(ValueError):
    """A field would decode to more bytes than its limit allows."""


def _too_big(what: str, limit: int, name: str) -> DecodedSizeError:
    return DecodedSizeError(f"{what} more than {limit} bytes ({name})")


def gunzip(data: bytes, *, limit: int | None, limit_name: str = "the limit") -> bytes:
    """The decompressed bytes of a gzip stream; ``ValueError`` past ``limit`` bytes, on a
    truncated stream or on bytes after the last member that are neither zeros nor
    another member."""
    pieces: list[bytes] = []  # joined once at the end: no regrowth copies on the way
    total = 0
    rest = memoryview(data)
    while True:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending: bytes | memoryview = rest
        while not inflate.eof:
            room = _STEP if limit is None else min(_STEP, limit - total + 1)
            piece = inflate.decompress(pending, room)
            pieces.append(piece)
            total += len(piece)
            if limit is not None and total > limit:
                raise _too_big("gzip data inflates to", limit, limit_name)
            pending = inflate.unconsumed_tail
            if not piece and not pending:
                raise ValueError(f"truncated gzip data (ends after {total} bytes inflated)")
        tail = inflate.unused_data.lstrip(b"\0")  # zero padding, as gzip.open allows
        if not tail:
            return b"".join(pieces)
        rest = memoryview(tail)


def decode_npz(
    data: bytes, *, limit: int | None = None, limit_name: str = "the limit"
) -> dict[str, Any]:
    """``dict(numpy.load(f))`` for an ``.npz`` field, with each array's size (from its
    header) counted against ``limit`` before it is read; no pickles."""
    import zipfile

    from numpy.lib import format as npformat

    out: dict[str, Any] = {}
    total = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            name = info.filename
            key = name[:-4] if name.endswith(".npy") else name
            with archive.open(info) as member:
                is_array = member.read(6) == b"\x93NUMPY"
            if not is_array:  # numpy returns a non-array member's bytes
                total += info.file_size
                if limit is not None and total > limit:
                    raise _too_big(f"npz member {name!r} brings the arrays to", limit, limit_name)
                out[key] = archive.read(info)  # zipfile stops at the declared size
                continue
            with archive.open(info) as member:
                version = npformat.read_magic(member)
                shape, _, dtype = _npy_header(npformat, member, version)
                if dtype.hasobject:
                    raise ValueError(f"npz member {name!r} is an object array (a pickle): refused")
                total += math.prod(int(d) for d in shape) * dtype.itemsize
                if limit is not None and total > limit:
                    raise _too_big(f"npz member {name!r} brings the arrays to", limit, limit_name)
            with archive.open(info) as member:
                out[key] = npformat.read_array(member, allow_pickle=False)
    return out


def _npy_header(npformat: Any, member: Any, version: tuple[int, int]) -> Any:
    if version == (1, 0):
        return npformat.read_array_header_1_0(member)
    if version == (2, 0):
        return npformat.read_array_header_2_0(member)
    return npformat._read_array_header(member, version)  # 3.0: no public reader


_TEN_MAGIC = b"~TenBin~"
_TEN_DTYPES = {
    "f2": "<f2",
    "f4": "<f4",
    "f8": "<f8",
    "i1": "i1",
    "i2": "<i2",
    "i4": "<i4",
    "i8": "<i8",
    "u1": "u1",
    "u2": "<u2",
    "u4": "<u4",
    "u8": "<u8",
}


def _ten_chunks(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    chunks: list[memoryview] = []
    offset = 0
    while offset < len(view):
        if view[offset : offset + 8] != _TEN_MAGIC:
            raise ValueError(f"tenbin: no chunk magic {_TEN_MAGIC!r} at byte {offset}")
        if offset + 16 > len(view):
            raise ValueError(f"tenbin: truncated chunk length at byte {offset + 8}")
        (size,) = struct.unpack_from("<q", view, offset + 8)
        start = offset + 16
        if size < 0 or start + size > len(view):
            raise ValueError(f"tenbin: chunk at byte {offset} claims {size} bytes, past the end")
        chunks.append(view[start : start + size])
        offset = start + (size + 63) // 64 * 64
    if len(chunks) % 2:
        raise ValueError("tenbin: a header chunk without its data chunk")
    return chunks


def decode_tenbin(data: bytes) -> list[Any]:
    """The arrays of a tenbin field (``ten``/``tb``), in order; see the module docstring."""
    import numpy as np

    chunks = _ten_chunks(data)
    arrays = []
    for i in range(0, len(chunks), 2):
        header, body = chunks[i], chunks[i + 1]
        if len(header) < 24 or len(header) % 8:
            raise ValueError(f"tenbin: array {i // 2} has a {len(header)}-byte header")
        words = struct.unpack(f"<{len(header) // 8}q", header)
        code = bytes(header[:8]).rstrip(b"\0").decode("ascii", "replace")
        if code not in _TEN_DTYPES:
            raise ValueError(
                f"tenbin: array {i // 2} has dtype code {code!r}, not one of {sorted(_TEN_DTYPES)}"
            )
        ndim = words[2]
        if not 0 <= ndim <= 9 or len(words) < 3 + ndim:
            raise ValueError(f"tenbin: array {i // 2} has rank {ndim}")
        shape = words[3 : 3 + ndim]
        dtype = np.dtype(_TEN_DTYPES[code])
        if any(d < 0 for d in shape):
            raise ValueError(f"tenbin: array {i // 2} has shape {shape}")
        need = math.prod(int(d) for d in shape) * dtype.itemsize
        if need != len(body):
            raise ValueError(
                f"tenbin: array {i // 2} of shape {shape} and dtype {code} needs "
                f"{need} bytes, its data chunk has {len(body)}"
            )
        arrays.append(np.frombuffer(body, dtype=dtype).reshape(shape).copy())
    return arrays
