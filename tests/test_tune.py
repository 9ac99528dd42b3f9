from __future__ import annotations

from typing import Any

import pytest

from streambuf.resources import Limits
from streambuf.tune import load_pipeline, tune

pytestmark = pytest.mark.timeout(300)

MIB = 1 << 20


def test_tune_never_recommends_above_memory_limit(capsys):
    pipe = load_pipeline("examples/latency_pipeline.py:make_pipeline")
    limits = Limits(cpus=2, memory_bytes=48 * MIB)
    res = tune(
        pipe,
        num_workers=1,
        batches=6,
        seconds=0,
        depths=(1, 4),
        threads=(4, 16),
        limits=limits,
        available_bytes=1 << 40,
    )
    assert res.memory_cap_bytes == 12 * MIB  # 25% of the limit it read
    assert res.max_bytes <= limits.memory_bytes * 0.25
    assert res.max_batches in (1, 4) and res.threads in (4, 16)
    assert len(res.trials) == 4 and all(t["batches"] == 6 for t in res.trials)
    out = capsys.readouterr().out
    assert "recommended:" in out and "because" in out


def test_tune_respects_available_memory_too():
    pipe = load_pipeline("examples.latency_pipeline:make_pipeline")
    res = tune(
        pipe,
        num_workers=1,
        batches=4,
        seconds=0,
        depths=(1,),
        threads=(4,),
        limits=Limits(cpus=2, memory_bytes=1 << 40),
        available_bytes=8 * MIB,
        verbose=False,
    )
    assert res.max_bytes <= 2 * MIB


def _fake_trials(rates: dict[tuple[Any, int], float], seen: list[dict[str, Any]]) -> Any:
    """A ``_trial`` that returns the given rate for (threads, depth), recording its
    arguments (the decision is under test, not the measurement)."""

    def trial(pipe: Any, **kw: Any) -> dict[str, Any]:
        seen.append(kw)
        threads = next(s.threads for s in pipe._stages if getattr(s, "threaded", False))
        return {
            "depth": kw["depth"],
            "batches": 50,
            "seconds": 3.0,
            "batches_per_s": rates[(threads, kw["depth"] // max(1, kw["workers"]))],
            "last_change_s": None,
            "batch_bytes": MIB,
            "peak_in_flight_bytes": MIB,
            "chosen_threads": None,
            "threads_over_time": [],
        }

    return trial


def test_tune_recommends_the_fastest_of_its_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    # fewer threads and a smaller depth measured 4% slower: the old rule ("the fewest
    # threads within 5% of the best") recommended a setting its own trial ran slower
    import streambuf.tune as tune_mod

    rates = {(4, 1): 96.0, (4, 2): 97.0, (16, 1): 99.0, (16, 2): 100.0}
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(tune_mod, "_trial", _fake_trials(rates, seen))
    pipe = load_pipeline("examples/latency_pipeline.py:make_pipeline")
    res = tune(
        pipe,
        num_workers=2,
        depths=(1, 2),
        threads=(4, 16),
        limits=Limits(cpus=2, memory_bytes=1 << 34),
        available_bytes=1 << 34,
        verbose=False,
    )
    assert (res.threads, res.max_batches) == (16, 4), res
    (picked,) = [t for t in res.trials if (t["threads"], t["depth"]) == (16, 4)]
    assert picked["batches_per_s"] == max(t["batches_per_s"] for t in res.trials)


def test_tune_takes_the_worker_count_the_loader_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    import streambuf.tune as tune_mod
    from streambuf.resources import auto_num_workers

    limits = Limits(cpus=5, memory_bytes=1 << 36, cores=8)
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(tune_mod, "_trial", _fake_trials({("auto", 1): 10.0}, seen))
    pipe = load_pipeline("examples/latency_pipeline.py:make_pipeline")
    res = tune(pipe, depths=(1,), limits=limits, available_bytes=1 << 36, verbose=False)
    want = auto_num_workers(limits)[0]
    assert want == 4  # 5 CPUs, one left for the training loop
    assert res.num_workers == want and {kw["workers"] for kw in seen} == {want}
    assert all(kw["seconds"] == 3.0 for kw in seen)  # long enough to settle, by default


def test_a_trials_rate_is_measured_over_its_second_half() -> None:
    from streambuf.tune import _settled_rate

    # a slow start (the climb), then 10 batches/s
    times = [0.0, 1.0, 2.0, 3.0, 3.1, 3.2, 3.3, 3.4, 3.5]
    assert _settled_rate(times) == pytest.approx(10.0)
    assert _settled_rate([0.0]) == 0.0 and _settled_rate([0.0, 0.5]) == pytest.approx(2.0)


def test_a_real_trial_runs_its_seconds_and_reports_the_count_it_chose() -> None:
    pipe = load_pipeline("examples/latency_pipeline.py:make_pipeline")
    res = tune(
        pipe,
        num_workers=1,
        batches=4,
        seconds=1.0,
        depths=(2,),
        limits=Limits(cpus=2, memory_bytes=1 << 34),
        available_bytes=1 << 34,
        verbose=False,
    )
    (trial,) = res.trials
    assert trial["seconds"] >= 1.0 and trial["batches"] >= 4, trial
    assert trial["chosen_threads"] is not None and trial["batches_per_s"] > 0, trial


def test_load_pipeline_errors():
    with pytest.raises(ValueError, match="MODULE:NAME"):
        load_pipeline("examples.latency_pipeline")
    with pytest.raises(TypeError, match=r"not a streambuf\.Pipeline"):
        load_pipeline("examples.latency_pipeline:time")


def test_the_chosen_count_is_said_in_words() -> None:
    from streambuf.tune import _per_worker

    assert _per_worker(4.0) == "4 threads per worker"
    assert _per_worker(2.5) == "2.5 threads per worker"
    assert _per_worker(0.0).startswith("inline (0 threads per worker")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--num-workers", "-1"], "num_workers=-1 must be >= 0"),
        (["--batches", "0"], "batches=0 must be >= 2"),
        (["--batches", "-5"], "batches=-5 must be >= 2"),
        (["--memory-fraction", "-1"], "memory_fraction=-1.0 must be a positive"),
        (["--memory-fraction", "5"], r"memory_fraction=5.0 must be in \(0, 1\]"),
        (["--memory-fraction", "nan"], "memory_fraction=nan must be a positive, finite"),
    ],
)
def test_bad_tune_options_are_named_before_anything_runs(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They ran and recommended settings from no measurement (batches 0, a memory share
    of 500%), named an option the user never gave (max_batches=-1), or gave a traceback."""
    import re

    from streambuf.cli import main

    assert main(["tune", "examples/latency_pipeline.py:make_pipeline", *argv]) == 2
    err = capsys.readouterr()
    assert re.search(named, err.err) and "recommended" not in err.out


def test_a_pipeline_without_two_batches_is_not_tuned(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import streambuf as sb
    from streambuf.cli import main
    from streambuf.tune import NothingToTune

    with pytest.raises(NothingToTune, match="at most 1 batch"):
        tune(sb.Pipeline([1, 2]).batch(2), num_workers=0, batches=5, depths=(1,), verbose=False)
    (tmp_path / "empty.py").write_text(
        "import streambuf as sb\npipe = sb.Pipeline([]).batch(2)\n", encoding="utf-8"
    )
    assert main(["tune", f"{tmp_path}/empty.py:pipe", "--num-workers", "0"]) == 2
    assert "at most 0 batch" in capsys.readouterr().err
