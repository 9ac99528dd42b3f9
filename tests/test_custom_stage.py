"""The public stage contract (``streambuf.Stage``, ``Pipeline.compose``) and the public
harness (``streambuf.testing.check_resume``): examples/custom_stage.py resumes exactly
with 0 and 2 workers, written against the public API only; stages that drop, hold and
own state resume exactly, also beside a shuffle; the contract's refusals are clear."""

from __future__ import annotations

import ast
import importlib.util
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import streambuf as sb
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
    holds_samples = True

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        held: list[Any] = []
        for x in samples:
            held.append(x)
            if len(held) == 2:
                yield held
                held = []
        # an odd one left: dropped


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


@pytest.mark.parametrize(
    "make", [drops_and_sums, pairs_then_shuffle, seeded_after_threads], ids=lambda f: f.__name__
)
def test_stages_that_drop_hold_and_own_state_resume_exactly(make):
    refs = check_resume(make, num_workers=(0, 2), stops=(1, 2, "last", "end"))
    assert refs[0][0] and refs[2][0]


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
