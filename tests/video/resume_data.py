"""Loader factories over videos for the checkpoint tests (module level: spawnable)."""

from __future__ import annotations

import streambuf as sb
from streambuf.video import clips_at_random_indices, clips_at_regular_indices


def video_loader(*, paths, workers=2, sampler="random", threads=2, equalize=None):
    if sampler == "random":
        s = clips_at_random_indices(
            num_clips=3, num_frames_per_clip=3, num_indices_between_frames=2
        )
    else:
        s = clips_at_regular_indices(num_clips=3, num_frames_per_clip=2)
    pipe = sb.video.clips(
        paths, sampler=s, width=32, height=24, threads=threads, seed=7, equalize=equalize
    ).shuffle(4)
    return sb.Loader(
        pipe.batch(2),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="32MiB",
        timeout_s=60,
    )
