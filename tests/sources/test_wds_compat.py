"""Compatibility with webdataset itself: shards written by webdataset's ``TarWriter`` and
``ShardWriter`` (every field type it encodes, gz-compressed variants, keys with dots and
directories) read by both libraries in the same run: keys, field names, raw bytes and
decoded values (every image spec) must be equal."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambuf as sb
from streambuf.wds import IMAGE_SPECS, Decoder

wds = pytest.importorskip("webdataset")
pytest.importorskip("PIL.Image")
pytest.importorskip("cbor")  # webdataset's own cbor decoder needs it
pytest.importorskip("cbor2")
pytest.importorskip("msgpack")

pytestmark = pytest.mark.timeout(120)


def _image(i: int, mode: str) -> Any:
    from PIL import Image

    rng = np.random.default_rng(i)
    size = {"L": (9, 7), "RGB": (9, 7, 3), "RGBA": (9, 7, 4)}[mode]
    return Image.fromarray(rng.integers(0, 255, size, dtype=np.uint8), mode=mode)


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(100 + i)
    arr = rng.standard_normal((3, 4)).astype(np.float32)
    obj = {"i": i, "name": f"s{i}", "xs": [1, 2.5, None, True], "raw": b"\x00\x01"}
    return {
        # keys with dots and directories (webdataset splits at the first dot of the name)
        "__key__": f"dir.v{i % 2}/sub/sample{i:03d}",
        "txt": f"héllo {i}",
        "cls": i % 5,
        "json": {"i": i, "tags": ["a", "b"]},
        "npy": arr,
        "npz": {"a": arr, "b": np.arange(i + 1)},
        "ten": [arr, np.arange(6, dtype=np.int16).reshape(2, 3)],
        "mp": obj,
        "cbor": {"i": i, "name": f"s{i}", "xs": [1, 2.5, None, True]},
        "jpg": np.asarray(_image(i, "RGB")),
        "png": _png(_image(i, "RGBA")),  # bytes: written as they are
        "gray.png": _png(_image(i, "L")),  # a two-part extension
        "ppm": np.asarray(_image(i, "RGB")),
        "txt.gz": f"zipped {i} " * 20,
        "json.gz": {"gz": i},
        "npy.gz": arr * 2,
        "cls.gz": i,
        "png.gz": _png(_image(i, "RGB")),
        "bin": bytes(rng.integers(0, 255, 40, dtype=np.uint8)),
    }


@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wds")
    with wds.TarWriter(str(out / "single.tar")) as sink:
        for i in range(6):
            sink.write(_sample(i))
    with wds.ShardWriter(str(out / "multi-%04d.tar"), maxcount=4, verbose=0) as sink:
        for i in range(6, 14):
            sink.write(_sample(i))
    return out


def _shard_urls(root: Path) -> list[str]:
    return sorted(str(p) for p in root.glob("*.tar"))


def _ours(urls: list[str], *specs: Any) -> dict[str, dict[str, Any]]:
    pipe = sb.shards(urls, lanes=1)
    if specs:
        pipe = pipe.decode(*specs)
    return {s["__key__"]: s for s in pipe}


def _theirs(urls: list[str], *specs: Any) -> dict[str, dict[str, Any]]:
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
    if specs:
        ds = ds.decode(*specs)
    return {s["__key__"]: s for s in ds}


def _fields(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def assert_same(a: Any, b: Any, where: str) -> None:
    """Deep equality of decoded values: arrays, tensors and images by content, and
    dtype/type too."""
    import torch
    from PIL import Image

    if isinstance(b, Image.Image):
        assert isinstance(a, Image.Image) and a.mode == b.mode, where
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)
    elif isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and a.dtype == b.dtype, (where, a, b)
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(b, dict):
        assert isinstance(a, dict) and a.keys() == b.keys(), (where, a, b)
        for k in b:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(b, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def test_keys_fields_and_raw_bytes_equal(wds_shards: Path) -> None:
    urls = _shard_urls(wds_shards)
    ours, theirs = _ours(urls), _theirs(urls)
    assert len(theirs) == 14 and sorted(ours) == sorted(theirs)
    assert "dir.v0/sub/sample000" in ours
    for key, sample in theirs.items():
        assert _fields(ours[key]) == _fields(sample), key  # names and bytes


@pytest.mark.parametrize("spec", ["rgb8", "l8", "rgba8", "rgb", "torchrgb8", "torchrgb", "pil"])
def test_decoded_values_equal(wds_shards: Path, spec: str) -> None:
    urls = _shard_urls(wds_shards)
    ours, theirs = _ours(urls, spec), _theirs(urls, spec)
    assert sorted(ours) == sorted(theirs)
    decoded_types = set()
    for key, sample in theirs.items():
        mine = _fields(ours[key])
        assert mine.keys() == _fields(sample).keys(), key
        for field, value in _fields(sample).items():
            assert_same(mine[field], value, f"{key}.{field} ({spec})")
            decoded_types.add((field, type(value).__name__))
    # every field type was decoded by webdataset, not left as bytes (bin is raw)
    assert {f for f, t in decoded_types if t == "bytes"} == {"bin"}, decoded_types


def test_default_decode_is_rgb8(wds_shards: Path) -> None:
    urls = _shard_urls(wds_shards)
    ours, theirs = _ours(urls), _theirs(urls, "rgb8")
    key = next(iter(theirs))
    decoded = Decoder()(ours[key])
    assert isinstance(decoded, dict)
    for field, value in _fields(theirs[key]).items():
        assert_same(decoded[field], value, field)


def test_every_image_spec_is_webdatasets(wds_shards: Path) -> None:
    from webdataset.autodecode import imagespecs

    assert set(IMAGE_SPECS) == set(imagespecs)


def test_video_fields_stay_bytes_for_decode_member(tmp_path: Path) -> None:
    # mp4/webm/mpg are not images: they stay bytes for streambuf.video.decode_member
    out = Decoder("rgb8")({"__key__": "k", "mp4": b"\x00\x00", "webm": b"x", "mpg": b"y"})
    assert out == {"__key__": "k", "mp4": b"\x00\x00", "webm": b"x", "mpg": b"y"}


def test_pickle_stays_refused(tmp_path: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.mkdir, (tmp_path / "pwned",))

    payload = pickle.dumps(Evil())
    out = Decoder()({"pyd": payload, "pkl": payload, "pickle": payload})
    assert out == {"pyd": payload, "pkl": payload, "pickle": payload}
    assert not (tmp_path / "pwned").exists()


def test_webdataset_handlers_work_as_specs(wds_shards: Path) -> None:
    seg = wds.handle_extension("gray.png", lambda data: ("gray", len(data)))
    ours = _ours(_shard_urls(wds_shards), seg, "torchrgb8")
    sample = next(iter(ours.values()))
    assert sample["gray.png"][0] == "gray"
    assert sample["png"].shape[0] == 3  # torchrgb8: CHW


def test_tar_written_by_tarfile_with_uppercase_extension(tmp_path: Path) -> None:
    path = tmp_path / "upper.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("a/k1.JPG", _png(_image(1, "RGB"))), ("a/k1.Cls", b"3")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ours, theirs = _ours([str(path)]), _theirs([str(path)])
    assert {k: _fields(v) for k, v in ours.items()} == {k: _fields(v) for k, v in theirs.items()}
