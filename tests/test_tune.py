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
        depths=(1,),
        threads=(4,),
        limits=Limits(cpus=2, memory_bytes=1 << 40),
        available_bytes=8 * MIB,
        verbose=False,
    )
    assert res.max_bytes <= 2 * MIB


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
