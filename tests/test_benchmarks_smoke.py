"""Each benchmark, run tiny: it must finish, print its table and write its JSON (and PNG).

Benchmarks are not tests of performance; this only proves they still run.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import buffer_overhead, bursty, latency, memory, stall

pytestmark = pytest.mark.timeout(300)


def test_buffer_overhead_runs(tmp_path, capsys):
    report = buffer_overhead.run(quick=True, out=str(tmp_path), repeats=1)
    assert set(report["results"]) == {"ints", "tensors_4KiB"}
    assert json.loads((tmp_path / "buffer_overhead.json").read_text())["results"]
    assert "BoundedBuffer/s" in capsys.readouterr().out


def test_cli_bench_buffer(tmp_path):
    from streambuf.cli import main

    assert main(["bench", "buffer", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "buffer_overhead.json").exists()


@pytest.mark.parametrize("mod", [latency, memory, stall, bursty], ids=lambda m: m.__name__)
def test_ladder_benchmarks_run_tiny(mod, tmp_path, capsys):
    report = mod.run(out=str(tmp_path), tiny=True)
    name = report["benchmark"]
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["environment"]["cpu_count"] >= 1
    assert all(r["runs"] for r in data["rows"])
    assert "| run |" in capsys.readouterr().out
    if name in ("latency", "memory"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0


def test_gpu_benchmark_runs_tiny_on_cpu(tmp_path, capsys):
    from benchmarks import gpu

    report = gpu.run(out=str(tmp_path), tiny=True, allow_cpu=True)
    assert report["device"] in ("cpu", "cuda")
    assert all(0 < r["busy_fraction"] <= 1.0 for r in report["rows"])
    assert (tmp_path / "gpu.json").exists()
