"""What ``load_state_dict`` refuses, and how it says so: a hand-edited or damaged state
(every field corrupted in turn: one ``ValueError`` naming the field, in the main process,
at load time), another rank's state, and ``set_epoch`` to an epoch the loaded state does
not resume (while the usual ``set_epoch`` loop keeps working)."""

from __future__ import annotations

import pytest

from tests.resume_data import mixed_loader, plain_loader
from tests.resume_harness import epoch_batches, ids_of, roundtrip, save_after
from tests.state_faults import corruptions, field_faults

pytestmark = pytest.mark.timeout(300)


def _elastic_state():
    """A state with every part filled: two workers, pending samples, a shuffle, and the
    progress (``before``) of an earlier elastic resume."""
    _, state = save_after(plain_loader, {"workers": 2}, 3)
    loader = plain_loader(workers=3)
    loader.load_state_dict(state)
    it = iter(loader)
    for _ in range(2):
        next(it)
    out = roundtrip(loader.state_dict())
    it.close()
    loader.close()
    assert out["before"] is not None and any(w["pending"] for w in out["workers"] if w)
    return out


STATES = {
    "plain": lambda: (save_after(plain_loader, {"workers": 2}, 4)[1], plain_loader),
    "elastic": lambda: (_elastic_state(), lambda: plain_loader(workers=3)),
    "mix": lambda: (
        save_after(mixed_loader, {"workers": 0}, 3)[1],
        lambda: mixed_loader(workers=0),
    ),
}


@pytest.mark.parametrize("kind", list(STATES))
def test_every_corrupted_field_is_one_value_error_at_load(kind):
    """Every field of a real state corrupted in turn (``corruptions``), and bad values of
    every kind of field, also of those the state leaves empty (``field_faults``): each
    is one ``ValueError`` at load that names the field."""
    state, factory = STATES[kind]()
    factory().load_state_dict(state)  # the state itself loads
    loader = factory()
    tried = 0
    for label, names, bad in [*corruptions(state), *field_faults(state)]:
        tried += 1
        try:
            loader.load_state_dict(bad)
        except ValueError as exc:
            assert names in str(exc), f"{label}: the message does not name {names}: {exc}"
            continue
        except Exception as exc:  # KeyError, IndexError, TypeError: the defect
            raise AssertionError(f"{label}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError(f"{label}: accepted")
    assert tried > 200


def test_messages_name_the_field_path():
    _, state = save_after(plain_loader, {"workers": 2}, 4)
    loader = plain_loader(workers=2)
    for path, value, says in [
        (("epoch",), -5, "state['epoch']: expected an int >= 0, got -5"),
        (("next_worker",), 7, "state['next_worker']: expected an int in [0, 2), got 7"),
        (
            ("workers", 1, "source", "lanes", 0, 0),
            99,
            "state['workers'][1]['source']['lanes'][0][0]",
        ),
        (("workers", 0, "pending", 0, 0), "4", "state['workers'][0]['pending'][0][0]"),
    ]:
        bad = roundtrip(state)
        node = bad
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        with pytest.raises(ValueError) as err:
            loader.load_state_dict(bad)
        assert says in str(err.value)
    bad = roundtrip(state)
    del bad["workers"][1]["stages"]
    with pytest.raises(ValueError, match=r"state\['workers'\]\[1\]: the key 'stages' is missing"):
        loader.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"states\[1\]\['layout'\]"):
        two = [roundtrip(state), roundtrip(state)]
        del two[1]["layout"]["rank"]
        loader.load_state_dict(two)


def test_another_ranks_state_says_whose_it_is_and_what_to_pass():
    _, state = save_after(plain_loader, {"workers": 2, "rank": 0, "world": 2}, 2)
    with pytest.raises(ValueError) as err:
        plain_loader(workers=2, rank=1, world=2).load_state_dict(state)
    msg = str(err.value)
    assert "saved by rank 0 of a run with world_size=2" in msg
    assert "loaded by rank 1 of world_size=2" in msg
    assert "pass this rank's own state (the one rank 1 saved)" in msg
    assert "the list of the states of all its ranks" in msg


@pytest.mark.parametrize("workers", [0, 2])
def test_the_usual_set_epoch_loop_keeps_the_resume(workers):
    kw = {"workers": workers}
    ref = plain_loader(**kw)
    refs = [epoch_batches(ref, e) for e in range(3)]
    first, state = save_after(plain_loader, kw, 5)  # mid epoch 0
    loader = plain_loader(**kw)
    loader.load_state_dict(state)
    assert loader.epoch == 0
    got = []
    for epoch in range(0, 2):
        loader.set_epoch(epoch)
        got.append([ids_of(b) for b in loader])
    assert first + got[0] == refs[0] and got[1] == refs[1]
    _, end = save_after(plain_loader, kw, "end")  # epoch 0 complete: resume at epoch 1
    loader = plain_loader(**kw)
    loader.set_epoch(7)  # before load_state_dict: the state decides
    loader.load_state_dict(end)
    assert loader.epoch == 1
    for epoch in range(1, 3):
        loader.set_epoch(epoch)
        assert [ids_of(b) for b in loader] == refs[epoch]


def test_set_epoch_to_another_epoch_after_a_load_is_refused():
    _, state = save_after(plain_loader, {"workers": 0}, 5)
    loader = plain_loader(workers=0)
    loader.load_state_dict(state)
    with pytest.raises(
        ValueError, match=r"set_epoch\(1\) after load_state_dict\(\).*middle of epoch 0"
    ):
        loader.set_epoch(1)
    assert loader.epoch == 0  # the resume is still planned
    _, end = save_after(plain_loader, {"workers": 0}, "end")
    loader.load_state_dict(end)
    with pytest.raises(ValueError, match=r"end of epoch 0 \(complete\).*set_epoch\(1\)"):
        loader.set_epoch(0)
