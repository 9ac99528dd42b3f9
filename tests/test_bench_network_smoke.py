"""The network benchmark, run tiny: it must finish, print its table and write its JSON.

Not a performance test (sizes too small for the ratios to mean anything).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(90)

TINY = {
    "shards": 4,
    "per_shard": 4,
    "sample_bytes": 4096,
    "latency_s": 0.005,
    "bandwidth_bps": 50e6,
    "batch_size": 4,
    "map_samples": 8,
    "prefetch_factors": [2],
    "repeats": 1,
}


def test_network_benchmark_runs(tmp_path, capsys):
    pytest.importorskip("webdataset")
    from benchmarks import network_shards

    report = network_shards.run(out=str(tmp_path), overrides=TINY)
    assert set(report["rows"]) == {
        "(a) streambuf lanes=3",
        "(b) webdataset",
        "(c) map-style pf=2",
    }
    assert all(r["runs"][0]["samples"] > 0 for r in report["rows"].values())
    saved = json.loads((tmp_path / "network_shards.json").read_text())
    assert saved["ratios"]["a_over_b"] > 0 and saved["versions"]["torch"]
    assert "(a)/(b)" in capsys.readouterr().out
