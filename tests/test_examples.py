"""Every example runs end to end (as a subprocess, the way a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_buffer_basics_example():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "buffer_basics.py")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    assert "sum=4950" in out.stdout


@pytest.mark.timeout(120)
def test_latency_pipeline_example():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "latency_pipeline.py")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr
    # 1024 samples in batches of 32, every one delivered; the threads="auto" counts shown
    assert out.stdout.startswith("32 batches in "), out.stdout
    assert "threads over both workers" in out.stdout, out.stdout


@pytest.mark.timeout(120)
def test_where_time_goes_example():
    """The README's "Is the data the bottleneck?" output: the map named when the step
    is fast, the consumer when it is slow (the example asserts both)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "where_time_goes.py")],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    assert "bottleneck: map(load)" in out.stdout and "bottleneck: consumer" in out.stdout


@pytest.mark.timeout(180)
def test_checkpoint_resume_example():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "checkpoint_resume.py")],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.returncode == 0, out.stderr
    assert "all 96 exactly once" in out.stdout, out.stdout


@pytest.mark.timeout(120)
def test_torchdata_nodes_example_checkpoints_and_resumes():
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's streambuf, not an install
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torchdata_nodes.py")],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("resumed after 11 of 32 batches"), out.stdout
    assert "512 samples, each once, in order" in out.stdout


@pytest.mark.timeout(120)
def test_webdataset_migration_example_agrees_with_webdataset():
    pytest.importorskip("webdataset")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "webdataset_migration.py")],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "agree: 8 batches, 30 images" in out.stdout, out.stdout


@pytest.mark.timeout(180)
def test_pack_tokens_example():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pack_tokens.py")],
        capture_output=True,
        text=True,
        timeout=160,
    )
    assert out.returncode == 0, out.stderr
    assert "equal the uninterrupted run" in out.stdout, out.stdout
    assert "tokens (4, 256), document_ids (4, 256)" in out.stdout, out.stdout
