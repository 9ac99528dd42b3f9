"""``token_files``: flat token files as blocks read by byte ranges. Blocks equal
``numpy.memmap`` slices of the same files (local, and over HTTP with connections dropped
mid-range), shuffled by epoch, every block once; exact and elastic resume through a
Loader; bad files named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambuf as sb
from tests.resume_harness import check_save_load, counted_once, resume_and_finish, save_after
from tests.sources.httpserver import FaultyServer

pytestmark = pytest.mark.timeout(120)

SEQ = 16
SIZES = (200, 97, 33)  # tokens per file: the last tokens of each do not fill a block
ROOT: Path | None = None  # where the resume tests' files are (set by their fixture)


def write_files(root: Path, dtype: str = "uint16") -> list[str]:
    paths = []
    for f, n in enumerate(SIZES):
        tokens = (np.arange(n) * 7 + f * 10_000) % np.iinfo(dtype).max
        path = root / f"tokens-{f}.bin"
        tokens.astype(dtype).tofile(path)
        paths.append(str(path))
    return paths


def blocks_of(n: int, overlap: int) -> int:
    return (n - overlap) // SEQ


def check_blocks(
    samples: list[dict[str, Any]], files: dict[str, str], dtype: str, overlap: int
) -> None:
    """Each sample is its file's memmap slice; every block of every file exactly once."""
    for s in samples:
        mm = np.memmap(files[s["__url__"]], dtype=dtype, mode="r")
        b = s["block"]
        want = np.asarray(mm[b * SEQ : b * SEQ + SEQ + overlap], dtype=np.int64)
        assert s["tokens"].tolist() == want.tolist(), (s["__url__"], b)
    got = sorted((s["__url__"], s["block"]) for s in samples)
    want_ids = sorted(
        (url, b)
        for url, path in files.items()
        for b in range(blocks_of(SIZES[_index(path)], overlap))
    )
    assert got == want_ids


def _index(path: str) -> int:
    return int(Path(path).stem.split("-")[1])


@pytest.mark.parametrize(("dtype", "overlap"), [("uint16", 0), ("uint16", 1), ("uint32", 1)])
def test_local_blocks_equal_memmap_slices(tmp_path: Path, dtype: str, overlap: int) -> None:
    paths = write_files(tmp_path, dtype)
    pipe = sb.token_files(paths, seq_len=SEQ, dtype=dtype, overlap=overlap, seed=3)
    samples = list(pipe)
    check_blocks(samples, {p: p for p in paths}, dtype, overlap)
    order0 = [(s["__url__"], s["block"]) for s in samples]
    assert order0 != sorted(order0)  # shuffled across and within files
    pipe.set_epoch(1)
    assert [(s["__url__"], s["block"]) for s in pipe] != order0  # another order each epoch
    assert all(s["tokens"].numel() == SEQ + overlap for s in samples)


def test_http_blocks_survive_connections_dropped_mid_range(tmp_path: Path) -> None:
    paths = write_files(tmp_path)
    with FaultyServer(tmp_path) as server:
        server.drop("*", after_bytes=10, times=6)  # each cut 10 bytes into a block's range
        urls = [f"{server.base_url}/{Path(p).name}" for p in paths]
        pipe = sb.token_files(urls, seq_len=SEQ, overlap=1, threads=2)
        samples = list(pipe)
    check_blocks(samples, dict(zip(urls, paths)), "uint16", 1)


def test_a_file_that_is_not_whole_tokens_is_named(tmp_path: Path) -> None:
    paths = write_files(tmp_path)
    bad = tmp_path / "odd.bin"
    bad.write_bytes(b"\x00" * 33)
    with pytest.raises(ValueError, match=r"odd\.bin has 33 bytes, not a multiple of 2"):
        sb.token_files([*paths, str(bad)], seq_len=SEQ)
    with pytest.raises(ValueError, match="dtype"):
        sb.token_files(paths, seq_len=SEQ, dtype="float32")
    for folder in (str(tmp_path), f"{tmp_path}/"):  # (read as a 4 KiB file, failed later)
        with pytest.raises(ValueError, match=f"{tmp_path}/? is a directory.*list the files"):
            sb.token_files([*paths, folder], seq_len=SEQ)
    with pytest.raises(ValueError, match="overlap"):
        sb.token_files(paths, seq_len=SEQ, overlap=-1)


# -- resume through a Loader ---------------------------------------------------------------
def token_loader(*, workers: int = 2) -> sb.Loader:
    assert ROOT is not None
    paths = sorted(str(p) for p in ROOT.glob("tokens-*.bin"))
    pipe = sb.token_files(paths, seq_len=SEQ, overlap=1, seed=1, threads=2).batch(3)
    return sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="2MiB", timeout_s=60)


def block_ids(batch: Any) -> list[Any]:
    return [(Path(u).name, int(b)) for u, b in zip(batch["__url__"], batch["block"])]


@pytest.fixture
def token_root(tmp_path: Path) -> Any:
    global ROOT
    write_files(tmp_path)
    ROOT = tmp_path
    yield tmp_path
    ROOT = None


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume(token_root: Path, workers: int) -> None:
    check_save_load(token_loader, {"workers": workers}, [1, 4, "last"], ids=block_ids)


def test_elastic_resume_two_to_three_workers(token_root: Path) -> None:
    first, state = save_after(token_loader, {"workers": 2}, 3, ids=block_ids)
    rest, _ = resume_and_finish(token_loader, {"workers": 3}, state, ids=block_ids)
    want = [(f"tokens-{f}.bin", b) for f, n in enumerate(SIZES) for b in range(blocks_of(n, 1))]
    counted_once([x for b in first + rest for x in b], want)


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("uint16", "uint16"), ("int32", "int32")])
def test_keep_dtype_gives_the_files_tokens_as_stored(
    tmp_path: Path, dtype: str, torch_dtype: str
) -> None:
    import torch

    paths = write_files(tmp_path, dtype)
    samples = list(sb.token_files(paths, seq_len=SEQ, dtype=dtype, keep_dtype=True))
    assert {s["tokens"].dtype for s in samples} == {getattr(torch, torch_dtype)}
    check_blocks(samples, {p: p for p in paths}, dtype, 0)
    with pytest.raises(TypeError, match="keep_dtype"):
        sb.token_files(paths, seq_len=SEQ, keep_dtype="yes")


def test_a_state_does_not_load_into_the_files_in_another_order(token_root: Path) -> None:
    """A saved position is a block number: the same block only for the same files in the
    same order. A reordered list, or a file swapped for another with as many blocks, is
    refused (it lost and duplicated blocks silently); the same files moved elsewhere
    resume exactly once."""
    import json
    import shutil

    paths = sorted(str(p) for p in token_root.glob("tokens-*.bin"))

    def loader(files: list[str]) -> sb.Loader:
        pipe = sb.token_files(files, seq_len=SEQ, overlap=1, seed=1).batch(3)
        return sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="2MiB", timeout_s=60)

    first_loader = loader(paths)
    it = iter(first_loader)
    first = [block_ids(next(it)) for _ in range(4)]
    state = json.loads(json.dumps(first_loader.state_dict()))
    del it
    with pytest.raises(ValueError, match=r"saved order .*token_files|token_files.*saved order"):
        loader(paths[::-1]).load_state_dict(state)
    other = token_root / "swapped"
    other.mkdir()
    swapped = list(paths)
    swapped[0] = str(other / "another-0.bin")
    shutil.copy(paths[0], swapped[0])  # as many blocks, another file
    with pytest.raises(ValueError, match="saved order"):
        loader(swapped).load_state_dict(state)
    moved = token_root / "moved"
    moved.mkdir()
    for p in paths:
        shutil.copy(p, moved / Path(p).name)
    resumed = loader([str(moved / Path(p).name) for p in paths])
    resumed.load_state_dict(state)
    rest = [block_ids(b) for b in resumed]
    want = [(f"tokens-{f}.bin", b) for f, n in enumerate(SIZES) for b in range(blocks_of(n, 1))]
    counted_once([x for b in first + rest for x in b], want)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_descriptors_are_closed_with_their_pipeline(tmp_path: Path) -> None:
    """Local files are read through descriptors kept per file (at most 64 a process);
    a pipeline dropped after its run closes them (they stayed open for the life of the
    process: a new pipeline per evaluation ran out of descriptors)."""
    import gc
    import os

    paths = write_files(tmp_path)
    list(sb.token_files(paths[:1], seq_len=SEQ, threads=1))  # (the process's first run
    gc.collect()  # opens what it keeps for good: shared memory, a CPU-time reader)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        pipe = sb.token_files(paths, seq_len=SEQ, threads=1)
        assert len(list(pipe)) == sum(blocks_of(n, 0) for n in SIZES)
        assert len(os.listdir("/proc/self/fd")) >= before + len(paths)  # kept while alive
        del pipe
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) <= before


def test_files_of_one_name_in_two_folders_are_told_apart(tmp_path: Path) -> None:
    """Fixed-size chunks in one folder per data set share their names: swapping two
    keeps every name, so the identity uses the paths there."""
    import json
    import shutil

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        for p in write_files(tmp_path):
            shutil.copy(p, tmp_path / folder / Path(p).name)
    files = [str(tmp_path / d / "tokens-0.bin") for d in ("a", "b")]

    def pipe(listed: list[str]) -> sb.Pipeline:
        return sb.token_files(listed, seq_len=SEQ, seed=1).batch(2)

    saved = pipe(files)
    it = iter(saved)
    next(it)
    state = json.loads(json.dumps(saved.state_dict()))
    pipe(files).load_state_dict(state)
    with pytest.raises(ValueError, match="saved order"):
        pipe(files[::-1]).load_state_dict(state)


def test_a_state_saved_before_items_had_identities_loads_with_a_warning(
    token_root: Path,
) -> None:
    import json
    import re

    from streambuf._state import digest

    paths = sorted(str(p) for p in token_root.glob("tokens-*.bin"))
    saved = sb.token_files(paths, seq_len=SEQ, seed=1).batch(2)
    it = iter(saved)
    next(it)
    state = json.loads(json.dumps(saved.state_dict()))
    state["fingerprint"] = re.sub(r";items\[[^\]]*\]", "", state["fingerprint"])
    state["digest"] = digest(state)  # (as the code before identities wrote it)
    with pytest.warns(UserWarning, match="predates the identity of its items"):
        sb.token_files(paths, seq_len=SEQ, seed=1).batch(2).load_state_dict(state)


# -- order, explicit ranks, exact-multiple files, writable blocks ----------------------------
def _ids(samples: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(s["__url__"], int(s["block"])) for s in samples]


@pytest.mark.parametrize("threads", [1, 2])
def test_unshuffled_blocks_come_file_by_file_in_the_order_given(
    tmp_path: Path, threads: int
) -> None:
    """``shuffle=False``: every order of the files gives their blocks file by file, in
    that order, each file's blocks first to last, the same every epoch."""
    import itertools

    paths = write_files(tmp_path)
    for order in itertools.permutations(range(len(paths))):
        listed = [paths[i] for i in order]
        pipe = sb.token_files(listed, seq_len=SEQ, overlap=1, shuffle=False, threads=threads)
        want = [(paths[i], b) for i in order for b in range(blocks_of(SIZES[i], 1))]
        for epoch in (0, 1):
            pipe.set_epoch(epoch)
            samples = list(pipe)
            assert _ids(samples) == want, (order, epoch)
            check_blocks(samples, {p: p for p in paths}, "uint16", 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_explicit_rank_and_world_size_split_the_blocks_without_torch_distributed(
    tmp_path: Path, workers: int
) -> None:
    """``rank=``/``world_size=`` given, no process group: through a Loader (in process and
    with workers) each rank reads its own blocks, none shared, all of them together
    exactly once, for one to three ranks."""
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized())
    paths = write_files(tmp_path)
    files = {p: p for p in paths}
    for world in (1, 2, 3):
        shares = []
        for rank in range(world):
            pipe = sb.token_files(
                paths, seq_len=SEQ, overlap=1, seed=5, rank=rank, world_size=world, threads=1
            ).batch(2)
            loader = sb.Loader(
                pipe, num_workers=workers, max_batches=4, max_bytes="2MiB", timeout_s=60
            )
            with loader:
                samples = [
                    {"__url__": u, "block": int(b), "tokens": t}
                    for batch in loader
                    for u, b, t in zip(batch["__url__"], batch["block"], batch["tokens"])
                ]
            shares.append(samples)
        ids = [set(_ids(s)) for s in shares]
        assert all(len(i) == len(s) > 0 for i, s in zip(ids, shares)), world  # no repeats
        for a in range(world):
            for b in range(a + 1, world):
                assert not ids[a] & ids[b], (world, a, b)
        check_blocks([x for s in shares for x in s], files, "uint16", 1)  # all, once


@pytest.mark.parametrize("seq_len", [4, 16])
def test_files_of_whole_blocks_end_at_their_last_token(tmp_path: Path, seq_len: int) -> None:
    """Files of exactly k * seq_len tokens: blocks of seq_len + overlap tokens at a stride
    of seq_len, as many as fit (the last one ends at or before the file's end, never
    past it), each equal to the memmap slice; for overlap 0 to 2 and k from 1 to 4."""
    paths = []
    for k in (1, 2, 3, 4):
        path = tmp_path / f"whole-{k}.bin"
        (np.arange(k * seq_len) + 1000 * k).astype(np.uint16).tofile(path)
        paths.append(str(path))
    for overlap in (0, 1, 2):
        got = sorted(
            (
                (s["__url__"], int(s["block"]), s["tokens"].tolist())
                for s in sb.token_files(paths, seq_len=seq_len, overlap=overlap, seed=2)
            ),
            key=lambda x: (x[0], x[1]),
        )
        want = []
        for p in paths:
            mm = np.memmap(p, dtype=np.uint16, mode="r")
            starts = range(0, len(mm) - (seq_len + overlap) + 1, seq_len)
            want += [
                (p, b, mm[s : s + seq_len + overlap].astype(np.int64).tolist())
                for b, s in enumerate(starts)
            ]
            last = [x for x in got if x[0] == p]
            assert len(last) == len(starts), (p, overlap)
            if starts:  # the last block: the file's last full block, no token past it
                assert last[-1][2] == mm[starts[-1] : starts[-1] + seq_len + overlap].tolist()
        assert got == want, overlap


@pytest.mark.parametrize("keep_dtype", [True, False], ids=["keep_dtype", "int64"])
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "int64"])
def test_blocks_are_writable_copies(tmp_path: Path, dtype: str, keep_dtype: bool) -> None:
    """A block's tensor is its own writable memory: written through torch or numpy, it
    changes neither the file nor any other block (with ``overlap=1`` neighbours hold
    one token alike); no array is handed to torch read-only."""
    import warnings

    import torch

    paths = write_files(tmp_path, dtype)
    stored = [Path(p).read_bytes() for p in paths]
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # (torch names a read-only array once a process, else)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pipe = sb.token_files(
                paths, seq_len=SEQ, dtype=dtype, overlap=1, keep_dtype=keep_dtype, seed=4
            )
            samples = list(pipe)
    finally:
        torch.set_warn_always(warn_always)
    assert not [str(w.message) for w in seen if "not writable" in str(w.message)]
    check_blocks(samples, {p: p for p in paths}, dtype, 1)
    for i, s in enumerate(samples):
        tokens = s["tokens"]
        assert tokens.dtype == (getattr(torch, dtype) if keep_dtype else torch.int64)
        array = tokens.numpy()
        assert array.flags.writeable
        array[0] = 7  # through numpy, on the tensor's memory
        assert int(tokens[0]) == 7
        tokens.fill_(i + 1)  # through torch
    for i, s in enumerate(samples):  # no block shares memory with another
        assert set(s["tokens"].tolist()) == {i + 1}, (s["__url__"], s["block"])
    assert [Path(p).read_bytes() for p in paths] == stored
