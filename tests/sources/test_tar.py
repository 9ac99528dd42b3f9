from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from streambuf.errors import ShardError
from streambuf.sources import iter_tar_samples

from .helpers import add_member, make_samples, write_tar

pytestmark = pytest.mark.timeout(30)


def read_all(data: bytes, **kw: object) -> list[dict]:
    return list(iter_tar_samples(io.BytesIO(data), url="mem://x.tar", **kw))  # type: ignore[arg-type]


def tar_bytes(members: list[tuple[str, bytes]], *, fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            add_member(tf, name, data)
    return buf.getvalue()


@pytest.mark.parametrize("gz", [False, True])
def test_tarfile_shards_round_trip(tmp_path: Path, gz: bool) -> None:
    samples = make_samples(0, 30)
    path = write_tar(tmp_path / ("a.tar.gz" if gz else "a.tar"), samples, gz=gz)
    with open(path, "rb") as f:
        got = list(iter_tar_samples(f, url=str(path)))
    assert [s["__key__"] for s in got] == [s["__key__"].decode() for s in samples]
    for want, have in zip(samples, got):
        assert have["__url__"] == str(path)
        assert {k: v for k, v in have.items() if not k.startswith("__")} == {
            k: v for k, v in want.items() if not k.startswith("__")
        }


def test_webdataset_writer_shards(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    np = pytest.importorskip("numpy")
    written = []
    with wds.TarWriter(str(tmp_path / "w.tar")) as sink:
        for i in range(12):
            s = {
                "__key__": f"dir/{i:06d}",
                "txt": f"t{i}",
                "cls": i,
                "json": {"i": i},
                "npy": np.arange(i, dtype=np.int32),
                "seg.png": b"raw-bytes",
            }
            sink.write(s)
            written.append(s)
    with open(tmp_path / "w.tar", "rb") as f:
        got = list(iter_tar_samples(f, url="w.tar"))
    # Compare with webdataset's own reader, field for field.
    ref = list(wds.WebDataset(str(tmp_path / "w.tar"), shardshuffle=False))
    assert len(got) == len(ref) == 12
    for mine, theirs in zip(got, ref):
        assert mine["__key__"] == theirs["__key__"]
        fields = {k for k in theirs if not k.startswith("__")}
        assert fields == {k for k in mine if not k.startswith("__")}
        for k in fields:
            assert mine[k] == theirs[k]
    assert got[3]["seg.png"] == b"raw-bytes"
    assert got[3]["txt"] == b"t3" and got[3]["cls"] == b"3"


def test_grouping_rules_match_webdataset() -> None:
    data = tar_bytes(
        [
            ("a/b/000001.jpg", b"j1"),
            ("a/b/000001.seg.PNG", b"p1"),
            ("a/b/000002.jpg", b"j2"),
            ("noextension", b"skipped"),
            ("__meta__/info.json", b"skipped"),
            ("__index__", b"skipped"),
            ("c.d/000003.txt", b"t3"),
        ]
    )
    got = read_all(data)
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in got] == [
        ("a/b/000001", ["jpg", "seg.png"]),
        ("a/b/000002", ["jpg"]),
        ("c.d/000003", ["txt"]),
    ]


def test_directories_and_links_skipped() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo("dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        add_member(tf, "dir/1.txt", b"one")
        ln = tarfile.TarInfo("dir/2.txt")
        ln.type = tarfile.SYMTYPE
        ln.linkname = "1.txt"
        tf.addfile(ln)
    got = read_all(buf.getvalue())
    assert [(s["__key__"], s["txt"]) for s in got] == [("dir/1", b"one")]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names(fmt: int) -> None:
    name = "x" * 150 + "/" + "y" * 120 + ".txt"
    got = read_all(tar_bytes([(name, b"long")], fmt=fmt))
    assert got == [{"__key__": name[:-4], "__url__": "mem://x.tar", "txt": b"long"}]


def test_duplicate_field_is_an_error() -> None:
    with pytest.raises(ShardError, match="appears twice"):
        read_all(tar_bytes([("k.txt", b"1"), ("k.txt", b"2")]))


def test_truncated_tar_names_url_and_member(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", make_samples(0, 5, payload=5000))
    data = path.read_bytes()
    with tarfile.open(path) as tf:
        member = tf.getmember("s000/00003.bin")
    cut = data[: member.offset_data + 100]
    with pytest.raises(ShardError) as info:
        read_all(cut)
    err = info.value
    assert err.stage == "tar" and err.source == "mem://x.tar"
    assert "s000/00003.bin" in str(err) and "mem://x.tar" in str(err)


@pytest.mark.parametrize("cut", [0, 700, "boundary"])
def test_truncation_anywhere_is_detected(tmp_path: Path, cut: object) -> None:
    path = write_tar(tmp_path / "t.tar", make_samples(0, 3))
    data = path.read_bytes()
    if cut == "boundary":  # ends cleanly between members: still no end-of-archive marker
        with tarfile.open(path) as tf:
            cut = tf.getmember("s000/00002.bin").offset
    with pytest.raises(ShardError, match="member"):
        read_all(data[: int(cut)])  # type: ignore[call-overload]


def test_truncated_gzip(tmp_path: Path) -> None:
    data = write_tar(tmp_path / "t.tar.gz", make_samples(0, 10), gz=True).read_bytes()
    with pytest.raises(ShardError, match=r"t\.tar"):
        list(iter_tar_samples(io.BytesIO(data[: len(data) // 2]), url="h://t.tar.gz"))


def test_corrupt_header_checksum(tmp_path: Path) -> None:
    data = bytearray(write_tar(tmp_path / "t.tar", make_samples(0, 3)).read_bytes())
    data[5] ^= 0xFF
    with pytest.raises(ShardError, match="checksum"):
        read_all(bytes(data))


def test_prefix_is_delivered_before_the_error(tmp_path: Path) -> None:
    data = write_tar(tmp_path / "t.tar", make_samples(0, 10)).read_bytes()
    got = []
    with pytest.raises(ShardError):
        for s in iter_tar_samples(io.BytesIO(data[: len(data) // 2]), url="x"):
            got.append(s["__key__"])
    assert got == [f"s000/{i:05d}" for i in range(len(got))] and 2 <= len(got) < 10


def test_oversized_member_refused_before_reading() -> None:
    class Guard(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            out = super().read(n)
            assert self.tell() <= 2048, "read past the oversized header"
            return out

    header_only = tar_bytes([("big.bin", b"\0" * 10_000)])[:512]
    with pytest.raises(ShardError, match="max_member_bytes") as info:
        list(iter_tar_samples(Guard(header_only + b"\0" * 1536), url="u", max_member_bytes=4096))
    assert "big.bin" in str(info.value)


def test_max_sample_bytes() -> None:
    data = tar_bytes([("k.a", b"x" * 600), ("k.b", b"x" * 600)])
    assert len(read_all(data, max_sample_bytes=2000)) == 1
    with pytest.raises(ShardError, match="max_sample_bytes"):
        read_all(data, max_sample_bytes=1000)


def test_gzip_bomb_bounded_by_max_shard_bytes() -> None:
    raw = tar_bytes([("k.a", b"\0" * (8 << 20))])
    bomb = gzip.compress(raw, compresslevel=9)
    assert len(bomb) < 20_000
    with pytest.raises(ShardError, match="max_shard_bytes"):
        list(iter_tar_samples(io.BytesIO(bomb), url="bomb.tgz", max_shard_bytes=1 << 20))
    # the same stream passes with enough room, and concatenated gzip members work
    two = gzip.compress(raw[: 1 << 20]) + gzip.compress(raw[1 << 20 :])
    assert len(list(iter_tar_samples(io.BytesIO(two), url="ok.tgz"))) == 1


def test_empty_stream() -> None:
    with pytest.raises(ShardError, match="end-of-archive"):
        read_all(b"")
