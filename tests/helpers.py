"""Small helpers shared by tests (import as tests.helpers)."""

from __future__ import annotations

import threading
import time


def wait_for_threads(prefix: str = "streambuf", timeout_s: float = 5.0) -> list[str]:
    """Names of threads starting with ``prefix`` still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def slot_batches(pipe, *, rank: int, world: int, worker: int, workers: int, epoch: int = 0):
    """What DataLoader worker ``worker`` of ``workers`` on ``rank`` of ``world`` yields for
    ``epoch``, computed in this process (the reference the real loaders must match)."""
    from streambuf import WorkerContext

    ctx = WorkerContext(rank, world, worker, workers, epoch, pipe.seed)
    return list(pipe._iterate(ctx, stage_bytes=None))


def merged_batches(pipe, *, rank: int, world: int, workers: int, epoch: int = 0):
    """The in-order DataLoader's output on ``rank``: its workers' batches round robin,
    skipping workers that are exhausted (``workers=0`` is one slot, in process)."""
    streams = [
        slot_batches(pipe, rank=rank, world=world, worker=w, workers=max(workers, 1), epoch=epoch)
        for w in range(max(workers, 1))
    ]
    out = []
    for i in range(max((len(s) for s in streams), default=0)):
        out += [s[i] for s in streams if i < len(s)]
    return out
