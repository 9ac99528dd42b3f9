"""The video benchmark, run tiny: seek-per-clip peers under the pf ladder, the footnote,
torchcodec or the reason it is absent, identical frames, every clip delivered.

Not a test of performance (the tiny videos measure nothing).
"""

from __future__ import annotations

import pytest

pytest.importorskip("av")

from streambuf.bench import video
from tests.bench_checks import assert_delivered, assert_headline, saved

pytestmark = pytest.mark.timeout(90)


def test_video_benchmark_runs_tiny(tmp_path, capsys) -> None:
    report = video.run(out=str(tmp_path), tiny=True)
    assert_delivered(report)
    assert_headline(report)
    assert report["same_frames"] == {"30": True}  # both sides decode the very same frames
    kinds = {r["kind"] for r in report["rows"]}
    assert {"streambuf", "seek-per-clip", "from-start"} <= kinds
    if report["torchcodec"] == "imported":
        assert "torchcodec" in kinds
    else:
        assert report["torchcodec"].startswith("not importable: ") and "torchcodec" not in kinds
    assert report["rows"][0]["runs"][0]["expected_samples"] == 2 * video.TINY.videos
    # the strawman is a footnote: never the headline's peer
    assert all("decode-from-start" not in h["peer_name"] for h in report["headline"])
    assert set(report["decode_overhead"]) == {"one_core", "all_cores"}
    data = saved(tmp_path, "video")
    assert data["versions"]["av"]
    out = capsys.readouterr().out
    assert "seek-per-clip" in out and "decode overhead" in out
