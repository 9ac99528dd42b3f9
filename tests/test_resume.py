"""Checkpoint and resume of plain pipelines (threaded map, shuffle, batch): exact with the
same layout, through real workers (fork and spawn, persistent or not) and equalize modes;
elastic across num_workers and world size; twice in one epoch; at the end of an epoch."""

from __future__ import annotations

import pytest

from tests.pipeline_data import all_samples
from tests.resume_data import N_SHARDS, plain_loader
from tests.resume_harness import (
    check_save_load,
    counted_once,
    ids_of,
    resume_and_finish,
    roundtrip,
    save_after,
)

pytestmark = pytest.mark.timeout(300)

# 8 shards of 3..7 samples (41 samples), batches of 3: 14 batches, shards end mid-batch.
STOPS = [1, 5, 7, 13, "last", "end"]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("equalize", [None, "pad", "drop"])
def test_exact_resume(workers, equalize):
    check_save_load(plain_loader, {"workers": workers, "equalize": equalize}, STOPS)


def test_exact_resume_persistent_workers():
    check_save_load(plain_loader, {"workers": 2, "persistent": True}, [1, 7, "last"])


@pytest.mark.parametrize("stop", [3, pytest.param("end", marks=pytest.mark.long)])
def test_exact_resume_spawn_in_a_fresh_process(stop):
    # CI runs the mid-epoch stop; the end-of-epoch state in a fresh process is in
    # make test-long (test_exact_resume covers "end" with fork workers)
    check_save_load(plain_loader, {"workers": 2, "mp_context": "spawn"}, [stop], fresh_process=True)


def test_exact_resume_simulated_ranks_with_equalize():
    for rank in range(2):
        check_save_load(
            plain_loader, {"workers": 2, "equalize": "pad", "rank": rank, "world": 2}, [2, 5]
        )


def test_resume_twice_in_one_epoch():
    kw = {"workers": 2}
    ref = [ids_of(b) for b in plain_loader(**kw)]
    first, state = save_after(plain_loader, kw, 3)
    loader = plain_loader(**kw)
    loader.load_state_dict(state)
    it = iter(loader)
    second = [ids_of(next(it)) for _ in range(4)]
    state2 = roundtrip(loader.state_dict())
    it.close()
    rest, after = resume_and_finish(plain_loader, kw, state2, next_epoch=1)
    assert first + second + rest == ref
    ref1 = plain_loader(**kw)
    ref1.set_epoch(1)
    assert after == [ids_of(b) for b in ref1]


def test_state_is_small_and_plain_data():
    _, state = save_after(plain_loader, {"workers": 2}, 4)
    assert len(str(state)) < 4000 and state["layout"]["num_workers"] == 2
    assert state["epoch"] == 0 and state["complete"] is False


def test_in_order_false_resumes_exactly_once():
    kw = {"workers": 2, "in_order": False}
    first, state = save_after(plain_loader, kw, 5)
    rest, _ = resume_and_finish(plain_loader, kw, state)
    counted_once([x for b in first + rest for x in b], all_samples(N_SHARDS))


@pytest.mark.parametrize(
    ("old", "new"),
    [((1, 2), (1, 3)), ((2, 2), (3, 2)), ((3, 2), (2, 2)), ((2, 0), (3, 1)), ((1, 3), (1, 0))],
    ids=lambda p: f"world{p[0]}x{p[1]}w",
)
@pytest.mark.parametrize("stop", [1, 3])
def test_elastic_resume_exactly_once(old, new, stop):
    """(world, workers) -> (world, workers): gather every old rank's state, resume each
    new rank from the list; every sample of the epoch exactly once, counted."""
    (w0, k0), (w1, k1) = old, new
    delivered, states = [], []
    for rank in range(w0):
        kw = {"workers": k0, "rank": rank, "world": w0} if w0 > 1 else {"workers": k0}
        first, state = save_after(plain_loader, kw, stop)
        delivered += [x for b in first for x in b]
        states.append(state)
    for rank in range(w1):
        kw = {"workers": k1, "rank": rank, "world": w1} if w1 > 1 else {"workers": k1}
        rest, _ = resume_and_finish(plain_loader, kw, states if w0 > 1 else states[0])
        delivered += [x for b in rest for x in b]
    counted_once(delivered, all_samples(N_SHARDS))


def test_elastic_twice():
    """2 workers -> 3 workers -> 1 worker within one epoch: still exactly once."""
    delivered = []
    first, state = save_after(plain_loader, {"workers": 2}, 3)
    delivered += [x for b in first for x in b]
    loader = plain_loader(workers=3)
    loader.load_state_dict(state)
    it = iter(loader)
    delivered += [x for _ in range(3) for x in ids_of(next(it))]
    state2 = roundtrip(loader.state_dict())
    it.close()
    rest, _ = resume_and_finish(plain_loader, {"workers": 0}, state2)
    delivered += [x for b in rest for x in b]
    counted_once(delivered, all_samples(N_SHARDS))


def test_load_errors_name_the_problem():
    _, state = save_after(plain_loader, {"workers": 2, "rank": 0, "world": 2}, 2)
    with pytest.raises(ValueError, match="all its ranks"):
        plain_loader(workers=2, rank=0, world=3).load_state_dict(state)
    with pytest.raises(ValueError, match="different pipeline"):
        plain_loader(workers=2, n=5).load_state_dict(state)
    with pytest.raises(ValueError, match="state_dict"):
        plain_loader(workers=2).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="ranks"):
        plain_loader(workers=2).load_state_dict([state])  # one of two ranks only


def test_all_ranks_states_at_the_same_layout_resume_exactly():
    """Passing the list of every rank's state (the simplest DDP code: always gather) at
    an unchanged layout resumes each rank exactly (not elastically)."""
    world, kw = 2, {"workers": 2}
    firsts, states, refs = [], [], []
    for rank in range(world):
        r_kw = {**kw, "rank": rank, "world": world}
        refs.append([ids_of(b) for b in plain_loader(**r_kw)])
        first, state = save_after(plain_loader, r_kw, 3)
        firsts.append(first)
        states.append(state)
    for rank in range(world):
        rest, _ = resume_and_finish(plain_loader, {**kw, "rank": rank, "world": world}, states)
        assert firsts[rank] + rest == refs[rank]
