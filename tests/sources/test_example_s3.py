"""examples/stream_s3_shards.py runs end to end, as a user runs it (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "stream_s3_shards.py"
pytestmark = pytest.mark.timeout(120)


def run_example(*args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=100,
        env={**os.environ, "no_proxy": "127.0.0.1,localhost", **(env or {})},
        cwd=str(ROOT),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_example_starts_its_own_s3_server() -> None:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    stdout = run_example()
    assert "240 samples" in stdout and "ok: every sample exactly once" in stdout


def test_example_against_a_given_endpoint(moto_endpoint: str) -> None:
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    env = {**creds, "AWS_DEFAULT_REGION": "us-east-1"}
    stdout = run_example("--endpoint", moto_endpoint, "--bucket", "given", env=env)
    assert "ok: every sample exactly once" in stdout
    # and reading existing shards by spec, without uploading
    spec = "demo/shard-{000000..000002}.tar"
    stdout = run_example(
        "--endpoint", moto_endpoint, "--bucket", "given", "--shards", spec, env=env
    )
    assert stdout.startswith("120 samples")
