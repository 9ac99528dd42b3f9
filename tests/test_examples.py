"""Every example runs end to end (as a subprocess, the way a user runs it, with this
checkout's streambuf first on the path, not an installed copy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, timeout_s: float = 100) -> str:
    """``examples/<name>`` run to the end within ``timeout_s``: its stdout (a failure
    shows its stderr and stdout)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


@pytest.mark.timeout(120)
def test_buffer_basics_example():
    assert "sum=4950" in run_example("buffer_basics.py")


@pytest.mark.timeout(120)
def test_latency_pipeline_example():
    out = run_example("latency_pipeline.py")
    # 1024 samples in batches of 32, every one delivered; the threads="auto" counts shown
    assert out.startswith("32 batches in "), out
    assert "threads over both workers" in out, out


@pytest.mark.serial
@pytest.mark.timeout(120)
def test_where_time_goes_example():
    """The README's "Is the data the bottleneck?" output: the map named when the step
    is fast, the consumer when it is slow (the example asserts both)."""
    out = run_example("where_time_goes.py")
    assert "bottleneck: map(load)" in out and "bottleneck: consumer" in out, out


@pytest.mark.timeout(180)
def test_checkpoint_resume_example():
    assert "all 96 exactly once" in run_example("checkpoint_resume.py", 170)


@pytest.mark.timeout(120)
def test_torchdata_nodes_example_checkpoints_and_resumes():
    out = run_example("torchdata_nodes.py")
    assert out.startswith("resumed after 11 of 32 batches"), out
    assert "512 samples, each once, in order" in out, out


@pytest.mark.timeout(120)
def test_webdataset_migration_example_agrees_with_webdataset():
    pytest.importorskip("webdataset")
    assert "agree: 8 batches, 30 images" in run_example("webdataset_migration.py")


@pytest.mark.timeout(180)
def test_pack_tokens_example():
    out = run_example("pack_tokens.py", 160)
    assert "equal the uninterrupted run" in out, out
    assert "tokens (4, 256), document_ids (4, 256)" in out, out


def test_the_readme_counts_the_planted_bugs_there_are() -> None:
    """The README's "plants N known bugs" is the number ``make mutants`` plants (it was
    found 12 behind)."""
    import re

    from tests.planted import all_mutants

    said = re.search(r"plants (\d+) known bugs", (ROOT / "README.md").read_text())
    assert said is not None
    assert int(said.group(1)) == len(all_mutants())
