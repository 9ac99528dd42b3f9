"""The cache benchmark, run tiny: every reader's two epochs deliver every sample once,
streambuf's epoch 2 makes no request with the cache on, the table and JSON are written.

Not a performance test (sizes too small for the ratios to mean anything).
"""

from __future__ import annotations

import pytest

from tests.bench_checks import assert_delivered, assert_headline, saved

pytestmark = pytest.mark.timeout(180)


def test_cache_benchmark_runs_tiny(tmp_path, capsys):
    pytest.importorskip("webdataset")
    from streambuf.bench import cache

    report = cache.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    assert_headline(report)
    rows = {r["name"]: r for r in report["rows"]}
    for reader in (
        "streambuf cache",
        "streambuf no cache",
        "webdataset cache_dir per sample",
        "webdataset cache_dir batched",
        "streambuf local files",
        "webdataset local files batched",
    ):
        for epoch in (1, 2):
            run = rows[f"{reader}: epoch {epoch}"]["runs"][0]
            assert run["distinct_samples"] == run["samples"] == run["expected_samples"]
    cached = [rows[f"streambuf cache: epoch {e}"]["runs"][0] for e in (1, 2)]
    assert cached[0]["requests"] >= 4 and cached[1]["requests"] == 0
    assert cached[1]["cache_hits"] == 4 and cached[1]["cache_bytes_saved"] > 0
    assert rows["streambuf no cache: epoch 2"]["runs"][0]["requests"] >= 4
    head = saved(tmp_path, "cache")["headline"][0]
    assert head["workload"].startswith("cache epoch 1") and "cache_dir" in head["peer_name"]
    assert "| reader | epoch 1 samples/s |" in capsys.readouterr().out
