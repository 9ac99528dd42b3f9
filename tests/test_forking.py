"""Forked workers never finalize what they inherited from the parent: garbage the parent
had not collected yet (here a cycle whose finalizer records the process it ran in; in
the field, an FFmpeg decoder or filter graph whose threads do not exist in the worker,
which hung both workers) is never collected by a worker's garbage collector."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

import streambuf as sb

pytestmark = pytest.mark.timeout(120)


class Inherited:
    """A reference cycle; its finalizer writes where it ran if that is not its maker."""

    def __init__(self, path: Path) -> None:
        self.path, self.pid, self.me = str(path), os.getpid(), self

    def __del__(self) -> None:
        if os.getpid() != self.pid:
            Path(self.path).write_text(f"finalized in worker {os.getpid()}")


def collect(x: int) -> int:
    gc.collect()  # every item: a worker's collector runs over all it holds
    return x


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_never_collect_the_parents_garbage(tmp_path: Path, persistent: bool) -> None:
    mark = tmp_path / "finalized"
    was_enabled = gc.isenabled()
    gc.disable()  # the cycle stays uncollected in the parent until the workers fork
    try:
        Inherited(mark)  # garbage: unreachable, not collected yet
        loader = sb.Loader(
            sb.Pipeline(list(range(16))).map(collect).batch(4),
            num_workers=2,
            max_batches=4,
            max_bytes="4MiB",
            multiprocessing_context="fork",
            persistent_workers=persistent,
            timeout_s=60,
        )
        for _ in range(2 if persistent else 1):  # (persistent: forked once, reused)
            assert sum(len(b) for b in loader) == 16
    finally:
        if was_enabled:
            gc.enable()
    assert not mark.exists(), mark.read_text()
    gc.collect()  # the parent collects its own garbage: finalized here, nowhere else
    assert not mark.exists()
