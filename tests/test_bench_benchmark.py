"""The ``Benchmark`` type: a toy benchmark declared with two rows checks its runs, prints
its table, writes the one JSON shape with its headline ratio, and draws its plot."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streambuf.bench._benchmark import Benchmark
from streambuf.bench._report import Ladder, versus


def _rows(mode: str, delivered: int = 8) -> dict[str, Any]:
    run = {"samples": delivered, "expected_samples": 8}
    return {
        "answer": 42,
        "rows": [
            {
                "name": "toy: DataLoader pf=2",
                "kind": "dataloader",
                "config": {"prefetch_factor": 2},
                "runs": [run],
                "batches_per_s": 10.0,
            },
            {
                "name": "toy: streambuf",
                "kind": "streambuf",
                "config": {},
                "runs": [run],
                "batches_per_s": 25.0,
            },
        ],
    }


TOY = Benchmark(
    name="toy",
    measure=_rows,
    title=lambda r: f"toy ({r['mode']}): two rows",
    columns=("run", "batches/s"),
    table=lambda r: [(x["name"], x["batches_per_s"]) for x in r["rows"]],
    headline=lambda r: [
        versus(r["rows"], "batches_per_s", workload="toy", metric="batches/s"),
        versus(r["rows"][:1], "batches_per_s", workload="no streambuf row", metric="x"),
    ],
    plot=lambda r: Ladder("toy", r["rows"]),
)


def test_a_benchmark_writes_its_table_json_headline_and_plot_once(tmp_path, capsys):
    report = TOY.run(out=str(tmp_path), tiny=True)
    out = capsys.readouterr().out
    table = "| run | batches/s |\n|---|---|\n| toy: DataLoader pf=2 | 10.00 |\n| toy: streambuf | 25.00 |"
    assert "toy (tiny): two rows\n" + table in out
    data = json.loads((tmp_path / "toy.json").read_text())
    assert data["benchmark"] == "toy" and data["mode"] == "tiny" and data["answer"] == 42
    assert data["environment"]["cpu_count"] >= 1 and data["table"] == table
    assert [r["name"] for r in data["rows"]] == ["toy: DataLoader pf=2", "toy: streambuf"]
    [head] = data["headline"]  # the row without a streambuf side is dropped
    assert head["peer_name"] == "DataLoader pf=2" and head["ratio"] == 2.5
    assert head == report["headline"][0]
    assert (tmp_path / "toy.png").stat().st_size > 0
    assert out.count("wrote") == 2


def test_a_benchmark_refuses_a_run_that_lost_samples_before_writing(tmp_path):
    lossy = Benchmark(
        name="lossy",
        measure=lambda mode: _rows(mode, delivered=7),
        title=lambda r: "lossy",
        columns=("run",),
        table=lambda r: [],
    )
    with pytest.raises(RuntimeError, match="toy: streambuf run 0: delivered 7 samples"):
        lossy.run(out=str(tmp_path))
    assert not list(tmp_path.iterdir())
