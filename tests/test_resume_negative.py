"""What a resume must refuse or re-plan, both sides: a state of another seed (the
pipeline's or a shuffle's own) is one clear ``ValueError`` at load time while the same
seed loads; ``lanes=``/``order=`` changed between save and load resumes elastically
(every sample once; with one rank's state of several, a ``ValueError`` at load time
saying to pass all ranks'); ``Pipeline.set_epoch`` after ``Pipeline.load_state_dict``
accepts only the epoch the state resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

import streambuf as sb
from tests.pipeline_data import shard_samples
from tests.resume_grid import Layout, expected, keys, roundtrip, write_shards
from tests.resume_harness import counted_once, ids_of

pytestmark = pytest.mark.timeout(120)


def _loader(pipe: sb.Pipeline, workers: int = 0) -> sb.Loader:
    return sb.Loader(
        pipe, num_workers=workers, max_batches=max(workers, 1) * 2, max_bytes="4MiB", timeout_s=60
    )


def _pipe(seed: int = 11, shuffle_seed: int | None = None) -> sb.Pipeline:
    return (
        sb.Pipeline(list(range(8)), expand=shard_samples, shuffle_shards=True, seed=seed)
        .shuffle(6, seed=shuffle_seed)
        .batch(3)
    )


def _saved(pipe: sb.Pipeline, k: int) -> tuple[list[list[int]], dict]:
    it = iter(pipe)
    head = [ids_of(next(it)) for _ in range(k)]
    state = roundtrip(pipe.state_dict())
    it.close()
    return head, state


def test_a_state_of_another_seed_is_refused_at_load() -> None:
    head, state = _saved(_pipe(seed=11), 3)
    with pytest.raises(ValueError, match=r"seed=11, this one has seed=12"):
        _pipe(seed=12).load_state_dict(state)
    with pytest.raises(ValueError, match=r"seed=11, this one has seed=12"):
        _pipe(seed=12).load_state_dict([state])  # the list form too
    loader = _loader(_pipe(seed=12))
    with pytest.raises(ValueError, match=r"seed=11, this one has seed=12"):
        loader.load_state_dict(state)
    same = _pipe(seed=11)
    same.load_state_dict(state)  # the other side: the same seed resumes, exactly
    ref = [ids_of(b) for b in _pipe(seed=11)]
    assert head + [ids_of(b) for b in same] == ref


def test_a_state_of_another_shuffle_seed_is_refused_at_load() -> None:
    _, state = _saved(_pipe(shuffle_seed=1), 3)
    with pytest.raises(ValueError, match=r"a shuffle's seed"):
        _pipe(shuffle_seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"a shuffle's seed"):
        _pipe(shuffle_seed=None).load_state_dict(state)
    _pipe(shuffle_seed=1).load_state_dict(state)


# -- set_epoch after Pipeline.load_state_dict -----------------------------------------
def test_pipeline_set_epoch_after_a_load_keeps_the_resume_or_refuses() -> None:
    ref0 = [ids_of(b) for b in _pipe()]
    ref1_pipe = _pipe()
    ref1_pipe.set_epoch(1)
    ref1 = [ids_of(b) for b in ref1_pipe]
    head, state = _saved(_pipe(), 4)
    pipe = _pipe()
    pipe.load_state_dict(state)
    with pytest.raises(ValueError, match=r"set_epoch\(1\) after load_state_dict\(\).*middle"):
        pipe.set_epoch(1)
    pipe.set_epoch(0)  # the usual loop: the epoch the state resumes
    assert head + [ids_of(b) for b in pipe] == ref0
    pipe.set_epoch(1)  # the resume was consumed: any epoch again
    assert [ids_of(b) for b in pipe] == ref1
    # a complete state resumes the next epoch: set_epoch(saved) is refused
    end_pipe = _pipe()
    list(end_pipe)
    end = roundtrip(end_pipe.state_dict())
    assert end["complete"]
    pipe = _pipe()
    pipe.load_state_dict(end)
    with pytest.raises(ValueError, match=r"end of epoch 0 \(complete\).*set_epoch\(1\)"):
        pipe.set_epoch(0)
    pipe.set_epoch(1)
    assert [ids_of(b) for b in pipe] == ref1


# -- lanes= / order= changed between save and load ------------------------------------
SIZES = (5, 7, 3, 6, 4, 8)


def _shards(tmp_path: Path) -> list[str]:
    return write_shards(tmp_path / "lanes", SIZES)


def _shard_pipe(paths, *, lanes, order="round_robin", rank=0, world=1) -> sb.Pipeline:
    return (
        sb.shards(list(paths), lanes=lanes, order=order, seed=3, rank=rank, world_size=world)
        .shuffle(4)
        .batch(3)
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ((2, "round_robin"), (3, "round_robin")),
        ((3, "round_robin"), (1, "round_robin")),
        ((2, "round_robin"), (2, "first_ready")),
        ((2, "first_ready"), (3, "round_robin")),
    ],
    ids=lambda p: f"{p[0]}{p[1][0]}",
)
@pytest.mark.parametrize("workers", [0, 2])
def test_changed_lanes_resume_elastically_exactly_once(tmp_path, old, new, workers) -> None:
    paths = _shards(tmp_path)
    loader = _loader(_shard_pipe(paths, lanes=old[0], order=old[1]), workers)
    it = iter(loader)
    head = [k for _ in range(3) for k in keys(next(it))]
    state = roundtrip(loader.state_dict())
    it.close()
    loader.close()
    resumed = _loader(_shard_pipe(paths, lanes=new[0], order=new[1]), workers)
    resumed.load_state_dict(state)
    rest = [k for b in resumed for k in keys(b)]
    resumed.close()
    counted_once(head + rest, expected(Layout(SIZES)))


def test_changed_lanes_with_one_rank_of_several_says_to_pass_all_at_load(tmp_path) -> None:
    paths = _shards(tmp_path)
    heads, states = [], []
    for rank in range(2):
        pipe = _shard_pipe(paths, lanes=2, rank=rank, world=2)
        it = iter(pipe)
        heads += [k for _ in range(2) for k in keys(next(it))]
        states.append(roundtrip(pipe.state_dict()))
        it.close()
    loader = _loader(_shard_pipe(paths, lanes=3, rank=0, world=2))
    with pytest.raises(ValueError, match=r"lanes changed.*lane cursors.*pass the list"):
        loader.load_state_dict(states[0])  # at load time, in this process
    rest = []
    for rank in range(2):
        pipe = _shard_pipe(paths, lanes=3, rank=rank, world=2)
        pipe.load_state_dict(states)
        rest += [k for b in pipe for k in keys(b)]
    counted_once(heads + rest, expected(Layout(SIZES)))


def test_unchanged_lanes_still_resume_exactly(tmp_path) -> None:
    paths = _shards(tmp_path)
    ref = [keys(b) for b in _shard_pipe(paths, lanes=2)]
    pipe = _shard_pipe(paths, lanes=2)
    it = iter(pipe)
    head = [keys(next(it)) for _ in range(4)]
    state = roundtrip(pipe.state_dict())
    it.close()
    again = _shard_pipe(paths, lanes=2)
    again.load_state_dict(state)
    assert head + [keys(b) for b in again] == ref
