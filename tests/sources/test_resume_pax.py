"""Resume over tar shards whose keys are not ASCII: ``tarfile`` (``PAX_FORMAT``) writes a
pax extended header before each such member, so a sample's first header is the pax one.
The saved byte offsets (where the next sample starts, each pending sample's range) must
point at it, not at the member header after it (which has the name mangled to ASCII):
stopped at every batch, among them right after a pax sample and right after an ASCII
one, the resume is exact."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

import streambuf as sb
from tests.resume_harness import check_save_load, ids_of, save_after

from .helpers import add_member
from .resume_data import FAST

pytestmark = pytest.mark.timeout(120)

N_SHARDS, PER_SHARD = 3, 9


def pax_key(shard: int, i: int) -> str:
    """Two of three keys non-ASCII (a pax header each), every third plain ASCII."""
    if i % 3 == 2:
        return f"plain{shard}/a-{i:03d}"
    return f"échantillon{shard}/ü-{i:03d}"


def write_pax_shards(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(N_SHARDS):
        path = root / f"pax-{s:04d}.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tf:
            for i in range(PER_SHARD):
                for field in ("cls", "txt"):
                    add_member(tf, f"{pax_key(s, i)}.{field}", f"{s}-{i}-{field}".encode() * 20)
        paths.append(str(path))
    return paths


def pax_loader(*, paths, workers=0, lanes=2, shuffle=0, batch=2):
    pipe = sb.shards(list(paths), lanes=lanes, seed=4, **FAST)
    if shuffle:
        pipe = pipe.shuffle(shuffle)
    return sb.Loader(
        pipe.batch(batch),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="4MiB",
        timeout_s=60,
    )


@pytest.fixture
def pax_paths(tmp_path: Path) -> list[str]:
    return write_pax_shards(tmp_path / "pax")


def test_the_shards_have_pax_headers_and_read_whole(pax_paths) -> None:
    with open(pax_paths[0], "rb") as f:
        first = f.read(512)
    assert first[156:157] == b"x"  # a pax header comes first
    keys = sorted(k for b in pax_loader(paths=pax_paths) for k in ids_of(b))
    assert keys == sorted(pax_key(s, i) for s in range(N_SHARDS) for i in range(PER_SHARD))


@pytest.mark.parametrize(
    ("lanes", "shuffle", "batch"), [(1, 0, 1), (2, 0, 2), (2, 4, 3)], ids=["l1b1", "l2b2", "sh"]
)
def test_exact_resume_at_every_stop(pax_paths, lanes, shuffle, batch) -> None:
    """Batches of one, one lane: stop k is right after sample k-1, so the stops fall after
    pax samples (i % 3 != 2) and after ASCII ones (i % 3 == 2), across shard ends."""
    kw = {"paths": pax_paths, "lanes": lanes, "shuffle": shuffle, "batch": batch}
    n = len(list(pax_loader(**kw)))
    check_save_load(pax_loader, kw, [*range(1, n), "last"])


def test_saved_offsets_point_at_the_pax_header(pax_paths) -> None:
    """Every saved offset of a pax sample (the lane's next sample, a pending sample's byte
    range) is that sample's first header: the pax one."""
    kw = {"paths": pax_paths, "lanes": 1, "batch": 1}
    checked = 0
    for stop in (1, 2, 3, 4):
        _, state = save_after(pax_loader, kw, stop)
        snap = state["workers"][0]
        shards = _shard_order(state)
        slot_index, nxt, offset = snap["source"]["lanes"][0]
        points = [(shards[slot_index], nxt, offset)]
        points += [(row[0], row[1], row[2][0]) for row in snap["pending"]]
        for shard, index, at in points:
            if index % 3 == 2:
                continue  # an ASCII key: no pax header
            with open(pax_paths[shard], "rb") as f:
                f.seek(at)
                header = f.read(512)
            assert header[156:157] == b"x", (stop, shard, index, at)
            checked += 1
    assert checked >= 4


def _shard_order(state) -> list[int]:
    from streambuf.sharding import assign, shard_order

    order = shard_order(N_SHARDS, seed=4, epoch=0, shuffle=True)
    return list(assign(N_SHARDS, order, 0, 1).shards)
