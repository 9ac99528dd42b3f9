"""Each benchmark, run tiny: it must finish, print its table and write its JSON.

Benchmarks are not tests of performance; this only proves they still run.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import buffer_overhead

pytestmark = pytest.mark.timeout(120)


def test_buffer_overhead_runs(tmp_path, capsys):
    report = buffer_overhead.run(quick=True, out=str(tmp_path), repeats=1)
    assert set(report["results"]) == {"ints", "tensors_4KiB"}
    assert json.loads((tmp_path / "buffer_overhead.json").read_text())["results"]
    assert "BoundedBuffer/s" in capsys.readouterr().out


def test_cli_bench_buffer(tmp_path):
    from streambuf.cli import main

    assert main(["bench", "buffer", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "buffer_overhead.json").exists()
