"""A chain of threaded stages stops whole (design.md invariant 6), without a garbage
collection: when the consumer breaks out, a stage raises, or the Loader is closed, every
stage upstream of the one the consumer reads stops its threads and closes its shard
files, not only that one. A threaded ``map`` (or ``prefetch``) pulls its upstream on its
own threads and used to leave that iterator to the garbage collector: the shard lanes
behind it kept their threads and files, growing with every epoch in persistent workers.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import streambuf as sb
from tests.helpers import wait_for_threads
from tests.resume_grid import write_shards

pytestmark = pytest.mark.timeout(120)


def _slow(sample: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.002)
    return sample


def _chains(paths: list[str]) -> dict[str, Callable[[], sb.Pipeline]]:
    """Pipelines whose last threaded stage has another threaded stage upstream."""
    return {
        "shards lanes=3, map threads=4": lambda: sb.shards(paths, lanes=3, adaptive=False).map(
            _slow, threads=4
        ),
        "shards lanes=auto, map threads=auto": lambda: sb.shards(
            paths, lanes="auto", adaptive=False
        ).map(_slow, threads="auto"),
        "shards lanes=3, prefetch": lambda: (
            sb.shards(paths, lanes=3, adaptive=False)
            .map(_slow, threads=2)
            .prefetch(max_items=4, max_bytes="16MiB")
        ),
        "map threads=2, map threads=2": lambda: (
            sb.Pipeline(range(10_000))
            .map(lambda x: (time.sleep(0.001), x)[1], threads=2)
            .map(lambda x: x, threads=2)
        ),
    }


CHAINS = list(_chains([]))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_shards(tmp_path_factory.mktemp("chain") / "shards", [40] * 12)


def _open_shards(paths: list[str]) -> list[str]:
    root = str(Path(paths[0]).parent)
    return [f.path for f in psutil.Process().open_files() if f.path.startswith(root)]


def _stopped(paths: list[str]) -> tuple[list[str], list[str]]:
    """Threads still alive and shard files still open, 5 s at most after the stop."""
    alive = wait_for_threads(timeout_s=5.0)
    deadline = time.monotonic() + 5.0
    while _open_shards(paths) and time.monotonic() < deadline:
        time.sleep(0.01)
    return alive, _open_shards(paths)


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The stop must not wait for a collection: none runs during the test."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _batches(pipe: sb.Pipeline, fail_at: int | None = None) -> Iterator[Any]:
    n = 0
    for batch in pipe.batch(4):
        n += 1
        if fail_at is not None and n == fail_at:
            raise RuntimeError("the training step failed")
        yield batch


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("end", ["break", "error", "loader.close"])
def test_every_threaded_stage_of_a_chain_stops_when_the_consumer_stops(
    paths: list[str], chain: str, end: str, no_gc: None
) -> None:
    pipe = _chains(paths)[chain]()
    if end == "break":
        for i, _ in enumerate(pipe.batch(4)):
            if i == 2:
                break
    elif end == "error":
        calls = itertools.count()
        bad = pipe.map(lambda x: x if next(calls) < 10 else 1 // 0)  # the 11th item fails
        with pytest.raises(ZeroDivisionError):
            for _ in bad.batch(4):
                pass
    else:
        loader = sb.Loader(pipe.batch(4), num_workers=0, max_batches=4, max_bytes="64MiB")
        it = iter(loader)
        for _ in range(3):
            next(it)
        loader.close()
    alive, files = _stopped(paths)
    assert alive == [], f"{chain}, {end}: threads still running: {alive}"
    assert files == [], f"{chain}, {end}: shard files still open: {files}"


class _CleanupFails(sb.Stage):
    """A user stage whose clean-up raises (a file that cannot be flushed, say)."""

    def iterate(self, samples, state):  # type: ignore[no-untyped-def]
        try:
            yield from samples
        finally:
            raise OSError("clean-up failed")


def _fails_at_10(x: int) -> int:
    if x == 10:
        raise KeyError("the real error")
    return x


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_clean_up_upstream_does_not_replace_the_error(workers: int) -> None:
    """Closing the upstream stage (its ``finally`` raising) must not hide the exception
    the threaded stage is delivering: the user sees the ``KeyError``, not the clean-up's
    ``OSError`` (logged instead), and a break still ends quietly (found by review)."""
    pipe = sb.Pipeline(list(range(200))).compose(_CleanupFails()).map(_fails_at_10, threads=2)
    with pytest.raises(KeyError, match="the real error"):
        with sb.Loader(pipe.batch(4), num_workers=workers, max_batches=4, max_bytes="64MiB") as ld:
            for _ in ld:
                pass
    quiet = sb.Pipeline(list(range(200))).compose(_CleanupFails()).map(abs, threads=2)
    for i, _ in enumerate(quiet):
        if i == 5:
            break
    assert wait_for_threads(timeout_s=5.0) == []


def test_loader_close_from_another_thread_ends_an_in_process_iteration() -> None:
    """``num_workers=0``: the iteration runs in the caller's thread, which ``close()``
    from another thread cannot interrupt; it ends after the batch it waits for, and its
    stages stop (found by review: it ran on)."""
    pipe = sb.Pipeline(range(100_000)).map(lambda x: (time.sleep(0.001), x)[1], threads=2)
    loader = sb.Loader(pipe.batch(4), num_workers=0, max_batches=4, max_bytes="64MiB")
    closer = threading.Timer(0.3, loader.close)
    closer.start()
    t0 = time.monotonic()
    n = 0
    for _ in loader:
        n += 1
        assert time.monotonic() - t0 < 10, "still iterating long after close()"
    closer.join(5)
    assert n < 25_000 and wait_for_threads(timeout_s=5.0) == []


def test_persistent_workers_do_not_gather_threads_epoch_after_epoch(paths: list[str]) -> None:
    """Two persistent workers, each epoch left after a few batches: the workers' thread
    and file counts stay where the first epoch left them, and the stage gauges read 0
    between epochs (a worker's stopped lanes used to stay counted as running)."""
    pipe = sb.shards(paths, lanes="auto", adaptive=False).map(_slow, threads="auto").batch(4)
    seen: list[tuple[int, int]] = []
    with sb.Loader(
        pipe, num_workers=2, max_batches=4, max_bytes="64MiB", persistent_workers=True
    ) as loader:
        for epoch in range(4):
            loader.set_epoch(epoch)
            for i, _ in enumerate(loader):
                if i == 3:
                    break
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:  # the workers stop their stages by now
                rows = pipe.stats().threads
                if all(r.running == 0 for r in rows):
                    break
                time.sleep(0.05)
            rows = pipe.stats().threads
            assert len(rows) == 2 and all(r.running == 0 for r in rows), rows
            # the gauges go to 0 as a stage's threads are joined, its files a moment
            # later: read the counts once they stop falling (the first epoch's too)
            seen.append(_settled_counts(psutil.Process().children(), seen[0] if seen else None))
    threads, fds = zip(*seen)
    assert max(threads[1:]) <= threads[0] and max(fds[1:]) <= fds[0], seen


def _settled_counts(workers: list, baseline: tuple[int, int] | None) -> tuple[int, int]:
    """The workers' thread and descriptor counts, read until they reach ``baseline``
    (later epochs) or hold still for 0.5 s (the first), within 10 s."""
    deadline = time.monotonic() + 10.0
    last = None
    while True:
        now = (sum(w.num_threads() for w in workers), sum(w.num_fds() for w in workers))
        if baseline is not None and now[0] <= baseline[0] and now[1] <= baseline[1]:
            return now
        if (baseline is None and now == last) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.5)
