"""The tuner inside a real Loader: grows when the consumer starves, stats expose it."""

from __future__ import annotations

import logging

import pytest

from streambuf import Loader, Pipeline
from tests.pipeline_data import sleepy

pytestmark = pytest.mark.timeout(120)


def test_adaptive_grows_when_starved_and_logs(caplog):
    pipe = Pipeline(list(range(1200))).map(sleepy, threads=2).batch(4)
    loader = Loader(
        pipe,
        num_workers=2,
        max_batches=16,
        max_bytes="64MiB",
        tuner_interval_s=0.1,
        memory_reserve_bytes=None,
        log_every_s=0.2,
    )
    assert loader.tuner is not None and loader.tuner.depth == 4
    with caplog.at_level(logging.INFO, logger="streambuf"):
        n = sum(1 for _ in loader)
    assert n == 300
    s = loader.stats()
    assert s.tuner_decisions >= 1 and s.depth > 4
    assert s.decisions[0].old_depth == 4 and "waited" in s.decisions[0].reason
    assert any("depth 4 ->" in r.getMessage() for r in caplog.records)
    flat = s.as_dict(flat=True)
    assert flat["depth"] == s.depth and "budget/peak_in_flight_bytes" in flat
    assert all(isinstance(v, int | float) for v in flat.values())
    assert any("batches_per_s" in r.getMessage() for r in caplog.records)


def test_not_adaptive_keeps_max_batches():
    pipe = Pipeline(list(range(40))).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=6, max_bytes="1MiB", adaptive=False)
    assert loader.tuner is None
    assert sum(1 for _ in loader) == 10
    assert loader.stats().depth == 6
