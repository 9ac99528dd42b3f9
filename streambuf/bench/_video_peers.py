"""The peers of the video benchmarks: what a user writes today to get clips into a loop.

Module level, so DataLoader workers pickle them. The PyAV ones decode with one FFmpeg
thread per decoder and convert exactly as streambuf does (one reused swscale context per
open, one thread, rgb24 at the output size), so the frames are identical and the
conversion costs the same: the comparisons measure what differs (opens, seeks, frames
decoded, and how the work is spread).

* ``SeekPerClip``: a map-style Dataset, item = one clip. ``__getitem__`` opens the file,
  seeks to the keyframe at or before the clip's first frame (``container.seek(pts,
  backward=True, any_frame=False)``) and decodes forward to the clip's last frame. This is
  what users write (torchcodec's samplers decode the same way), and the strongest PyAV
  peer.
* ``FromStart``: the same, without the seek: decode from the start of the file up to the
  clip. A strawman, kept only as a footnote row.
* ``TorchcodecVideos``: torchcodec's ``VideoDecoder`` + ``samplers.clips_at_random_indices``,
  item = one video (its clips decoded with one decoder), resized to the output size
  (decoder-native ``torchcodec.transforms.Resize`` where this torchcodec has it, else
  ``torch.nn.functional.interpolate``).
* ``plain_windows`` / ``PlainWindows``: a plain loop over every frame, cut into clips
  (the decode-overhead comparison).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

__all__ = [
    "FromStart",
    "PlainWindows",
    "SeekPerClip",
    "TorchcodecVideos",
    "plain_decode_windows",
    "plain_windows",
    "torchcodec_resize_mode",
]

Clip = tuple[str, list[int], list[int]]  # (path, frame indices, their pts in stream units)


def _open(path: str) -> tuple[Any, Any, Any]:
    import av
    from av.video.reformatter import VideoReformatter

    container = av.open(path)
    stream = container.streams.video[0]
    stream.codec_context.thread_count = 1
    return container, stream, VideoReformatter()


def _rgb(sws: Any, frame: Any, size: int) -> np.ndarray:
    out: np.ndarray = sws.reformat(
        frame, format="rgb24", width=size, height=size, threads=1
    ).to_ndarray()
    return out


def _tchw(frames: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()


class SeekPerClip(Dataset[torch.Tensor]):
    """Item ``i`` = clip ``i``: open, seek to its keyframe, decode forward (module docstring)."""

    seek = True

    def __init__(self, clips: Sequence[Clip], size: int) -> None:
        self.clips = list(clips)
        self.size = size

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> torch.Tensor:
        path, idx, pts = self.clips[i]
        wanted = {p: t for t, p in enumerate(pts)}
        got: list[np.ndarray | None] = [None] * len(idx)
        left = len(set(pts))
        container, stream, sws = _open(path)
        with container:
            if self.seek:
                container.seek(min(pts), stream=stream, backward=True, any_frame=False)
            for frame in container.decode(stream):
                if frame.pts in wanted:
                    rgb = _rgb(sws, frame, self.size)
                    for t, p in enumerate(pts):  # a clip may repeat a frame (policies)
                        if p == frame.pts:
                            got[t] = rgb
                    left -= 1
                    if left == 0:
                        break
        if any(g is None for g in got):
            raise RuntimeError(f"{path}: frames {idx} did not all come out of the decoder")
        return _tchw([g for g in got if g is not None])


class FromStart(SeekPerClip):
    """The strawman: decode from the start of the file up to the clip (no seek)."""

    seek = False


def torchcodec_resize_mode() -> str:
    """How ``TorchcodecVideos`` resizes with the torchcodec installed here."""
    from torchcodec.decoders import VideoDecoder

    params = inspect.signature(VideoDecoder).parameters
    try:
        from torchcodec.transforms import Resize  # noqa: F401
    except ImportError:
        return "torch.nn.functional.interpolate"
    return "decoder-native Resize" if "transforms" in params else "torch.nn.functional.interpolate"


class TorchcodecVideos(Dataset[torch.Tensor]):
    """Item ``i`` = video ``i``: its ``clips_per_video`` random clips, ``(K, T, C, S, S)``."""

    def __init__(
        self, paths: Sequence[str], size: int, *, clips_per_video: int, frames_per_clip: int
    ) -> None:
        self.paths, self.size = list(paths), size
        self.clips_per_video, self.frames_per_clip = clips_per_video, frames_per_clip

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        from torchcodec.decoders import VideoDecoder
        from torchcodec.samplers import clips_at_random_indices

        kwargs: dict[str, Any] = {"seek_mode": "approximate", "num_ffmpeg_threads": 1}
        native = torchcodec_resize_mode() == "decoder-native Resize"
        if native:
            from torchcodec.transforms import Resize

            kwargs["transforms"] = [Resize(size=(self.size, self.size))]
        decoder = VideoDecoder(self.paths[i], **kwargs)
        batch = clips_at_random_indices(
            decoder, num_clips=self.clips_per_video, num_frames_per_clip=self.frames_per_clip
        )
        data = batch.data  # (K, T, C, H, W) uint8
        if native:
            return data.contiguous()
        k, t, c, h, w = data.shape
        flat = data.reshape(k * t, c, h, w).float()
        small = torch.nn.functional.interpolate(
            flat, size=(self.size, self.size), mode="bilinear", antialias=True
        )
        return small.round_().clamp_(0, 255).to(torch.uint8).reshape(k, t, c, self.size, self.size)


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
                    yield _tchw(window)
                    window = []
            if window:
                window += [window[-1]] * (frames_per_clip - len(window))
                yield _tchw(window)


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
