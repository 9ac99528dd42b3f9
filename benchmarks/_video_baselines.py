"""The baselines of the video benchmark: a plain PyAV loop and a map-style Dataset.

Module level, so DataLoader workers and multiprocessing pools can pickle them. Both decode
with one FFmpeg thread per decoder and convert exactly as streambuf does (one reused
swscale context per video, one thread, rgb24 at the output size): the frames are
identical and the conversion costs the same, so the comparisons measure what differs
(the pipeline in (a); seeking and decoding once per video in (b)).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

__all__ = ["ReopenEachItem", "plain_decode_windows"]


def _open(path: str):  # type: ignore[no-untyped-def]
    import av
    from av.video.reformatter import VideoReformatter

    container = av.open(path)
    stream = container.streams.video[0]
    stream.codec_context.thread_count = 1
    return container, stream, VideoReformatter()


def _rgb(sws, frame, size: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    return sws.reformat(frame, format="rgb24", width=size, height=size, threads=1).to_ndarray()


def plain_windows(paths: Sequence[str], frames_per_clip: int, size: int) -> Iterator[torch.Tensor]:
    """The straightforward loop: decode every frame, convert, cut into TCHW clips (the
    last one padded by repeating, as ``every_frame_windows`` does)."""
    for path in paths:
        container, stream, sws = _open(path)
        with container:
            window: list[np.ndarray] = []
            for frame in container.decode(stream):
                window.append(_rgb(sws, frame, size))
                if len(window) == frames_per_clip:
                    yield torch.from_numpy(np.stack(window)).permute(0, 3, 1, 2).contiguous()
                    window = []
            if window:
                window += [window[-1]] * (frames_per_clip - len(window))
                yield torch.from_numpy(np.stack(window)).permute(0, 3, 1, 2).contiguous()


def plain_decode_windows(paths: Sequence[str], frames_per_clip: int, size: int) -> int:
    """Frames delivered by ``plain_windows`` over ``paths``."""
    return sum(int(c.shape[0]) for c in plain_windows(paths, frames_per_clip, size))


class PlainWindows(IterableDataset[torch.Tensor]):
    """``plain_windows`` as a DataLoader dataset: each worker decodes every n-th file."""

    def __init__(self, paths: Sequence[str], frames_per_clip: int, size: int) -> None:
        self.paths, self.frames_per_clip, self.size = list(paths), frames_per_clip, size

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        mine = self.paths if info is None else self.paths[info.id :: info.num_workers]
        return plain_windows(mine, self.frames_per_clip, self.size)


class ReopenEachItem(Dataset[torch.Tensor]):
    """Map-style baseline: item ``i`` is one clip; ``__getitem__`` opens the video and
    decodes from its start up to the clip's last frame, converting the clip's frames.

    ``items`` are ``(path, frame indices)``: the same clips streambuf's sampler draws, so
    both sides decode the same frames into identical tensors.
    """

    def __init__(self, items: Sequence[tuple[str, list[int]]], size: int) -> None:
        self.items = list(items)
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        path, idx = self.items[i]
        wanted = set(idx)
        last = max(idx)
        got: dict[int, np.ndarray] = {}
        container, stream, sws = _open(path)
        with container:
            for n, frame in enumerate(container.decode(stream)):  # presentation order
                if n in wanted:
                    got[n] = _rgb(sws, frame, self.size)
                if n >= last:
                    break
        return torch.from_numpy(np.stack([got[j] for j in idx])).permute(0, 3, 1, 2).contiguous()
