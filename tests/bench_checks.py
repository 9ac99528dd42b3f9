"""Assertions shared by the benchmark smoke tests (import as tests.bench_checks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streambuf.bench._report import credit_bound


def assert_delivered(report: dict[str, Any]) -> None:
    """Every run delivered exactly its expected samples (``batches x batch_size`` for the
    ladders), and every streambuf run reports its credits, within the budget."""
    assert report["rows"], "no rows"
    for row in report["rows"]:
        assert row["runs"], f"{row['name']}: no runs"
        for run in row["runs"]:
            assert run["expected_samples"] > 0
            assert run["samples"] == run["expected_samples"], row["name"]
            if row["kind"] == "streambuf":
                assert 0 < run["peak_in_flight_bytes"] <= credit_bound(run), row["name"]


def assert_headline(report: dict[str, Any]) -> None:
    """Each headline row names a peer, and its ratio is streambuf's figure over the peer's
    (or the inverse where lower is better)."""
    assert report["headline"]
    for h in report["headline"]:
        assert h["peer_name"] and "streambuf" not in h["peer_name"]
        want = h["streambuf"] / h["peer"] if h["better"] == "higher" else h["peer"] / h["streambuf"]
        assert abs(h["ratio"] - want) < 1e-9 * max(1.0, want)


def saved(tmp_path: Path, name: str) -> dict[str, Any]:
    """The JSON a benchmark wrote, with the environment every one records."""
    data: dict[str, Any] = json.loads((tmp_path / f"{name}.json").read_text())
    env = data["environment"]
    assert env["cpu_count"] >= 1 and env["torch"] and env["limits"]["cpus"] > 0
    return data
