"""clips() through Loader(num_workers=2): exactly once, and the byte budget holds for 720p.

The budget is checked on its own accounting (credits in flight, at the batches' true
size) once the workers ran ahead until it stopped them. Memory follows docs/design.md
"Measuring memory": system AnonPages + Shmem sampled on a thread; growth = peak of the
real run - peak of the same run with 16x16 clips (same videos, same decoding, same batch
count). The rule: growth <= 1.25 x max_bytes + 100 MiB. How much more a plain DataLoader
holds is a benchmark's figure (``streambuf bench memory``): it depends on the machine.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from typing import Any

import pytest

from streambuf import Loader
from streambuf.bench import memwatch
from streambuf.video import (
    Clip,
    clips,
    clips_at_random_indices,
    decode_clips,
    every_frame_windows,
)

MIB = 1 << 20


def keys_of(batch: Clip) -> list[tuple[str, int]]:
    assert isinstance(batch.source, list) and not isinstance(batch.clip_index, int)
    return list(zip(batch.source, batch.clip_index.tolist()))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n_videos", [5, 1])  # 1 video < 2 workers: clip-level split
def test_exactly_once_through_loader(videos, n_videos) -> None:
    paths = sorted(str(p) for p in videos.values())[:n_videos]
    sampler = every_frame_windows(4, stride=3)
    want = Counter(
        (str(c.source), int(c.clip_index)) for p in paths for c in decode_clips(p, sampler=sampler)
    )
    pipe = clips(paths, sampler=sampler, width=16, height=16, threads=2).batch(3)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="16MiB", timeout_s=30)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = Counter(k for batch in loader for k in keys_of(batch))
        assert got == want  # every (video, clip) once: nothing lost, nothing twice


# -- the byte budget with 720p clips -------------------------------------------------------
N_FILES, CLIPS_PER_VIDEO, FRAMES, BATCH = 24, 2, 8, 2
MAX_BYTES = 512 * MIB  # one 720p batch: 2 clips x 8 x 3 x 720 x 1280 B = 42 MiB
CONSUMER_S = 0.15


@pytest.fixture(scope="module")
def hd_videos(tmp_path_factory, writers) -> list[str]:
    """24 files of 720p H.264 (3 s at 8 fps, a keyframe per second): 2 encoded, copied."""
    write_video, _, specs = writers
    base = specs["h264_bframes"]
    folder = tmp_path_factory.mktemp("hd")
    made = []
    for k in range(2):
        spec = type(base)(
            f"hd{k}",
            "libx264",
            "mp4",
            1280,
            720,
            24 + 8 * k,
            fps=8,
            options=(
                ("x264-params", "keyint=8:min-keyint=8:scenecut=0:bframes=2"),
                ("preset", "ultrafast"),
            ),
        )
        made.append(write_video(folder / f"hd{k}.mp4", spec))
    out = []
    for i in range(N_FILES):
        dst = folder / f"clip{i:02d}.mp4"
        shutil.copyfile(made[i % 2], dst)
        out.append(str(dst))
    return out


def _pipe(paths: list[str], tiny: bool):
    size = 16 if tiny else None
    sampler = clips_at_random_indices(num_clips=CLIPS_PER_VIDEO, num_frames_per_clip=FRAMES)
    return clips(paths, sampler=sampler, width=size, height=size, threads=2).batch(BATCH)


def _consume(loader: Any) -> tuple[int, int]:
    """Every batch, slowly; after the first one the consumer waits (``_hold``) until the
    workers stopped for want of credits. Returns (clips, bytes of the largest batch's
    frames)."""
    n = largest = 0
    for batch in loader:
        n += len(batch.source)
        largest = max(largest, batch.data.nbytes)
        if n == len(batch.source):
            _hold(loader, batch.data.nbytes)
        time.sleep(CONSUMER_S)  # a slow consumer: everything upstream fills up
    return n, largest


HOLD_S, QUIET_S = 120.0, 2.0


def _hold(loader: Any, batch_bytes: int) -> None:
    """Wait until every worker took as many batches as its credits allow (and nothing
    moved for ``QUIET_S``: a bound that let it take more would show), or until each
    holds its whole batch slice (then nothing can move). However slowly the machine
    decodes, the budget, not the decode rate, is what stops the workers when this
    returns: the accounting's peak is then the budget's own."""
    deadline = time.monotonic() + HOLD_S
    last: tuple[int, ...] = ()
    since = time.monotonic()
    while time.monotonic() < deadline:
        b = loader.stats().budget
        counts = tuple(b.per_worker_batches)
        if all(n >= k for n, k in zip(counts, b.per_worker_limit_batches)):
            return
        now = time.monotonic()
        if counts != last:
            last, since = counts, now
        elif now - since >= QUIET_S and all(n >= k for n, k in zip(counts, _fits(b, batch_bytes))):
            return
        time.sleep(0.02)


def _fits(budget: Any, batch_bytes: int) -> list[int]:
    """How many batches of ``batch_bytes`` each worker's slice holds at once."""
    return [
        min(n, b // batch_bytes)
        for n, b in zip(budget.per_worker_limit_batches, budget.per_worker_limit_bytes)
    ]


def _streambuf_run(paths: list[str], tiny: bool) -> tuple[int, int, memwatch.MemoryPeak, Any]:
    # a fixed depth (no depth tuner, which keeps a slow consumer's depth low): the bytes
    # are the bound under test, and at 720p they bind before the 16 batches do
    loader = Loader(
        _pipe(paths, tiny),
        num_workers=2,
        max_batches=16,
        max_bytes=MAX_BYTES,
        timeout_s=60,
        adaptive=False,
    )
    (n, largest), peak = memwatch.watch(lambda: _consume(loader))
    return n, largest, peak, loader.stats().budget


@pytest.mark.serial
@pytest.mark.timeout(300)
@pytest.mark.skipif(not memwatch.available(), reason="needs /proc/meminfo")
def test_byte_budget_holds_for_720p_clips(hd_videos) -> None:
    """The workers run ahead of a slow consumer until the budget stops them. On any
    machine: the credits in flight never pass ``max_bytes`` (each worker's slice), and
    the batches in flight at once, at their true size (their frames' bytes, not what the
    accounting charged), fit in it; the hold after the first batch makes the budget, not
    the decode rate, what stopped the workers, so the peak is the budget's own. Memory:
    the system's growth stays within the rule (the budget full: CPU load cannot raise
    it; a neighbour's allocations can, hence ``serial`` and one retry).

    What an unbounded ``DataLoader`` holds beside it depends on how fast its workers
    decode (on a busy machine they never get far ahead of the consumer): that comparison
    is ``streambuf bench memory`` (the ``prefetch_factor`` ladder against the budget,
    memory growth per row) and ``benchmarks/prefetch_ladder.py``."""
    rule = memwatch.budget_rule_bytes(MAX_BYTES)
    total = N_FILES * CLIPS_PER_VIDEO
    growths = []
    for _attempt in range(2):  # the machine is shared: one retry absorbs a neighbour's spike
        n_tiny, _, tiny, _ = _streambuf_run(hd_videos, tiny=True)
        n, batch_bytes, real, budget = _streambuf_run(hd_videos, tiny=False)
        assert n == n_tiny == total
        assert budget is not None
        assert batch_bytes == BATCH * FRAMES * 3 * 720 * 1280
        # accounting: batches produced and not yet handed over never exceed the budget
        assert budget.peak_in_flight_bytes <= budget.max_bytes <= MAX_BYTES
        peaks, limits = budget.per_worker_peak_bytes, budget.per_worker_limit_bytes
        assert all(p <= lim for p, lim in zip(peaks, limits)), (peaks, limits)
        assert budget.oversize == 0 and budget.overshoot <= 2  # first batch per worker
        # ... at their true size, and the budget was what stopped the workers
        most = sum(_fits(budget, batch_bytes))
        assert budget.peak_in_flight_batches * batch_bytes <= budget.max_bytes, budget
        assert budget.peak_in_flight_batches == most, (most, budget)
        growths.append(real.peak - tiny.peak)
        print(
            f"\nstreambuf 720p: max_bytes {MAX_BYTES / MIB:.0f} MiB, credits "
            f"{budget.max_bytes / MIB:.0f} MiB, peak in flight "
            f"{budget.peak_in_flight_bytes / MIB:.0f} MiB ({budget.peak_in_flight_batches} "
            f"batches), held {budget.peak_batch_bytes_held / MIB:.0f} MiB, growth "
            f"{growths[-1] / MIB:.0f} MiB (rule {rule / MIB:.0f} MiB), /dev/shm peak "
            f"{real.shm_peak / MIB:.0f} MiB"
        )
        if growths[-1] <= rule:
            break
    assert min(growths) <= rule
