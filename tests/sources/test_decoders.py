from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from streambuf.errors import ShardError
from streambuf.wds import Decoder, decode_sample, register_decoder
from streambuf.wds import decoders as dec_mod

pytestmark = pytest.mark.timeout(30)


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def test_default_decoders() -> None:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3)}, buf)
    sample = {
        "__key__": "k",
        "__url__": "u",
        "npy": npy_bytes(np.arange(4)),
        "json": json.dumps({"a": 1}).encode(),
        "txt": "héllo".encode(),
        "cls": b" 7\n",
        "pth": buf.getvalue(),
        "bin": b"\x00raw",
    }
    out = decode_sample(sample)
    assert out["__key__"] == "k" and out["__url__"] == "u"
    np.testing.assert_array_equal(out["npy"], np.arange(4))
    assert out["json"] == {"a": 1} and out["txt"] == "héllo" and out["cls"] == 7
    assert torch.equal(out["pth"]["w"], torch.arange(3))
    assert out["bin"] == b"\x00raw"


@pytest.mark.parametrize("fmt, field", [("PNG", "png"), ("JPEG", "jpg"), ("PNG", "seg.png")])
def test_images_to_uint8_hwc(fmt: str, field: str) -> None:
    image = pytest.importorskip("PIL.Image")
    img = image.new("RGB", (5, 3), (10, 200, 30))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    out = decode_sample({"__key__": "k", field: buf.getvalue()})[field]
    assert out.dtype == np.uint8 and out.shape == (3, 5, 3)
    assert abs(int(out[0, 0, 1]) - 200) < 8


def test_grayscale_image_becomes_rgb() -> None:
    image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    image.new("L", (4, 2), 128).save(buf, format="PNG")
    assert decode_sample({"png": buf.getvalue()})["png"].shape == (2, 4, 3)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Harmless stand-in for os.system: creates a marker file if ever unpickled.
        return (os.mkdir, (self.marker,))


def test_malicious_pth_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Evil(str(marker)))
    with pytest.raises(ShardError) as info:
        decode_sample({"__key__": "s0/001", "__url__": "http://h/x.tar", "pth": payload})
    assert not marker.exists()
    msg = str(info.value)
    assert "'pth'" in msg and "s0/001" in msg and info.value.stage == "decode"
    assert info.value.source == "http://h/x.tar"


def test_torch_save_of_malicious_object_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    marker = tmp_path / "pwned2"
    buf = io.BytesIO()
    torch.save({"x": _Evil(str(marker))}, buf)
    with pytest.raises(ShardError):
        decode_sample({"__key__": "k", "pth": buf.getvalue()})
    assert not marker.exists()


def test_pickle_not_decoded_by_default(tmp_path: Path) -> None:
    marker = tmp_path / "pwned3"
    payload = pickle.dumps(_Evil(str(marker)))
    out = decode_sample({"pyd": payload, "pickle": payload})
    assert out == {"pyd": payload, "pickle": payload} and not marker.exists()


def test_object_npy_refused() -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ShardError, match="npy"):
        decode_sample({"__key__": "k", "npy": buf.getvalue()})


def test_bad_json_names_key_and_field() -> None:
    with pytest.raises(ShardError, match=r"'meta.json' of sample 'k9'"):
        decode_sample({"__key__": "k9", "meta.json": b"{nope"})


def test_user_decoders_and_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dec_mod, "_registry", {})
    d = Decoder({"txt": lambda b: b.upper(), "json": None})
    assert d({"txt": b"a", "json": b"{}"}) == {"txt": b"A", "json": b"{}"}
    register_decoder("pyd", pickle.loads)
    assert decode_sample({"pyd": pickle.dumps([1])}) == {"pyd": [1]}
    assert Decoder(defaults=False)({"pyd": b"x", "cls": b"1"}) == {"pyd": b"x", "cls": b"1"}
    with pytest.raises(ValueError):
        register_decoder(".png", None)


def test_decoder_pickles() -> None:
    d = Decoder({"txt": dec_mod.decode_text})
    d2 = pickle.loads(pickle.dumps(d))
    assert d2({"txt": b"x"}) == {"txt": "x"}


def png_bytes(width: int, height: int, mode: str = "RGB") -> bytes:
    image = pytest.importorskip("PIL.Image")
    buf = io.BytesIO()
    image.new(mode, (width, height)).save(buf, format="PNG")
    return buf.getvalue()


def header_only_png(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` but whose pixel data is one empty
    chunk: decoding it fails, reading its header does not."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


BAD = {"__key__": "s0/bad", "__url__": "http://u:pw@h/x.tar", "json": b"{nope"}
GOOD = {"__key__": "s0/good", "__url__": "http://h/x.tar", "json": b"{}", "cls": b"3"}


def test_skip_skips_whole_sample_counts_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    d = Decoder(on_error="skip")
    assert d(BAD) is dec_mod.SKIPPED and not dec_mod.not_skipped(d(BAD))
    out = d(GOOD)
    assert out == {"__key__": "s0/good", "__url__": "http://h/x.tar", "json": {}, "cls": 3}
    assert dec_mod.not_skipped(out) and d.skipped == 2
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and "s0/bad" in warnings[0].getMessage()
    assert "'json'" in warnings[0].getMessage() and "pw" not in caplog.text


def test_skip_max_failures() -> None:
    from streambuf.errors import TooManyFailures

    d = Decoder(on_error="skip", max_failures=1)
    assert d(BAD) is dec_mod.SKIPPED
    with pytest.raises(TooManyFailures, match="max_failures=1"):
        d(BAD)


def test_raise_is_the_default_and_unchanged() -> None:
    with pytest.raises(ShardError) as info:
        Decoder()(BAD)
    assert info.value.stage == "decode" and info.value.source == "http://***@h/x.tar"
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_skip_decoder_pickles_with_fresh_counts() -> None:
    d = Decoder(on_error="skip", max_failures=3)
    d(BAD)
    d2 = pickle.loads(pickle.dumps(d))
    assert d2.skipped == 0 and d2(BAD) is dec_mod.SKIPPED
    assert pickle.loads(pickle.dumps(dec_mod.SKIPPED)) is dec_mod.SKIPPED


@pytest.mark.parametrize(
    "kw",
    [
        {"on_error": "ignore"},
        {"max_failures": -1},
        {"max_decoded_bytes": 0},
        {"max_decoded_bytes": "lots"},
    ],
)
def test_decoder_options_validated(kw: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        Decoder(**kw)


@pytest.mark.parametrize("threads", [1, 3])
def test_pipeline_decode_skip_drops_bad_samples(threads: int) -> None:
    from streambuf import Pipeline

    samples = [
        dict(GOOD, __key__=f"k{i}") if i % 3 else dict(BAD, __key__=f"k{i}") for i in range(9)
    ]
    pipe = Pipeline(samples).decode(on_error="skip", max_failures=5, threads=threads)
    assert [s["__key__"] for s in pipe] == ["k1", "k2", "k4", "k5", "k7", "k8"]
    with pytest.raises(ShardError, match="'k0'"):
        list(Pipeline(samples).decode())


def test_pipeline_decode_defaults_match_decoder() -> None:
    import inspect

    from streambuf import Pipeline

    pipe = inspect.signature(Pipeline.decode).parameters
    dec = inspect.signature(Decoder).parameters
    for name in ("on_error", "max_failures", "max_decoded_bytes", "max_decoded_sample_bytes"):
        assert pipe[name].default == dec[name].default
    assert Decoder().max_decoded_bytes == 256 << 20


def test_image_over_max_decoded_bytes_refused() -> None:
    sample = {"__key__": "s1/img", "__url__": "http://h/x.tar", "png": png_bytes(200, 100)}
    d = Decoder(max_decoded_bytes=200 * 100 * 3 - 1)
    with pytest.raises(ShardError) as info:
        d(sample)
    msg = str(info.value)
    assert info.value.stage == "decode" and info.value.source == "http://h/x.tar"
    assert "'png'" in msg and "s1/img" in msg and "200x100" in msg
    assert "max_decoded_bytes=59999" in msg and "raise max_decoded_bytes" in msg
    assert Decoder(max_decoded_bytes=200 * 100 * 3)(sample)["png"].shape == (100, 200, 3)
    assert Decoder(max_decoded_bytes=None)(sample)["png"].shape == (100, 200, 3)
    rgba = {"png": png_bytes(200, 100, "RGBA")}  # 4 channels decoded before conversion
    with pytest.raises(ShardError, match="80000 bytes"):
        Decoder(max_decoded_bytes="60000")(rgba)


def test_max_decoded_bytes_checked_from_the_header_before_decoding() -> None:
    pytest.importorskip("PIL.Image")
    sample = {"__key__": "k", "png": header_only_png(3000, 3000)}
    with pytest.raises(ShardError, match="3000x3000 image decodes to 27000000 bytes"):
        Decoder(max_decoded_bytes="16MiB")(sample)
    with pytest.raises(ShardError) as info:  # within the limit: decoding is attempted
        Decoder()(sample)
    assert "max_decoded_bytes" not in str(info.value)


def test_max_decoded_bytes_skippable() -> None:
    d = Decoder(on_error="skip", max_decoded_bytes=10)
    assert d({"__key__": "k", "png": png_bytes(4, 4)}) is dec_mod.SKIPPED and d.skipped == 1
