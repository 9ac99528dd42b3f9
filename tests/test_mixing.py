"""``sb.mix``: weighted blends of pipelines, deterministic, exactly once per source per
epoch (or restarting, counted), resumable exactly; a source's error keeps its type."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

import streambuf as sb
from tests.pipeline_data import all_samples, fail_on_13
from tests.resume_data import mixed_loader, mixed_pipe
from tests.resume_harness import check_save_load, ids_of

pytestmark = pytest.mark.timeout(300)


def source_of(x: int) -> int:
    return x // 10_000


def expected(sizes=(8, 4)):
    return sorted(
        [10_000 + x for x in all_samples(sizes[0])] + [20_000 + x for x in all_samples(sizes[1])]
    )


def test_all_exhausted_is_exactly_once_per_source():
    got = [x for b in mixed_loader() for x in ids_of(b)]
    assert sorted(got) == expected()


def test_shares_follow_the_weights_and_runs_repeat():
    """stop='never' over 2 workers: after 2,000 samples each source's share is within 3
    points of its weight; two runs are identical; restarts are counted."""

    def run():
        loader = mixed_loader(stop="never", weights=(0.75, 0.25), shuffle=0)
        out = [x for b in itertools.islice(loader, 500) for x in ids_of(b)]
        loader.close()
        return out

    first, second = run(), run()
    assert first == second
    shares = Counter(source_of(x) for x in first)
    assert len(first) == 2000
    assert abs(shares[1] / 2000 - 0.75) <= 0.03 and abs(shares[2] / 2000 - 0.25) <= 0.03


def test_never_restarts_and_counts_them():
    pipe = mixed_pipe(stop="never", weights=(0.5, 0.5), sizes=(2, 2))
    got = list(itertools.islice(iter(pipe), 200))
    stats = sb.mix_stats(pipe)
    assert sum(stats.taken) in (200, 201)  # the last output looks one sample ahead
    assert all(r >= 1 for r in stats.restarts)
    assert len(got) == 200
    everything = pipe.batch(2).stats()  # the one way: mix_stats(pipe) is its .mix
    assert everything.mix == stats and len(everything.sources) == 2
    assert everything.as_dict(flat=True)["mix/taken/0"] == stats.taken[0]


def test_stats_of_a_mix_of_shards_has_each_source(tmp_path):
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "a", 2, 3)
    make_shards(tmp_path / "b", 1, 4)
    a = sb.shards(str(tmp_path / "a" / "*.tar"), lanes=1)
    b = sb.shards(str(tmp_path / "b" / "*.tar"), lanes=1)
    pipe = sb.mix([a, b], weights=[1, 1])
    loader = sb.Loader(pipe.batch(2, collate=list), num_workers=2, max_batches=2, max_bytes="1MiB")
    assert sum(len(x) for x in loader) == 10
    stats = pipe.stats()
    assert stats.mix.taken == (6, 4) and stats.shards is None
    assert [s.shards.samples for s in stats.sources] == [6, 4]  # counted in the workers
    assert stats.sources[0].shards == sb.sources.shard_stats(a)


def test_first_exhausted_stops_with_the_first_source():
    got = list(mixed_pipe(stop="first_exhausted", weights=(0.5, 0.5)))
    per = Counter(source_of(x) for x in got)
    assert per[2] == len(all_samples(4)) or per[1] == len(all_samples(8))
    assert len(got) < len(expected())


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_is_exact(workers):
    check_save_load(mixed_loader, {"workers": workers}, [1, 3, 6, "last"])


def test_resume_is_exact_when_never_stopping():
    kw = {"workers": 2, "stop": "never"}
    from tests.resume_harness import resume_and_finish, save_after

    ref_loader = mixed_loader(**kw)
    ref = [ids_of(b) for b in itertools.islice(ref_loader, 40)]
    ref_loader.close()
    first, state = save_after(mixed_loader, kw, 15)
    loader = mixed_loader(**kw)
    loader.load_state_dict(state)
    rest = [ids_of(b) for b in itertools.islice(loader, 25)]
    loader.close()
    assert first + rest == ref
    del resume_and_finish


def test_a_source_error_keeps_its_type_and_names_the_source():
    bad = sb.Pipeline(list(range(40))).map(fail_on_13)
    good = sb.Pipeline(list(range(40)))
    pipe = sb.mix([good, bad], weights=[1, 1]).batch(4)
    loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=60)
    with pytest.raises(ValueError, match="cannot decode sample 13") as info:
        list(loader)
    assert any("mixed source 1" in n for n in info.value.__notes__)


def test_bad_arguments():
    p = sb.Pipeline([1, 2])
    with pytest.raises(ValueError, match="weights"):
        sb.mix([p, p], weights=[1])
    with pytest.raises(ValueError, match="positive"):
        sb.mix([p, p], weights=[1, 0])
    with pytest.raises(ValueError, match="stop"):
        sb.mix([p], weights=[1], stop="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batched"):
        sb.mix([p.batch(2)], weights=[1])
    with pytest.raises(TypeError, match="Pipeline"):
        sb.mix([[1, 2]], weights=[1])  # type: ignore[list-item]


def test_a_state_of_other_mixed_sources_does_not_load():
    # the mix's Source adds its sources' whole fingerprints (shards, stages) to the state's
    saved = mixed_pipe(sizes=(8, 4)).batch(4)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    mixed_pipe(sizes=(8, 4)).batch(4).load_state_dict(state)  # the same sources: accepted
    with pytest.raises(ValueError, match="mixed sources differ"):
        mixed_pipe(stop="never").batch(4).load_state_dict(state)
    # a source's list changed: the message names the source and why (a reordered or
    # extended list, which a pipeline alone resumes, is not remapped inside a mix)
    for sizes, changed in (((8, 5), r"\[1\]"), ((9, 5), r"\[0, 1\]")):
        with pytest.raises(ValueError, match=rf"source\(s\) {changed} differed.*not remapped"):
            mixed_pipe(sizes=sizes).batch(4).load_state_dict(state)


def test_a_changed_mixed_source_is_read_at_its_place():
    """Each source's fingerprint is read where the saved mix lists it, not searched for
    anywhere: 8 unnamed shards are a substring of 18, and swapped sources are each found
    somewhere (both fell back to the general message, which names no source)."""
    saved = mixed_pipe(sizes=(18, 4)).batch(4)
    next(iter(saved))
    state = saved.state_dict()
    with pytest.raises(ValueError, match=r"source\(s\) \[0\] differed"):
        mixed_pipe(sizes=(8, 4)).batch(4).load_state_dict(state)
    a, b = sb.Pipeline(list(range(12))), sb.Pipeline(list(range(5)))
    ab = sb.mix([a, b], weights=[1, 1], seed=3).batch(4)
    next(iter(ab))
    state = ab.state_dict()
    sb.mix([a, b], weights=[1, 1], seed=3).batch(4).load_state_dict(state)  # as saved
    with pytest.raises(ValueError, match=r"source\(s\) \[0, 1\] differed"):
        sb.mix([b, a], weights=[1, 1], seed=3).batch(4).load_state_dict(state)
    c = sb.Pipeline(list(range(7)))
    with pytest.raises(ValueError, match=r"source\(s\) \[1\] differed"):
        sb.mix([a, c], weights=[1, 1], seed=3).batch(4).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_with_a_one_shot_source_refuses_to_save_and_names_it(workers):
    """A one-shot iterable has no state; in a mix it made ``state_dict()`` succeed and
    the resume fail at its first batch ("cannot fetch samples back", no source named).
    The mix refuses at the save, as the plain pipeline does, naming the source."""

    def make():
        gen = sb.Pipeline(i for i in range(100, 110))
        return sb.mix([sb.Pipeline(list(range(40))), gen], weights=[0.5, 0.5], seed=1).batch(4)

    with pytest.raises(ValueError, match="one-shot iterable has no state") as plain:
        sb.Loader(
            sb.Pipeline(i for i in range(3)), num_workers=0, max_batches=2, max_bytes="1MiB"
        ).state_dict()
    with sb.Loader(make(), num_workers=workers, max_batches=4, max_bytes="64MiB") as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(ValueError, match=r"mixed source 1 \(") as mixed:
            loader.state_dict()
        it.close()
    assert str(plain.value) in str(mixed.value)
