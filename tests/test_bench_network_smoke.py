"""The network benchmark, run tiny: HTTP, local disk and (with moto) S3 rows, webdataset
peers per sample and batched, every sample delivered once, streambuf within its credits.

Not a performance test (sizes too small for the ratios to mean anything).
"""

from __future__ import annotations

import pytest

from tests.bench_checks import assert_delivered, assert_headline, saved

pytestmark = pytest.mark.timeout(120)


def test_network_benchmark_runs_tiny(tmp_path, capsys):
    pytest.importorskip("webdataset")
    from streambuf.bench import network

    report = network.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    assert_headline(report)
    names = {r["name"] for r in report["rows"]}
    for section in ("http", "disk", "disk-32"):
        assert {
            f"{section}: streambuf lanes=3",
            f"{section}: webdataset per sample",
            f"{section}: webdataset batched",
        } <= names
    assert "http: map-style Range GET pf=2" in names
    assert "http: streambuf lanes=auto" in names  # the lane ladder's auto row
    s3 = {n for n in names if n.startswith("s3: ")}
    if "s3" in report["notes"]:  # moto or s3fs missing: recorded, not silently dropped
        assert not s3 and report["notes"]["s3"].startswith("not importable")
    else:
        assert s3 == {
            "s3: streambuf lanes=3",
            "s3: streambuf lanes=auto",
            "s3: webdataset per sample",
            "s3: webdataset batched",
        }
    assert all(r["runs"][0]["distinct_samples"] == r["runs"][0]["samples"] for r in report["rows"])
    data = saved(tmp_path, "network")
    assert {h["workload"].split(" (")[0] for h in data["headline"]} >= {
        "network HTTP",
        "network local disk",
        "network local disk, batch 32",
        "network HTTP, lanes='auto'",
    }
    disk32 = next(h for h in data["headline"] if h["workload"] == "network local disk, batch 32")
    assert "batch 32" in disk32["how"]
    assert "| reader |" in capsys.readouterr().out
