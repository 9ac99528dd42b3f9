"""Resume against a rebuilt shard list: shards are identified by name (last path
component, query string dropped), so a reordered list, the same files in another folder
or re-signed URLs resume exactly once; appended shards are read whole in the rest of the
epoch; removed, replaced or ambiguous shards are a ``ValueError`` naming them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambuf as sb
from tests.resume_harness import counted_once, resume_and_finish, save_after

from .helpers import expected_keys, make_samples, make_shards, write_tar
from .httpserver import FaultyServer
from .resume_data import FAST

pytestmark = pytest.mark.timeout(300)

N, PER = 6, 10  # 6 shards x 10 samples, batches of 4: 15 batches


def list_loader(*, paths, workers=0):
    pipe = sb.shards(list(paths), lanes=2, seed=5, shuffle_shards=True, **FAST)
    return sb.Loader(
        pipe.shuffle(5).batch(4),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="4MiB",
        timeout_s=60,
    )


@pytest.fixture
def six(tmp_path: Path) -> list[str]:
    return [str(p) for p in make_shards(tmp_path / "six", N, PER)]


def keys(batches) -> list[str]:
    return [k for b in batches for k in b]


@pytest.mark.parametrize("workers", [0, 2])
def test_reversed_list_resumes_exactly_once(six: list[str], workers: int) -> None:
    first, state = save_after(list_loader, {"paths": six, "workers": workers}, 4)
    rest, _ = resume_and_finish(list_loader, {"paths": six[::-1], "workers": workers}, state)
    counted_once(keys(first + rest), sorted(expected_keys(N, PER)))


def test_moved_copy_same_order_resumes_exactly(six: list[str], tmp_path: Path) -> None:
    moved = tmp_path / "moved"
    shutil.copytree(Path(six[0]).parent, moved)
    copy = [str(moved / Path(p).name) for p in six]
    ref = [list(b["__key__"]) for b in list_loader(paths=six)]
    first, state = save_after(list_loader, {"paths": six}, 5)
    rest, _ = resume_and_finish(list_loader, {"paths": copy}, state)
    assert first + rest == ref  # same names, same order: the exact (order-preserving) path


@pytest.mark.parametrize("workers", [0, 2])
def test_appended_shards_are_read_once_in_the_rest_of_the_epoch(
    six: list[str], tmp_path: Path, workers: int
) -> None:
    more = [str(write_tar(tmp_path / f"shard-{s:06d}.tar", make_samples(s, PER))) for s in (6, 7)]
    first, state = save_after(list_loader, {"paths": six, "workers": workers}, 4)
    rest, _ = resume_and_finish(list_loader, {"paths": six + more, "workers": workers}, state)
    counted_once(keys(first + rest), sorted(expected_keys(N + 2, PER)))


def test_replaced_shards_are_refused_by_name(six: list[str], tmp_path: Path) -> None:
    _, state = save_after(list_loader, {"paths": six}, 4)
    others = [str(write_tar(tmp_path / f"other-{s}.tar", make_samples(s, PER))) for s in (8, 9)]
    replaced = [six[0], others[0], six[2], six[3], others[1], six[5]]
    loader = list_loader(paths=replaced)
    with pytest.raises(ValueError, match=re.escape("shard-000001.tar', 'shard-000004.tar'")) as err:
        loader.load_state_dict(state)
    assert "2 shard(s) of the saved run are not in this pipeline's list" in str(err.value)
    with pytest.raises(ValueError, match=r"'shard-000003\.tar'.*cannot be resumed"):
        list_loader(paths=six[:3] + six[4:]).load_state_dict(state)  # one removed


def test_resigned_urls_resume_exactly(http_server: FaultyServer) -> None:
    base = http_server.base_url
    signed = [f"{base}/shard-{i:06d}.tar?X-Amz-Signature=aaa{i}&X-Amz-Expires=60" for i in range(4)]
    again = [u.replace("aaa", "bbb") for u in signed]
    kw = {"paths": signed, "workers": 0}
    ref = [list(b["__key__"]) for b in list_loader(**kw)]
    first, state = save_after(list_loader, kw, 7)
    assert "X-Amz" not in str(state)  # no signature in a checkpoint
    rest, _ = resume_and_finish(list_loader, {"paths": again, "workers": 0}, state)
    assert first + rest == ref


def test_names_shared_by_two_files_are_told_apart_by_their_folders(tmp_path: Path) -> None:
    a = make_shards(tmp_path / "a", 3, PER)
    (tmp_path / "b").mkdir()
    b = write_tar(tmp_path / "b" / "shard-000000.tar", make_samples(7, PER))
    paths = [str(p) for p in (*a, b)]  # two different files named shard-000000.tar
    want = sorted(expected_keys(3, PER) | {f"s007/{i:05d}" for i in range(PER)})
    first, state = save_after(list_loader, {"paths": paths}, 3)
    from streambuf._identity import decode_names

    assert decode_names(state["names"]) == [
        "a/shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
        "b/shard-000000.tar",
    ]
    rest, _ = resume_and_finish(list_loader, {"paths": paths}, state)
    counted_once(keys(first + rest), want)  # the same list: positions as saved
    rest, _ = resume_and_finish(list_loader, {"paths": paths[::-1]}, state)
    counted_once(keys(first + rest), want)  # reversed: each matched by its folder


def _two_languages(tmp_path: Path) -> tuple[list[str], list[str], list[str]]:
    """``en/000..003.tar`` and ``fr/000..003.tar``: equal names, other samples."""
    en = [str(p) for p in make_shards(tmp_path / "en", 4, PER)]
    (tmp_path / "fr").mkdir()
    fr = [
        str(write_tar(tmp_path / "fr" / f"shard-{s:06d}.tar", make_samples(10 + s, PER)))
        for s in range(4)
    ]
    want = sorted(
        expected_keys(4, PER) | {f"s{10 + s:03d}/{i:05d}" for s in range(4) for i in range(PER)}
    )
    return en, fr, want


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [3, 9])
def test_folders_of_equal_names_swapped_at_resume_every_sample_once(
    tmp_path: Path, workers: int, stop: int
) -> None:
    en, fr, want = _two_languages(tmp_path)
    first, state = save_after(list_loader, {"paths": en + fr, "workers": workers}, stop)
    rest, _ = resume_and_finish(list_loader, {"paths": fr + en, "workers": workers}, state)
    counted_once(keys(first + rest), want)


def test_a_name_that_two_shards_of_the_new_list_match_is_refused(tmp_path: Path) -> None:
    en, fr, _ = _two_languages(tmp_path)
    _, state = save_after(list_loader, {"paths": en}, 3)  # saved as shard-00000k.tar
    with pytest.raises(ValueError, match=r"not unique.*'shard-000000\.tar'"):
        list_loader(paths=en + fr[:1]).load_state_dict(state)  # en/ or fr/shard-000000?
    with pytest.raises(ValueError, match=r"not unique"):
        list_loader(paths=en + en[:1]).load_state_dict(state)  # the same file twice
    _, both = save_after(list_loader, {"paths": [en[0], fr[0]]}, 1)
    with pytest.raises(ValueError, match=r"not unique.*'en/shard-000000\.tar'"):
        list_loader(paths=en[:1]).load_state_dict(both)  # which of the two is this one?


@pytest.mark.parametrize("workers", [0, 2])
def test_an_elastic_resume_into_a_reordered_list_with_a_partly_delivered_group(
    tmp_path: Path, workers: int
) -> None:
    """A group flattened in a worker's stream is partly delivered at the stop; the resume
    runs at another worker count over the list in another order."""
    en, fr, want = _two_languages(tmp_path)
    kw = {"paths": en + fr, "workers": 2}
    first, state = save_after(group_loader, kw, 3)
    rest, _ = resume_and_finish(group_loader, {"paths": fr[::-1] + en, "workers": workers}, state)
    counted_once(keys(first + rest), want)


class _Pairs(sb.Stage):
    """Samples two by two, as one group (flattened again after it); an odd one last."""

    holds_samples = True

    def iterate(self, samples, state):
        held = []
        for x in samples:
            held.append(x)
            if len(held) == 2:
                yield held
                held = []
        if held:
            yield held


def group_loader(*, paths, workers=0):
    pipe = sb.shards(list(paths), lanes=2, seed=5, shuffle_shards=True, **FAST)
    pipe = pipe.compose(_Pairs()).flatten().batch(3)
    return sb.Loader(
        pipe, num_workers=workers, max_batches=max(workers, 1) * 2, max_bytes="4MiB", timeout_s=60
    )


@given(
    st.lists(
        st.one_of(
            st.from_regex(r"[a-z]{0,3}[0-9]{1,4}(\.tar)?", fullmatch=True),
            st.text(max_size=6),
            st.builds(lambda i, w: f"train-{i:0{w}d}.tar", st.integers(0, 120), st.integers(1, 4)),
        ),
        max_size=40,
    )
)
def test_name_encoding_round_trips(names: list[str]) -> None:
    from streambuf._identity import decode_names, encode_names

    encoded = encode_names(names)
    assert decode_names(encoded) == names
    assert len(encoded) <= max(1, len(names))


def test_names_are_compact_and_drop_what_is_not_identity() -> None:
    from streambuf._identity import encode_names, shard_name

    many = [f"s3://bucket/train-{i:06d}.tar" for i in range(100_000)]
    assert encode_names([shard_name(u) for u in many]) == [["train-", ".tar", 6, 0, 1, 100_000]]
    assert encode_names([shard_name(u) for u in many[::-1]]) == [
        ["train-", ".tar", 6, 99_999, -1, 100_000]
    ]
    assert shard_name("https://h/x/a-1.tar?sig=1#f") == "a-1.tar"
    assert shard_name("/data/dir/a-1.tar") == shard_name("file:///other/a-1.tar") == "a-1.tar"
    assert shard_name((3, "https://h/v.mp4?t=1")) == "v.mp4"
    assert shard_name(12) is None
