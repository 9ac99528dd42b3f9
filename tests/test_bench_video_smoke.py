"""The video benchmark, run tiny: it must finish, print its tables and write its JSON.

Not a test of performance (the tiny videos measure nothing); it only proves it still runs.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("av")

from benchmarks import video_clips

pytestmark = pytest.mark.timeout(60)


def test_video_benchmark_runs_tiny(tmp_path, capsys) -> None:
    report = video_clips.run(out=str(tmp_path), config=video_clips.TINY)
    assert set(report["decode"]) == {"one_core", "all_cores"}
    clips = report["random_clips"]
    assert clips["same_frames"] is True  # both sides decode the very same frames
    assert set(clips["medians"]) == {"streambuf", "DataLoader pf=1", "DataLoader pf=2"}
    assert clips["clips"] == 2 * video_clips.TINY.clip_videos
    saved = json.loads((tmp_path / "video_clips.json").read_text())
    assert saved["versions"]["av"] and saved["cpus"] >= 1
    out = capsys.readouterr().out
    assert "decode throughput" in out and "speedup vs best DataLoader" in out
