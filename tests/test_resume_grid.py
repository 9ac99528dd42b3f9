"""Resume as properties over a grid (``tests/resume_grid.py``): layouts (shard counts and
uneven sizes, lanes, ``round_robin``/``first_ready``, shuffle, filter, ``equalize="pad"``)
x world sizes x stop points x chains of resumes (exact, elastic, exact after elastic,
elastic twice, a save during the replay of the previous resume, more slots than shards).

CI runs a fixed, deterministic sample of the grid in this process (ranks simulated with
the pipeline's ``rank=``/``world_size=``, one slot each: the elastic split is the same
code for ranks and workers), plus a few cases through real DataLoader workers; the whole
grid runs with ``-m long`` (``make test-long``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.resume_grid import (
    BASE_CHAINS,
    SIZES,
    Layout,
    check_chain,
    ci_sample,
    expected,
    grid,
    make_pipe,
    write_shards,
)
from tests.resume_harness import counted_once, ids_of, roundtrip

CI_CASES = ci_sample(600)


def _id(case: tuple[Layout, tuple]) -> str:
    layout, chain = case
    return f"{layout.name}-" + "_".join(f"{w}w{s if s is not None else 'end'}" for w, s in chain)


@pytest.fixture(scope="module")
def shard_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grid")


def _paths(root: Path, layout: Layout) -> list[str]:
    return write_shards(root / "x".join(map(str, layout.sizes)), layout.sizes)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CI_CASES, ids=_id)
def test_resume_chain_delivers_the_uninterrupted_epoch(shard_root: Path, case) -> None:
    layout, chain = case
    check_chain(layout, _paths(shard_root, layout), chain)


@pytest.mark.long
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [c for c in grid() if c not in CI_CASES], ids=_id)
def test_resume_chain_full_grid(shard_root: Path, case) -> None:
    layout, chain = case
    check_chain(layout, _paths(shard_root, layout), chain)


def test_the_ci_sample_covers_every_class() -> None:
    """The classes the grid exists for are in the CI sample, whatever it draws."""
    assert len(CI_CASES) == len({_id(c) for c in CI_CASES})
    elastic = [c for c in CI_CASES if len({w for w, _ in c[1]}) > 1]
    assert any(lay.order == "first_ready" for lay, _ in elastic)
    assert any(lay.equalize == "pad" for lay, _ in elastic)
    assert any(  # first_ready, exact, 3+ shards per lane
        lay.order == "first_ready" and len(lay.sizes) >= 3 * lay.lanes
        for lay, ch in CI_CASES
        if len({w for w, _ in ch}) == 1
    )
    assert any(
        len(ch) > 2 and ch[0][0] != ch[1][0] == ch[2][0] for _, ch in elastic
    )  # exact after elastic
    assert any(ch == BASE_CHAINS[3] for _, ch in CI_CASES)  # saved during a replay
    assert any(max(w for w, _ in ch) > len(lay.sizes) for lay, ch in elastic)


# -- real DataLoader workers -----------------------------------------------------------
def grid_loader(*, layout: Layout, paths: list[str], workers: int):
    import streambuf as sb

    return sb.Loader(
        make_pipe(layout, paths, 0, 1),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="4MiB",
        timeout_s=60,
    )


def _loader_keys(batch) -> list[str]:
    return ids_of(batch)


def _take(loader, stop: int | None) -> tuple[list[str], dict]:
    it = iter(loader)
    got: list[str] = []
    for batch in it:
        got += _loader_keys(batch)
        if stop is not None and len(got) >= stop * 3:
            break
    state = roundtrip(loader.state_dict())
    it.close()
    return got, state


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("layout", "workers", "stops"),
    [
        # first_ready lanes, elastic 2 -> 3 -> 1 workers, then exact at 1 worker
        (Layout(SIZES[4], 2, "first_ready", 5), [2, 3, 0, 0], [2, 2, 1, None]),
        # exact twice with 3+ shards per lane, first_ready (in order: same output)
        (Layout(SIZES[4], 1, "first_ready", 0), [2, 2, 2], [1, 2, None]),
        # pad across an elastic resume 2 -> 3 workers
        (Layout(SIZES[0], 2, "round_robin", 5, False, "pad"), [2, 3], [2, None]),
    ],
    ids=["first-ready-elastic-then-exact", "first-ready-exact-twice", "pad-elastic"],
)
def test_resume_chain_through_dataloader_workers(
    shard_root: Path, layout: Layout, workers: list[int], stops: list[int | None]
) -> None:
    paths = _paths(shard_root, layout)
    delivered: list[str] = []
    state = None
    counts = []
    for w, stop in zip(workers, stops):
        loader = grid_loader(layout=layout, paths=paths, workers=w)
        if state is not None:
            loader.load_state_dict(state)
        got, state = _take(loader, stop)
        counts.append(len(got))
        loader.close()
        delivered += got
    if layout.equalize == "pad":
        assert sorted(set(delivered)) == expected(layout)
    else:
        counted_once(delivered, expected(layout))
