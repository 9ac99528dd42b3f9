"""The webdataset verbs (``to_tuple``, ``rename``, ``map_dict``, ``select``): the same
results as webdataset's on the same shards, clear errors (or counted skips), and exact
resume through them with real DataLoader workers."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from streambuf.errors import ShardError, TooManyFailures
from streambuf.wds import MapDict, Rename, ToTuple
from tests.resume_harness import check_save_load

from .resume_data import plus_one, tuple_keys, verbs_loader

pytestmark = pytest.mark.timeout(300)

S = {"__key__": "k1", "__url__": "http://u:pw@h/a.tar", "jpg": b"J", "cls": 3, "txt": "t"}


def test_to_tuple_alternatives_and_split() -> None:
    assert ToTuple("jpg;png", "cls")(S) == (b"J", 3)
    assert ToTuple("png;jpg", "cls")(S) == (b"J", 3)
    assert ToTuple("jpg cls")(S) == (b"J", 3)  # one string with spaces is split
    both = dict(S, png=b"P")
    assert ToTuple("jpg;png")(both) == (b"J",) and ToTuple("png;jpg")(both) == (b"P",)
    assert Rename(image="png;jpg")(both)["image"] == b"P"
    assert ToTuple("cls")(S) == (3,)  # always a tuple
    assert ToTuple(["png", "jpg"], "__key__")(S) == (b"J", "k1")
    assert ToTuple("png", "cls", missing_is_error=False)(S) == (None, 3)
    assert ToTuple("n", missing_is_error=False, none_is_error=False)(S) == (None,)


def test_to_tuple_missing_field_names_it_the_sample_and_the_shard() -> None:
    with pytest.raises(ShardError) as info:
        ToTuple("png;webp", "cls")(S)
    msg = str(info.value)
    assert "'png;webp'" in msg and "'k1'" in msg and "'jpg'" in msg and "'cls'" in msg
    assert info.value.stage == "to_tuple" and info.value.source == "http://***@h/a.tar"
    assert "missing_is_error=False" in msg
    with pytest.raises(ShardError, match="is None"):
        ToTuple("x")({"x": None})


def test_rename_keep_and_alternatives() -> None:
    out = Rename(image="png;jpg", label="cls")(S)
    assert out == {"__key__": "k1", "__url__": S["__url__"], "txt": "t", "image": b"J", "label": 3}
    assert Rename(keep=False, image="jpg")(S) == {"image": b"J"}
    with pytest.raises(ShardError, match=r"rename image=: no field 'png'") as info:
        Rename(image="png")(S)
    assert info.value.stage == "rename"


def test_map_dict_copies_and_keeps_user_error_types() -> None:
    out = MapDict(cls=plus_one)(S)
    assert out["cls"] == 4 and S["cls"] == 3  # the input is not changed
    with pytest.raises(ShardError, match=r"map_dict png=: no field 'png'"):
        MapDict(png=plus_one)(S)
    with pytest.raises(TypeError) as info:  # the user's own error: its type kept
        MapDict(txt=plus_one)(S)
    assert "map_dict txt=" in "".join(getattr(info.value, "__notes__", []))


def test_skip_counts_and_limits() -> None:
    bad = dict(S, __key__="bad")
    del bad["jpg"]
    fn = ToTuple("jpg", "cls", on_error="skip", max_failures=1)
    assert fn(bad) is sb.wds.SKIPPED and fn(S) == (b"J", 3) and fn.skipped == 1
    with pytest.raises(TooManyFailures):
        fn(bad)
    samples = [dict(S, __key__=f"k{i}") if i % 2 else dict(bad, __key__=f"k{i}") for i in range(6)]
    got = list(sb.Pipeline(samples).to_tuple("__key__", "jpg", on_error="skip"))
    assert got == [("k1", b"J"), ("k3", b"J"), ("k5", b"J")]
    got2 = list(sb.Pipeline(samples).map_dict(jpg=bytes.lower, on_error="skip"))
    assert [s["__key__"] for s in got2] == ["k1", "k3", "k5"]


def test_options_checked_at_build_time() -> None:
    pipe = sb.Pipeline([S])
    with pytest.raises(ValueError, match="at least one field"):
        pipe.to_tuple()
    with pytest.raises(ValueError, match="new=old"):
        pipe.rename()
    with pytest.raises(TypeError, match="not callable"):
        pipe.map_dict(jpg=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_error"):
        pipe.to_tuple("jpg", on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no blanks"):
        pipe.rename(a="jpg;")


def test_verbs_pickle() -> None:
    for fn in (ToTuple("jpg;png", "cls"), Rename(a="jpg"), MapDict(cls=plus_one)):
        assert pickle.loads(pickle.dumps(fn))(S) == fn(S)


def _theirs(shards: list[str]) -> Any:
    wds = pytest.importorskip("webdataset")
    return wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode()


def test_same_results_as_webdataset(shard_dir: Path) -> None:
    shards = sorted(str(p) for p in shard_dir.glob("*.tar"))
    ours = sb.shards(shards, lanes=1, shuffle_shards=False).decode()

    def strip(xs: Any) -> list[Any]:
        return [
            {k: v for k, v in s.items() if k != "__url__" and k != "__local_path__"}
            if isinstance(s, dict)
            else s
            for s in xs
        ]

    def is_odd(s: dict) -> bool:
        return s["label"] % 2 == 1

    for build in (
        lambda p: p.to_tuple("__key__", "jpg;cls", "txt"),
        lambda p: p.to_tuple("cls;txt", "txt;cls"),  # both present: the first one
        lambda p: p.to_tuple("__key__ cls"),
        lambda p: p.rename(label="cls", text="txt;text").select(is_odd),
        lambda p: p.rename(keep=False, label="cls").to_tuple("label"),
        lambda p: p.map_dict(cls=plus_one).to_tuple("__key__", "cls"),
    ):
        a, b = strip(build(_theirs(shards))), strip(build(ours))
        assert len(a) == 80 or len(a) == 40
        assert a == b


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_the_verbs(shard_dir: Path, workers: int) -> None:
    # 80 samples, cls 3 dropped by select: 72 left, 18 batches of (key, label, text)
    ref = check_save_load(
        verbs_loader,
        {"spec": str(shard_dir / "*.tar"), "workers": workers},
        [1, 7, 12, "last", "end"],
        ids=tuple_keys,
    )
    keys = [k for b in ref[0] for k in b]
    assert len(keys) == 72 and len(set(keys)) == 72
    assert all(not k.endswith(":4") for k in keys)


def test_decode_specs_checked_at_build_time() -> None:
    pipe = sb.Pipeline([S])
    with pytest.raises(ValueError, match="image output mode"):
        pipe.decode("rgb9")
    with pytest.raises(TypeError, match="mapping"):
        pipe.decode(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_sample_bytes"):
        pipe.decode(max_sample_bytes="lots")
