"""The field formats of ``streambuf.wds.formats`` and their bounds: gzip (bombs,
truncation, members, padding), npz (no pickles, sizes from the headers), tenbin (our own
reader: valid files, every malformed variant refused with ValueError), cbor/msgpack
(missing packages named), and ``max_sample_bytes`` across gz fields."""

from __future__ import annotations

import gzip
import io
import sys
import tarfile
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambuf as sb
from streambuf.errors import ShardError
from streambuf.wds import Decoder, formats

pytestmark = pytest.mark.timeout(120)


def zero_bomb(gib: int) -> bytes:
    """A gzip stream of ``gib`` GiB of zeros, ~1 KB per MiB, made in milliseconds: with
    a full flush after each MiB the compressor's output repeats, so one MiB's output is
    written ``1024 * gib`` times. Its trailer is not that of 10 GiB (never reached)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    mib = bytes(1 << 20)
    head = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    return head + block * (1024 * gib - 1) + c.flush()


def nested_bomb() -> bytes:
    """Three gzip layers, 10 GiB of zeros inside: under 1 KB."""
    data = gzip.compress(gzip.compress(zero_bomb(10), 9), 9)
    assert len(data) < 1024
    return data


def test_gunzip_plain_members_and_zero_padding() -> None:
    one, two = gzip.compress(b"hello "), gzip.compress(b"world")
    assert formats.gunzip(one, limit=None) == b"hello "
    assert formats.gunzip(one + two, limit=None) == gzip.decompress(one + two)
    assert formats.gunzip(one + bytes(512), limit=None) == b"hello "  # tar-style padding
    assert formats.gunzip(one, limit=6) == b"hello "
    with pytest.raises(formats.DecodedSizeError, match="more than 5 bytes"):
        formats.gunzip(one, limit=5)


@pytest.mark.parametrize("cut", [1, 10, -9, -1])
def test_gunzip_truncated_or_garbage_is_an_error(cut: int) -> None:
    data = gzip.compress(b"x" * 5000)
    with pytest.raises((ValueError, zlib.error)):
        formats.gunzip(data[:cut], limit=None)
    with pytest.raises((ValueError, zlib.error)):
        formats.gunzip(data + b"junk", limit=None)


def _peak_while(fn) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, elapsed


def test_gzip_bomb_refused_in_bounded_time_and_memory() -> None:
    bomb = nested_bomb()  # 1 KB -> 10 GiB
    sample = {"__key__": "evil/001", "__url__": "http://h/x.tar", "bomb.txt.gz.gz.gz": bomb}
    errors: list[ShardError] = []

    def run() -> None:
        with pytest.raises(ShardError) as info:
            Decoder(max_decoded_bytes="64MiB")(sample)
        errors.append(info.value)

    peak, elapsed = _peak_while(run)
    msg = str(errors[0])
    assert "'bomb.txt.gz.gz.gz'" in msg and "evil/001" in msg and "max_decoded_bytes" in msg
    assert errors[0].stage == "decode" and errors[0].source == "http://h/x.tar"
    assert peak < 64 * 2**20 * 1.5 + 16 * 2**20, peak  # O(the limit), not 10 GiB
    assert elapsed < 20, elapsed


def test_gzip_bomb_refused_with_the_default_limit_through_shards(tmp_path: Path) -> None:
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("k1.txt", b"fine"), ("k2.data.txt.gz.gz.gz", nested_bomb())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    pipe = sb.shards([str(path)], lanes=1).decode()
    t0 = time.perf_counter()
    with pytest.raises(ShardError, match=r"'data.txt.gz.gz.gz' of sample 'k2'") as info:
        list(pipe)
    assert time.perf_counter() - t0 < 30
    assert "256MiB" in str(info.value) or str(256 << 20) in str(info.value)
    assert str(path) in str(info.value)
    skipped = list(sb.shards([str(path)], lanes=1).decode(on_error="skip"))
    assert [s["__key__"] for s in skipped] == ["k1"]


def test_max_sample_bytes_counts_gz_fields_inflated(tmp_path: Path) -> None:
    text = b"a" * 10_000
    sample = {"__key__": "k", "txt.gz": gzip.compress(text), "bin": b"x" * 100}
    assert Decoder(max_sample_bytes=10_100)(sample)["txt.gz"] == text.decode()
    with pytest.raises(ShardError, match="max_sample_bytes") as info:
        Decoder(max_sample_bytes=10_099)(sample)
    assert "raise max_sample_bytes= of decode()" in str(info.value)  # the one that binds
    # Pipeline.decode takes the bound of shards(max_sample_bytes=)
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("k.txt.gz", sample["txt.gz"]), ("k.bin", sample["bin"])]:
            info2 = tarfile.TarInfo(name)
            info2.size = len(data)
            tar.addfile(info2, io.BytesIO(data))
    with pytest.raises(ShardError, match="max_sample_bytes=5000"):
        list(sb.shards([str(path)], max_sample_bytes=5000).decode())
    assert len(list(sb.shards([str(path)]).decode())) == 1
    assert len(list(sb.shards([str(path)], max_sample_bytes=5000).decode(max_sample_bytes="1MiB")))


def test_user_mapping_for_gz_gets_the_compressed_bytes() -> None:
    data = gzip.compress(b"zz")
    assert Decoder({"gz": None})({"txt.gz": data}) == {"txt.gz": data}
    assert Decoder({"txt.gz": len})({"txt.gz": data}) == {"txt.gz": len(data)}
    assert Decoder({"txt": bytes.upper})({"txt.gz": data}) == {"txt.gz": b"ZZ"}


def npz_bytes(**arrays: object) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def test_npz_arrays_bounded_and_no_pickles() -> None:
    data = npz_bytes(a=np.arange(5), b=np.ones((2, 2), np.float32))
    out = formats.decode_npz(data)
    assert sorted(out) == ["a", "b"] and out["b"].dtype == np.float32
    np.testing.assert_array_equal(out["a"], np.arange(5))
    bomb = npz_bytes(z=np.zeros(50_000_000, np.uint8))  # 50 MB of zeros, ~50 KB stored
    with pytest.raises(formats.DecodedSizeError, match=r"'z\.npy'"):
        formats.decode_npz(bomb, limit=1 << 20)
    buf = io.BytesIO()
    np.savez(buf, o=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="object array"):
        formats.decode_npz(buf.getvalue())


def ten(*arrays: np.ndarray) -> bytes:
    from webdataset import tenbin  # the peer's writer makes the reference files

    return bytes(tenbin.encode_buffer(list(arrays)))


def test_tenbin_reads_what_webdataset_writes() -> None:
    pytest.importorskip("webdataset")
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(7, dtype=np.int64),
        np.zeros((0, 5), np.uint8),
        np.arange(8, dtype=np.float16).reshape(2, 2, 2),
    ]
    out = formats.decode_tenbin(ten(*arrays))
    assert len(out) == 4
    for a, b in zip(out, arrays):
        assert a.dtype == b.dtype and a.shape == b.shape and a.flags.writeable
        np.testing.assert_array_equal(a, b)


def test_tenbin_uint32_which_webdataset_cannot_read() -> None:
    header = np.array([int.from_bytes(b"u4".ljust(8, b"\0"), "little"), 0, 1, 3], "<i8")
    body = np.array([1, 2, 2**32 - 1], "<u4").tobytes()

    def chunk(b: bytes) -> bytes:
        return b"~TenBin~" + len(b).to_bytes(8, "little") + b + bytes(-len(b) % 64)

    out = formats.decode_tenbin(chunk(header.tobytes()) + chunk(body))
    np.testing.assert_array_equal(out[0], np.array([1, 2, 2**32 - 1], np.uint32))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_tenbin_malformed_is_a_value_error(data: st.DataObject) -> None:
    pytest.importorskip("webdataset")
    good = bytearray(ten(np.arange(6, dtype=np.int32).reshape(2, 3), np.ones(3, np.float64)))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(good) - 1))
        good[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    blob = bytes(good[:cut])
    try:
        out = formats.decode_tenbin(blob)
    except ValueError:
        return
    assert all(isinstance(a, np.ndarray) for a in out)


@pytest.mark.parametrize(("module", "field"), [("cbor2", "cbor"), ("msgpack", "mp")])
def test_missing_optional_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, field: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import fails
    with pytest.raises(ImportError, match=r"streambuf\[formats\]"):
        Decoder()({"__key__": "k", field: b"\x80"})


def test_cbor_and_msgpack_round_trip() -> None:
    cbor2 = pytest.importorskip("cbor2")
    msgpack = pytest.importorskip("msgpack")
    obj = {"a": [1, 2.5, None, "x"], "b": b"raw"}
    out = Decoder()({"cbor": cbor2.dumps(obj), "msg": msgpack.packb(obj)})
    assert out == {"cbor": obj, "msg": obj}


def test_decoding_in_threads_is_safe() -> None:
    data = gzip.compress(b"y" * 100_000)
    d = Decoder()
    results: list[object] = []

    def work() -> None:
        for _ in range(20):
            results.append(d({"txt.gz": data})["txt.gz"])  # type: ignore[index]

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 80 and all(r == "y" * 100_000 for r in results)


# -- the per-sample bound: a bomb spread over many fields (issue "Reliability II") -------

MIB = 1 << 20


def zeros_gz(mib: int) -> bytes:
    """A valid gzip member of ``mib`` MiB of zeros (~1 KB per MiB), made in milliseconds:
    after a full flush, the deflate output of one MiB of zeros repeats; the trailer's
    CRC and size are those of the zeros (so the field decodes when allowed to)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    one = bytes(MIB)
    head = c.compress(one) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(one) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(one, crc)
    trailer = crc.to_bytes(4, "little") + ((mib * MIB) & 0xFFFFFFFF).to_bytes(4, "little")
    return (
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + head + block * (mib - 1) + c.flush() + trailer
    )


def fields_tar(path: Path, key: str, sizes_mib: list[int]) -> None:
    """One sample ``key`` whose fields ``f0.bin.gz``, ``f1.bin.gz``... inflate to
    ``sizes_mib`` MiB of zeros each (``bin``: kept as bytes once gunzipped)."""
    with tarfile.open(path, "w") as tar:
        for i, mib in enumerate(sizes_mib):
            data = zeros_gz(mib)
            info = tarfile.TarInfo(f"{key}.f{i}.bin.gz")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_zeros_gz_is_valid_gzip() -> None:
    assert gzip.decompress(zeros_gz(3)) == bytes(3 * MIB)
    assert len(zeros_gz(250)) < 300_000


def test_gz_fields_over_the_default_sample_bound_refused_before_they_inflate(
    tmp_path: Path,
) -> None:
    """Default options through ``shards().decode()``: 12 fields of 250 MiB each (each
    under max_decoded_bytes=256MiB, 2.9 GiB together) stop at the per-sample default,
    1 GiB: the fifth field inflates only to what the first four left."""
    path = tmp_path / "evil.tar"
    fields_tar(path, "evil", [250] * 12)
    assert path.stat().st_size < 4 * MIB
    pipe = sb.shards([str(path)], lanes=1).decode()
    errors: list[ShardError] = []

    def run() -> None:
        with pytest.raises(ShardError) as info:
            list(pipe)
        errors.append(info.value)

    peak, elapsed = _peak_while(run)
    msg = str(errors[0])
    assert "'f4.bin.gz'" in msg and "'evil'" in msg and str(path) in msg, msg
    assert f"max_decoded_sample_bytes={1 << 30}" in msg, msg
    assert "raise max_decoded_sample_bytes=" in msg, msg
    assert peak < (1 << 30) + 320 * MIB, peak  # the bound and one field's copy, not 2.9 GiB
    assert peak < 12 * 250 * MIB // 2, peak
    assert elapsed < 60, elapsed


def test_sample_bound_is_the_gzip_readers_limit_not_a_count_afterwards(tmp_path: Path) -> None:
    """With the bound set small: four 8 MiB fields, then one of 100 MiB. Its gzip reader
    may inflate only what the first four left (8 MiB), so the peak stays near the bound
    (counted after inflating, the peak would be 232 MiB)."""
    path = tmp_path / "s.tar"
    fields_tar(path, "k", [8, 8, 8, 8, 100])
    pipe = sb.shards([str(path)], lanes=1).decode(max_decoded_sample_bytes="40MiB")
    errors: list[ShardError] = []

    def run() -> None:
        with pytest.raises(ShardError) as info:
            list(pipe)
        errors.append(info.value)

    peak, elapsed = _peak_while(run)
    msg = str(errors[0])
    assert "'f4.bin.gz'" in msg and "'k'" in msg and str(path) in msg, msg
    assert f"max_decoded_sample_bytes={40 * MIB}" in msg, msg
    assert peak < 64 * MIB, peak
    assert elapsed < 20, elapsed
    # within the bound the same sample decodes
    ok = list(sb.shards([str(path)], lanes=1).decode(max_decoded_sample_bytes="132MiB"))
    assert [len(ok[0][f"f{i}.bin.gz"]) for i in range(5)] == [8 * MIB] * 4 + [100 * MIB]


def test_default_sample_bound_follows_max_decoded_bytes(tmp_path: Path) -> None:
    """``"auto"`` is 4 x max_decoded_bytes: 1 GiB at the defaults; with
    max_decoded_bytes='4MiB', six 3 MiB fields (18 MiB) pass each field's bound and
    are refused as a sample (16 MiB); None for both turns the bounds off."""
    assert Decoder().max_decoded_sample_bytes == 1 << 30
    assert Decoder(max_decoded_bytes=None).max_decoded_sample_bytes is None
    assert Decoder(max_decoded_sample_bytes="2GiB").max_decoded_sample_bytes == 2 << 30
    path = tmp_path / "s.tar"
    fields_tar(path, "k", [3] * 6)
    with pytest.raises(ShardError, match=r"'f5.bin.gz' of sample 'k'.*max_decoded_sample_bytes"):
        list(sb.shards([str(path)]).decode(max_decoded_bytes="4MiB"))
    assert len(list(sb.shards([str(path)]).decode(max_decoded_bytes="5MiB"))) == 1  # 20 MiB
    assert len(list(sb.shards([str(path)]).decode(max_decoded_sample_bytes=None))) == 1


def test_images_count_against_the_sample_bound_from_their_headers() -> None:
    pytest.importorskip("PIL.Image")
    from tests.sources.test_decoders import png_bytes

    png = png_bytes(200, 100)  # decodes to 60000 bytes
    sample = {"__key__": "k", "__url__": "/x.tar", "a.png": png, "b.png": png, "c.png": png}
    out = Decoder(max_decoded_sample_bytes=180_000)(sample)
    assert isinstance(out, dict) and out["c.png"].shape == (100, 200, 3)
    with pytest.raises(ShardError) as info:
        Decoder(max_decoded_sample_bytes=179_999)(sample)
    msg = str(info.value)
    assert "'c.png'" in msg and "200x100 image decodes to 60000 bytes" in msg, msg
    assert "max_decoded_sample_bytes=179999" in msg, msg
    npz = npz_bytes(x=np.zeros(1000, np.uint8))
    with pytest.raises(ShardError, match=r"'b.npz'.*max_decoded_sample_bytes=1500"):
        Decoder(max_decoded_sample_bytes=1500)({"__key__": "k", "a.npz": npz, "b.npz": npz})


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "lots", "autox"])
def test_sample_bound_option_validated(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_decoded_sample_bytes"):
        Decoder(max_decoded_sample_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="max_decoded_sample_bytes"):
        sb.Pipeline([{}]).decode(max_decoded_sample_bytes=bad)  # type: ignore[arg-type]
