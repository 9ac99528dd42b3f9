"""examples/video_clips.py runs end to end (as a subprocess, the way a user runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("av")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(90)
def test_video_example_trains_a_few_steps() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "video_clips.py"), "--small"],
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert out.returncode == 0, out.stderr
    assert "step   6" in out.stdout and "clips/s" in out.stdout
    assert "buffer: peak in flight" in out.stdout
