"""Decode overhead: the same frames through a plain PyAV loop and through ``video.clips``.

Every frame of each video, cut into ``frames_per_clip``-frame TCHW clips, decoded with
one FFmpeg thread and converted identically, on the same cores:

* **one core**: this process pinned to one CPU, the pipeline iterated in-process with
  one lane thread, against the plain loop;
* **all cores**: plain loops in ``DataLoader(num_workers=workers)`` workers against
  ``Loader(num_workers=workers)``; both move the batches to the main process. A pool of
  plain loops that moves nothing is recorded beside them (the cost of the transfer).

Rates are frames/s of interleaved, rotated repeats; ``overhead`` = plain / streambuf - 1
(extra time per frame).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from ._video_peers import PlainWindows, plain_decode_windows

__all__ = ["decode_overhead", "timed_rates"]


def timed_rates(variants: dict[str, Callable[[], int]], repeats: int) -> dict[str, list[float]]:
    """Units/s of each variant (each returns the units it delivered), interleaved and
    rotated so that no variant always goes first."""
    names = list(variants)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for k in range(len(names)):
            name = names[(k + r) % len(names)]
            t0 = time.perf_counter()
            n = variants[name]()
            rates[name].append(n / (time.perf_counter() - t0))
    return rates


def _pipeline_frames(paths: list[str], fpc: int, size: int) -> int:
    import streambuf.video as sv

    pipe = sv.clips(
        paths,
        sampler=sv.every_frame_windows(fpc),
        width=size,
        height=size,
        shuffle_videos=False,
        threads=1,  # one core: one decoding thread, as the plain loop
    )
    return sum(int(c.data.shape[0]) for c in pipe)


def _loader_frames(paths: list[str], fpc: int, size: int, batch: int, workers: int) -> int:
    import streambuf as sb
    import streambuf.video as sv

    pipe = sv.clips(
        paths, sampler=sv.every_frame_windows(fpc), width=size, height=size, shuffle_videos=False
    ).batch(batch)
    with sb.Loader(pipe, num_workers=workers, max_batches=8, max_bytes="512MiB") as loader:
        return sum(int(b.data.shape[0] * b.data.shape[1]) for b in loader)


def _pool_frames(paths: list[str], fpc: int, size: int, workers: int) -> int:
    parts = [paths[w::workers] for w in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return sum(pool.starmap(plain_decode_windows, [(p, fpc, size) for p in parts]))


def _plain_loader_frames(paths: list[str], fpc: int, size: int, batch: int, workers: int) -> int:
    dl = DataLoader(PlainWindows(paths, fpc, size), batch_size=batch, num_workers=workers)
    return sum(int(b.shape[0] * b.shape[1]) for b in dl)


def decode_overhead(
    paths: list[str], *, frames_per_clip: int, size: int, batch: int, workers: int, repeats: int
) -> dict[str, Any]:
    """Both comparisons (module docstring); frames/s per repeat and medians."""
    fpc = frames_per_clip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no hidden intra-op threads on either side
    cpus = sorted(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {cpus[-1]})  # this thread; threads made now inherit it
        try:
            one = timed_rates(
                {
                    "plain": lambda: plain_decode_windows(paths, fpc, size),
                    "streambuf": lambda: _pipeline_frames(paths, fpc, size),
                },
                repeats,
            )
        finally:
            os.sched_setaffinity(0, cpus)
        multi = timed_rates(
            {
                "plain": lambda: _plain_loader_frames(paths, fpc, size, batch, workers),
                "streambuf": lambda: _loader_frames(paths, fpc, size, batch, workers),
                "pool": lambda: _pool_frames(paths, fpc, size, workers),
            },
            repeats,
        )
    finally:
        torch.set_num_threads(threads)
    out = {}
    for key, rates, label in (
        ("one_core", one, "1 core: plain loop vs clips() in-process"),
        ("all_cores", multi, f"{len(cpus)} cores: DataLoader of plain loops vs Loader"),
    ):
        p, s = statistics.median(rates["plain"]), statistics.median(rates["streambuf"])
        out[key] = {
            "label": label,
            "plain_frames_per_s": rates["plain"],
            "streambuf_frames_per_s": rates["streambuf"],
            "plain_median": p,
            "streambuf_median": s,
            "overhead": p / s - 1.0,
        }
        if "pool" in rates:
            out[key]["pool_no_transfer_median"] = statistics.median(rates["pool"])
    return out
