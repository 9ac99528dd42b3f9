from __future__ import annotations

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
