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


# -- parser disagreements (tar smuggling): what tarfile and webdataset see is what we yield


def pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return f"{n}".encode() + body


def ext_header(kind: bytes, payload: bytes, pad: bytes = b"\0") -> bytes:
    """A pax (``x``/``X``/``g``) or GNU long-name (``L``) header and its padded payload."""
    ti = tarfile.TarInfo("././@PaxHeader")
    ti.type, ti.size = kind, len(payload)
    return ti.tobuf(format=tarfile.USTAR_FORMAT) + payload + (pad * 512)[: -len(payload) % 512]


def header_with(member: bytes, start: int, value: bytes) -> bytes:
    """``member``'s first header block with bytes ``start..`` replaced, checksum recomputed."""
    block = bytearray(member[:512])
    block[start : start + len(value)] = value
    block[148:156] = b"%06o\0 " % (256 + sum(block[:148]) + sum(block[156:]))
    return bytes(block) + member[512:]


def hidden_member() -> bytes:
    """The header and data of ``hidden.txt`` (no end marker): a hidden sample if a reader
    takes them for members instead of data."""
    return tar_bytes([("hidden.txt", b"smuggled")])[:1024]


def members_of(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [m.name for m in tf.getmembers() if m.isreg()]


@pytest.mark.parametrize(
    "value", ["-512", "-1", "+5", " 5", "5 ", "1_0", "1.5", "0x10", "\u0665", "", "abc"]
)
def test_malformed_pax_size_is_refused(value: str) -> None:
    """A pax ``size`` must be a non-negative decimal integer. ``size=-512`` made the parser
    read the member's data as headers: a sample that tarfile and webdataset never see."""
    inner = hidden_member()
    data = (
        ext_header(b"x", pax_record("size", value))
        + tar_bytes([("a.bin", inner)])[:-1024]
        + bytes(1024)
    )
    got: list[str] = []
    with pytest.raises(ShardError) as info:
        got += [s["__key__"] for s in iter_tar_samples(io.BytesIO(data), url="http://h/x.tar")]
    assert got == []
    err = info.value
    assert err.stage == "tar" and "'a.bin'" in str(err) and "http://h/x.tar" in str(err)
    assert "pax size" in str(err) and "non-negative decimal integer" in str(err)


@pytest.mark.parametrize("field", [b"-0000001000", b"+0000001000", b"0o000001000", b"1_000\0"])
def test_malformed_octal_size_is_refused(field: bytes) -> None:
    data = header_with(tar_bytes([("a.bin", hidden_member())]), 124, field.ljust(12, b"\0"))
    with pytest.raises(ShardError, match=r"invalid size field .*'a\.bin'"):
        read_all(data)


def _dir_with_size() -> bytes:
    d = tarfile.TarInfo("dir")
    d.type = tarfile.DIRTYPE
    block = header_with(d.tobuf(format=tarfile.USTAR_FORMAT), 124, b"%011o\0" % 1024)
    return block + hidden_member() + tar_bytes([("k.txt", b"after")])


def _long_name_and_pax_path() -> bytes:
    return (
        ext_header(b"L", b"one.txt\0")
        + ext_header(b"x", pax_record("path", "two.txt"))
        + tar_bytes([("k.txt", b"x")])
    )


@pytest.mark.parametrize(
    ("data", "match"),
    [
        # tarfile skips no data after a directory entry whatever its size: it would list
        # hidden.txt, which we would have skipped as the directory's data
        (_dir_with_size(), "claims 1024 data bytes"),
        # a mode field tarfile cannot parse (it stops listing there, silently)
        (header_with(tar_bytes([("k.txt", b"x")]), 100, b"\x81abc"), "invalid mode field"),
        # Solaris pax header: tarfile applies its size to the next member, as for "x"
        (ext_header(b"X", pax_record("size", "-512")) + tar_bytes([("a.bin", b"x")]), "pax size"),
        # a global header's path/size: tarfile applies it to later members
        (ext_header(b"g", pax_record("path", "evil.txt")) + tar_bytes([("k.txt", b"x")]), "global"),
        # two names for one member: tarfile and GNU tar pick different ones
        (_long_name_and_pax_path(), "both a GNU long name and a pax path"),
        # junk after a long name: tarfile reads the name up to the first NUL of the block
        (ext_header(b"L", b"ab.tx", pad=b"t") + tar_bytes([("k.txt", b"x")]), "padding"),
        # a pax record that does not end where its length says
        (ext_header(b"x", b"20 path=hidden.txt\n") + tar_bytes([("k.txt", b"x")]), "pax record"),
        (
            ext_header(b"x", pax_record("GNU.sparse.name", "s.txt")) + tar_bytes([("k.txt", b"")]),
            "sparse",
        ),
    ],
    ids=["dir-size", "mode", "X-size", "g-path", "L+path", "L-padding", "pax-record", "sparse"],
)
def test_headers_that_tar_readers_read_differently_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(ShardError, match=match) as info:
        read_all(data)
    assert info.value.stage == "tar"


def test_ustar_prefix_is_read_as_tarfile_reads_it() -> None:
    """tarfile joins the prefix field to the name in any header but GNU long-name ones."""
    data = header_with(tar_bytes([("k.txt", b"x")], fmt=tarfile.GNU_FORMAT), 345, b"pre\0")
    assert members_of(data) == ["pre/k.txt"]
    assert [s["__key__"] for s in read_all(data)] == ["pre/k"]


def test_pax_path_trailing_slash_is_stripped_as_tarfile_does() -> None:
    data = ext_header(b"x", pax_record("path", "k.txt/")) + tar_bytes([("z.bin", b"x")])
    assert members_of(data) == ["k.txt"]
    assert [(s["__key__"], sorted(s)) for s in read_all(data)] == [
        ("k", ["__key__", "__url__", "txt"])
    ]


def test_git_archive_global_comment_is_accepted() -> None:
    data = ext_header(b"g", pax_record("comment", "0" * 40)) + tar_bytes([("k.txt", b"x")])
    assert [s["txt"] for s in read_all(data)] == [b"x"]


def _with_checksum(member: bytes, value: int) -> bytes:
    block = bytearray(member[:512])
    block[148:156] = b"%06o\0 " % value
    return bytes(block) + member[512:]


def test_signed_checksum_is_tarfiles() -> None:
    """Old tars summed header bytes as signed chars: each byte > 127 counts 256 less.
    Accept exactly that (as tarfile does), not another sum tarfile would refuse."""
    data = tar_bytes([("\u00e9t\u00e9.txt", b"x")])  # UTF-8 name: bytes > 127
    block = data[:512]
    high = [b for b in block[:148] + block[156:] if b > 127]
    unsigned = 256 + sum(block[:148]) + sum(block[156:])
    good = _with_checksum(data, unsigned - 256 * len(high))
    assert members_of(good) == ["\u00e9t\u00e9.txt"]
    assert [s["__key__"] for s in read_all(good)] == ["\u00e9t\u00e9"]
    bad = _with_checksum(data, unsigned - 2 * sum(high))
    with pytest.raises(tarfile.ReadError):
        members_of(bad)
    with pytest.raises(ShardError, match="checksum"):
        read_all(bad)


def test_a_bad_number_field_after_good_headers_is_refused() -> None:
    """Number fields shared by a tar's members are parsed once (the lean path); a member
    whose field differs is still parsed, and refused when tarfile could not read it."""
    good = tar_bytes([("a.txt", b"x"), ("b.txt", b"y")])
    assert len(list(iter_tar_samples(io.BytesIO(good), url="good.tar"))) == 2
    bad = header_with(tar_bytes([("k.txt", b"x")]), 100, b"\x81abc")[:1024]
    data = good[:2048] + bad + bytes(1024)  # a, b, then k with a bad mode field
    with pytest.raises(ShardError, match="invalid mode field"):
        list(iter_tar_samples(io.BytesIO(data), url="mixed.tar"))


def test_sample_byte_ranges_are_tarfiles_member_offsets(tmp_path: Path) -> None:
    """``(start, end)`` of each sample: its first member's header offset as tarfile lists
    it, and the next sample's (the end-of-archive marker's for the last one)."""
    from streambuf.sources.tar import iter_tar_records

    path = write_tar(tmp_path / "a.tar", make_samples(0, 6))
    with tarfile.open(path) as tf:
        firsts: dict[str, int] = {}
        for m in tf.getmembers():
            firsts.setdefault(m.name.rsplit(".", 1)[0], m.offset)
        end = tf.offset  # where the end-of-archive marker starts
    with open(path, "rb") as f:
        got = [(s["__key__"], a, b) for _, a, b, s in iter_tar_records(f, url=str(path))]
    starts = list(firsts.values())
    assert got == list(zip(firsts, starts, [*starts[1:], end]))
