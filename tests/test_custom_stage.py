"""The public stage contract (``streambuf.Stage``, ``Pipeline.compose``) and the public
harness (``streambuf.testing.check_resume``): examples/custom_stage.py resumes exactly
with 0 and 2 workers, written against the public API only; stages that drop, hold and
own state resume exactly, also beside a shuffle; the contract's refusals are clear."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import streambuf as sb
from streambuf._state import with_digest
from streambuf.testing import check_resume, roundtrip

pytestmark = pytest.mark.timeout(240)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_stage.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("custom_stage_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ex = _example()


def test_the_example_resumes_exactly_with_0_and_2_workers(capsys):
    refs = ex.main()  # check_resume(example_pipeline, num_workers=(0, 2)) inside
    assert "check_resume: exact" in capsys.readouterr().out
    for workers, (epoch0, epoch1, _) in refs.items():
        outs = [o for batch in epoch0 for o in batch]
        assert sorted(x for o in outs for x in o["window"]) == list(range(40)), workers
        assert epoch0 != epoch1  # shuffle_shards: another order each epoch
        # per worker, counts run 0, 1, 2, ... (0 workers: one stream)
        counts = Counter(o["count"] for o in outs)
        assert set(counts.values()) <= {1, 2} and counts[0] == max(1, workers)


def test_the_example_uses_only_the_public_api():
    tree = ast.parse(EXAMPLE.read_text())
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            used += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            used += [a.name for a in node.names]
    private = [u for u in used if u.startswith("streambuf") and "._" in u]
    assert private == [], private
    assert "streambuf.testing" in used


# -- more shapes of stage ------------------------------------------------------------
class KeepEven(sb.Stage):
    """n -> 1 with drops: pulls until an even sample (a trailing odd one is dropped)."""

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        for x in samples:
            if x % 2 == 0:
                yield x


class SumSoFar(sb.Stage):
    """Owns state: the running sum of what it passed, in each output."""

    owns_state = True

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        for x in samples:
            total = (state.value or 0) + x
            state.value = total
            yield {"x": x, "total": total}


class Pairs(sb.Stage):
    """Samples two by two; an odd one left at the end is dropped (``keep_odd``: yielded
    as a group of one)."""

    holds_samples = True
    keep_odd = False

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        held: list[Any] = []
        for x in samples:
            held.append(x)
            if len(held) == 2:
                yield held
                held = []
        if held and self.keep_odd:
            yield held


class Seeded(sb.Stage):
    """Draws from a generator seeded by ``state.seed``, its draw count in the state."""

    owns_state = True

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        import random

        for x in samples:
            draws = state.value or 0
            rng = random.Random(state.seed * 1_000_003 + draws)
            state.value = draws + 1
            yield [x, rng.randrange(1000)]


class FanOut(sb.Stage):
    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        for x in samples:
            yield x
            yield x


class Boom(sb.Stage):
    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        for x in samples:
            if x == 5:
                raise KeyError("no five")
            yield x


def drops_and_sums() -> sb.Pipeline:
    return sb.Pipeline(list(range(30))).compose(KeepEven()).compose(SumSoFar()).batch(3)


def pairs_then_shuffle() -> sb.Pipeline:
    return sb.Pipeline(list(range(33)), seed=3).compose(Pairs()).shuffle(4).batch(2)


def seeded_after_threads() -> sb.Pipeline:
    return (
        sb.Pipeline(list(range(24)), shuffle_shards=True, seed=5)
        .map(abs, threads=3)
        .compose(Seeded())
        .batch(4)
    )


def pairs_flattened() -> sb.Pipeline:
    """A group of two samples yielded as a list, then flattened (the contract's way to
    make several outputs of one group)."""
    return sb.Pipeline(list(range(33)), seed=3).compose(Pairs()).flatten().batch(3)


def pairs_flattened_then_shuffled() -> sb.Pipeline:
    return sb.Pipeline(list(range(33)), seed=3).compose(Pairs()).flatten().shuffle(5).batch(3)


@pytest.mark.parametrize(
    "make",
    [
        drops_and_sums,
        pairs_then_shuffle,
        seeded_after_threads,
        pairs_flattened,
        pairs_flattened_then_shuffled,
    ],
    ids=lambda f: f.__name__,
)
def test_stages_that_drop_hold_and_own_state_resume_exactly(make):
    refs = check_resume(make, num_workers=(0, 2), stops=(1, 2, "last", "end"))
    assert refs[0][0] and refs[2][0]


def test_a_flattened_group_settles_all_its_samples():
    """Each sample of a group is settled when the group's last child is delivered: the
    pending set stays the few samples in flight (the group's second sample stayed open for
    good: a resume replayed it, and the state grew with the epoch)."""
    pipe = sb.Pipeline(list(range(4000))).compose(Pairs()).flatten().batch(4)
    loader = sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="1MiB")
    it = iter(loader)
    for _ in range(400):  # 1,600 of 4,000 samples
        next(it)
    pending = loader.state_dict()["workers"][0]["pending"]
    it.close()
    assert len(pending) <= 16, len(pending)


def test_dropped_samples_are_settled_and_the_state_is_complete():
    loader = sb.Loader(drops_and_sums(), num_workers=0, max_batches=2, max_bytes="1MiB")
    xs = [int(v) for b in loader for v in b["x"]]
    totals = [int(v) for b in loader for v in b["total"]]
    assert xs == list(range(0, 30, 2))
    assert totals[-1] == sum(range(0, 30, 2))
    state = loader.state_dict()
    assert state["complete"] is True and state["workers"][0]["pending"] == []


def test_a_state_of_another_stage_configuration_does_not_load():
    a = sb.Loader(ex.make_pipeline(list(range(12))), num_workers=0, max_batches=2, max_bytes="1MiB")
    it = iter(a)
    next(it)
    state = roundtrip(a.state_dict())
    it.close()
    other = (
        sb.Pipeline(list(range(12)), shuffle_shards=True, seed=7)
        .compose(ex.Window(4))
        .compose(ex.RunningCount())
        .batch(2, collate=list)
    )
    b = sb.Loader(other, num_workers=0, max_batches=2, max_bytes="1MiB")
    with pytest.raises(ValueError, match=r"different pipeline.*Window\{\\?\"n\\?\": 4\}"):
        b.load_state_dict(state)


def test_an_elastic_resume_delivers_every_sample_once_and_restarts_stage_state():
    kw = {"max_batches": 4, "max_bytes": "1MiB"}
    two = sb.Loader(drops_and_sums(), num_workers=2, **kw)
    it = iter(two)
    first = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(two.state_dict()))
    it.close()
    one = sb.Loader(drops_and_sums(), num_workers=1, **kw)
    one.load_state_dict(state)
    rest = list(one)
    seen = [int(v) for b in first + rest for v in b["x"]]
    assert sorted(seen) == list(range(0, 30, 2))


class PairsKeepOdd(Pairs):
    """Pairs, and a last odd sample as a group of one (nothing dropped)."""

    keep_odd = True


def pairs_kept_flattened() -> sb.Pipeline:
    return sb.Pipeline(list(range(40)), seed=3).compose(PairsKeepOdd()).flatten().batch(3)


def _ints(batches: list[Any]) -> list[int]:
    return [int(v) for b in batches for v in b]


def _save_after(loader: sb.Loader, n: int) -> tuple[list[Any], dict[str, Any]]:
    it = iter(loader)
    got = [next(it) for _ in range(n)]
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    return got, state


@pytest.mark.parametrize(("before", "after", "stop"), [(2, 1, 2), (1, 2, 3), (2, 4, 1)])
def test_an_elastic_resume_finishes_a_partly_delivered_group_once(before, after, stop):
    """A group (two samples made into one output, flattened) with one child delivered at
    the save: the child index skipped names that group's outputs only. Resumed at another
    layout, its samples were handed out by position order, so the fresh stage paired
    them with others: 2 -> 1 workers repeated a sample, 1 -> 2 lost... Now its samples go
    together, first, to one slot, and the stage pairs them as before."""
    kw = {"max_batches": 4, "max_bytes": "1MiB"}
    first, state = _save_after(sb.Loader(pairs_kept_flattened(), num_workers=before, **kw), stop)
    assert any(w.get("groups") for w in state["workers"] if w), "no group was partly delivered"
    again = sb.Loader(pairs_kept_flattened(), num_workers=after, **kw)
    again.load_state_dict(state)
    it = iter(again)
    mid = [next(it)]  # saved again at a third layout: the group's route is kept
    second = json.loads(json.dumps(again.state_dict()))
    it.close()
    third = sb.Loader(pairs_kept_flattened(), num_workers=before, **kw)
    third.load_state_dict(second)
    assert sorted(_ints(first + mid + list(third))) == list(range(40))


class SnapshotOnFirst(sb.Stage):
    """Passes samples on; calls ``SnapshotOnFirst.take()`` (a state) when the first one
    passes, if set (a class attribute: the stage's configuration stays empty)."""

    take: Any = None
    taken: list[Any] = []

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        first = True
        for x in samples:
            if first and SnapshotOnFirst.take is not None:
                SnapshotOnFirst.taken.append(json.loads(json.dumps(SnapshotOnFirst.take())))
            first = False
            yield x


def peeked_pairs() -> sb.Pipeline:
    pipe = sb.Pipeline(list(range(40)), seed=3)
    return pipe.compose(SnapshotOnFirst()).compose(PairsKeepOdd()).flatten().batch(3)


def test_a_state_taken_before_a_resumed_group_is_made_again_still_names_it(monkeypatch):
    """Between the resume and the group reaching flatten (here: taken inside a stage
    before the grouping one, as the first sample passes), a state must still name the
    partly delivered group: else a resume of it at another layout hands its samples out
    apart (one repeated). And a state taken between ``iter()`` and the first item is
    where the resume put it (it said "the epoch's start": the epoch was delivered
    twice)."""
    pipe = peeked_pairs()
    it = iter(pipe)
    next(it)  # a batch of 3: one of the pair (2, 3) delivered
    state = json.loads(json.dumps(pipe.state_dict()))
    it.close()
    assert state["workers"][0]["groups"] == [[[2, 0], [3, 0]]]
    again = peeked_pairs()
    again.load_state_dict(state)
    monkeypatch.setattr(SnapshotOnFirst, "take", again.state_dict)
    monkeypatch.setattr(SnapshotOnFirst, "taken", [])
    it = iter(again)
    untouched = json.loads(json.dumps(again.state_dict()))  # before the first item
    assert untouched["workers"] == state["workers"]
    next(it)
    it.close()
    (inside,) = SnapshotOnFirst.taken
    assert inside["workers"][0].get("groups") == [[[2, 0], [3, 0]]]
    assert inside["workers"][0]["pending"][:2] == [[2, 0, None, [0]], [3, 0, None]]


def test_an_elastic_resume_saved_before_its_first_item_owes_what_it_owed():
    """In-process after a 2-worker state: a state taken between ``iter()`` and the
    first item said "the epoch's start" of a slot that owes nothing, and its resume
    counted the owed samples as delivered (6 lost)."""
    kw = {"max_batches": 4, "max_bytes": "1MiB"}
    first, state = _save_after(sb.Loader(pairs_kept_flattened(), num_workers=2, **kw), 2)
    pipe = pairs_kept_flattened()
    pipe.load_state_dict(state)
    it = iter(pipe)
    untouched = json.loads(json.dumps(pipe.state_dict()))
    it.close()
    again = pairs_kept_flattened()
    again.load_state_dict(untouched)
    assert sorted(_ints(first + list(again))) == list(range(40))


def test_equal_batch_counts_after_an_elastic_resume_count_children_delivered():
    """equalize="drop" after an elastic resume with partly delivered groups: each child
    already delivered is one output less to make; counted as whole samples, the slot's
    target was 2 too high, its stream ran out and started again: 0 and 1 twice."""

    def make() -> sb.Pipeline:
        pipe = sb.Pipeline(list(range(12)), seed=3, equalize="drop")
        return pipe.compose(PairsKeepOdd()).flatten().batch(1)

    kw = {"max_batches": 4, "max_bytes": "1MiB"}
    first, state = _save_after(sb.Loader(make(), num_workers=2, **kw), 2)
    assert all(w["groups"] for w in state["workers"])  # each worker mid-pair
    again = sb.Loader(make(), num_workers=1, **kw)
    again.load_state_dict(state)
    assert sorted(_ints(first + list(again))) == list(range(12))


def test_a_group_made_of_other_samples_on_resume_is_refused():
    """Where the stage does not make a partly delivered output of the same samples again,
    its children cannot be skipped by index: an error naming both groups, not a silent
    repeat and loss."""
    kw = {"max_batches": 4, "max_bytes": "1MiB"}
    _, state = _save_after(sb.Loader(pairs_kept_flattened(), num_workers=0, **kw), 1)
    (group,) = state["workers"][0]["groups"]
    state["workers"][0]["groups"] = [[group[0], [group[1][0] + 1, 0]]]  # another pair
    state = with_digest(state)
    again = sb.Loader(pairs_kept_flattened(), num_workers=0, **kw)
    again.load_state_dict(state)
    with pytest.raises(ValueError, match=r"made an output of the samples .* cannot be told apart"):
        list(again)


def test_the_contract_refusals_are_clear():
    with pytest.raises(TypeError, match=r"compose\(\) takes an instance of a streambuf.Stage"):
        sb.Pipeline([1, 2]).compose(abs)
    with pytest.raises(ValueError, match=r"only map, filter and prefetch may follow"):
        sb.Pipeline([1, 2]).batch(2).compose(KeepEven())
    with pytest.raises(ValueError, match=r"mix\(\): source 1 has the stage 'KeepEven'"):
        sb.mix([sb.Pipeline([1]), sb.Pipeline([2]).compose(KeepEven())], weights=[1, 1])
    with pytest.raises(TypeError, match=r"stage 'FanOut' yielded an output without pulling"):
        list(sb.Pipeline([1, 2]).compose(FanOut()))


def test_an_error_in_a_stage_keeps_its_type_and_names_the_stage():
    with pytest.raises(KeyError) as info:
        list(sb.Pipeline(list(range(8))).compose(Boom()))
    assert any("stage 'Boom'" in n for n in getattr(info.value, "__notes__", []))


def test_a_mix_refuses_sources_it_could_not_make_again_by_position():
    inner = sb.mix([sb.Pipeline([1, 2]), sb.Pipeline([3, 4])], weights=[1, 1])
    with pytest.raises(ValueError, match=r"mix\(\): source 0 is itself a mix"):
        sb.mix([inner, sb.Pipeline([5])], weights=[1, 1])


@pytest.mark.parametrize(
    "after",
    [lambda p: p.shuffle(4), lambda p: p.map(dict, threads=2, ordered=False)],
    ids=["shuffle", "unordered map"],
)
def test_state_after_a_reordering_stage_is_refused_not_resumed_wrong(after):
    """A stage owning state, then one that reorders its outputs: a saved state would
    resume the stage without the outputs delivered after its first undelivered one (a
    running sum resumed wrong in 20 of 30 outputs), so the pipeline warns when built and
    state_dict() refuses, naming both stages and the fix; iterating it is fine."""

    def make() -> sb.Pipeline:
        return after(sb.Pipeline(list(range(30))).compose(SumSoFar())).batch(3, collate=list)

    with pytest.warns(UserWarning, match=r"stage 'SumSoFar' owns state and .* after it"):
        pipe = make()
    loader = sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="1MiB")
    it = iter(loader)
    next(it)
    mid = loader.state_dict()  # taken (a StatefulDataLoader takes one every batch)
    rest = [x["x"] for b in it for x in b]
    assert len(rest) == 27  # iterating is fine
    end = loader.state_dict()
    with pytest.warns(UserWarning):
        again = sb.Loader(make(), num_workers=0, max_batches=2, max_bytes="1MiB")
    with pytest.raises(ValueError, match=r"cannot resume it exactly.*move .* before 'SumSoFar'"):
        again.load_state_dict(mid)
    again.load_state_dict(end)  # an epoch's end: the stage starts afresh, exact
    assert sum(len(b) for b in again) == 30
    # the reordering stage before the stage owning state: saved and resumed exactly
    check_resume(
        lambda_free_sum_after_shuffle, num_workers=(0,), stops=(1, "last"), max_bytes="1MiB"
    )


def lambda_free_sum_after_shuffle() -> sb.Pipeline:
    return sb.Pipeline(list(range(30)), seed=4).shuffle(4).compose(SumSoFar()).batch(3)


_FINGERPRINT_PROBE = """
import streambuf as sb

def double(x):
    return 2 * x

class Keep(sb.Stage):
    def __init__(self):
        self.fn = double
        self.keys = {"jpg", "cls", "txt", "json", "npy"}
        self.obj = object.__new__(sb.Stage)

    def iterate(self, samples, state):
        yield from samples

print(Keep().fingerprint())
"""


def test_a_stage_fingerprint_is_the_same_in_every_process():
    """A stage's configuration holding a function, a set or an object: its fingerprint is
    the same in another process (a function's repr has its address, a set's order the
    string hash seed: a state saved in one process was refused in the next)."""
    import subprocess
    import sys

    got = set()
    for seed in ("1", "2", "3"):
        out = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT_PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        )
        got.add(out.stdout.strip())
    assert len(got) == 1, got
    (fp,) = got
    assert '"fn": "__main__.double"' in fp and " at 0x" not in fp


def _fails_on_5(x: int) -> int:
    if x == 5:
        raise ZeroDivisionError("map failed on 5")
    return x


def test_an_error_raised_upstream_of_a_stage_is_not_blamed_on_it():
    """An exception from a map (or the source) before a stage passes through the stage's
    pull: its notes name where it was raised, and not the stage it passed through."""
    with pytest.raises(ZeroDivisionError) as info:
        list(sb.Pipeline(list(range(8))).map(_fails_on_5).compose(Pairs()))
    notes = getattr(info.value, "__notes__", [])
    assert any("map(_fails_on_5)" in n for n in notes), notes
    assert not any("Pairs" in n for n in notes), notes


class BigBlock(sb.Stage):
    """Holds a block of fixed size in each worker, whatever the budget."""

    def fixed_bytes(self) -> int:
        return 40 << 20

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        yield from samples


def test_fixed_bytes_over_the_budget_are_refused_naming_the_stage():
    pipe = sb.Pipeline(list(range(8))).compose(BigBlock()).batch(2)
    with pytest.raises(
        ValueError, match=r"fixed stage buffers.*'BigBlock' 41943040.*fewer workers"
    ):
        sb.Loader(pipe, num_workers=2, max_batches=2, max_bytes="64MiB")
    packed = sb.Pipeline([{"tokens": [1, 2, 3]}] * 4).pack(1 << 20).batch(1)
    with pytest.raises(ValueError, match=r"'pack' 12582912.*shorter seq_len"):
        sb.Loader(packed, num_workers=2, max_batches=2, max_bytes="32MiB")


class SeenSet(sb.Stage):
    owns_state = True

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        for x in samples:
            state.value = (state.value or set()) | {x}
            yield x


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_value_json_cannot_hold_is_refused_naming_the_stage(workers):
    """Refused at the first batch's snapshot (a Loader takes one with every batch), not
    at a save hours later with a message naming no stage."""
    loader = sb.Loader(
        sb.Pipeline(list(range(6))).compose(SeenSet()).batch(2),
        num_workers=workers,
        max_batches=2,
        max_bytes="1MiB",
        timeout_s=60,
    )
    with pytest.raises(TypeError, match=r"stage 'SeenSet': state.value=\{.*plain JSON data"):
        list(loader)


def shuffled_pairs_flattened() -> sb.Pipeline:
    return sb.Pipeline(list(range(33)), seed=3).shuffle(4).compose(Pairs()).flatten().batch(3)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_group_after_a_shuffle_is_refused_when_the_state_is_loaded(workers: int) -> None:
    """A shuffle before a grouping stage: a state with a partly delivered group cannot be
    resumed (the stage would make other groups of its samples); refused at
    load_state_dict(), naming both stages, not at the first batch after it."""
    kw = {"max_batches": 4, "max_bytes": "1MiB"}
    loader = sb.Loader(shuffled_pairs_flattened(), num_workers=workers, **kw)
    _, state = _save_after(loader, 1)
    assert any(w.get("groups") for w in state["workers"]), state
    again = sb.Loader(shuffled_pairs_flattened(), num_workers=workers, **kw)
    with pytest.raises(ValueError, match=r"shuffle\(\) before stage 'Pairs'.*move shuffle"):
        again.load_state_dict(state)
    whole = sb.Loader(shuffled_pairs_flattened(), num_workers=workers, **kw)
    list(whole)
    again.load_state_dict(whole.state_dict())  # at the epoch's end: loads
