"""Synthetic videos for the video and GPU benchmarks (PyAV + libx264), deterministic.

A frame is a window panning over a fixed noise texture, plus a moving bright block and a
frame-dependent tint: motion the encoder can predict, texture it must code, so decoding
costs roughly what natural video of the same size does. ``distinct`` files are encoded
and the rest are byte copies (encoding is the slow part; a decoder never sees the copy).
"""

from __future__ import annotations

import fractions
import shutil
from pathlib import Path

import numpy as np

__all__ = ["make_videos"]


def _texture(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(height // 4 + 2, width // 4 + 2, 3), dtype=np.uint8)
    big = np.repeat(np.repeat(small, 4, axis=0), 4, axis=1)  # 4x4 blocks: codable texture
    return np.concatenate([big, big], axis=1)[: height + 8, : 2 * width]


def write_video(
    path: Path,
    *,
    seconds: float,
    fps: int,
    width: int,
    height: int,
    keyint: int,
    seed: int = 0,
    preset: str = "veryfast",
) -> Path:
    """Encode one H.264 mp4 (yuv420p, 2 B-frames, a keyframe every ``keyint`` frames)."""
    from ._deps import require

    av = require("av", purpose="the video benchmarks (PyAV encodes their test videos)")
    tex = _texture(width, height, seed)
    frames = round(seconds * fps)
    with av.open(str(path), "w") as out:
        stream = out.add_stream(
            "libx264",
            rate=fps,
            options={
                "preset": preset,
                "x264-params": f"keyint={keyint}:min-keyint={keyint}:scenecut=0:bframes=2",
            },
        )
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            x = (i * 3) % width
            img = tex[:height, x : x + width].copy()
            img[..., 0] = img[..., 0] // 2 + (i * 5) % 128
            bx = (i * 7) % max(width - 32, 1)
            img[height // 3 : height // 3 + 32, bx : bx + 32] = 255
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = i
            frame.time_base = fractions.Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def make_videos(
    folder: Path,
    *,
    count: int,
    distinct: int,
    seconds: float,
    fps: int,
    width: int,
    height: int,
    keyint: int,
    prefix: str = "video",
    preset: str = "veryfast",
) -> list[str]:
    """``count`` video files in ``folder`` (``distinct`` encoded, the rest copies)."""
    folder.mkdir(parents=True, exist_ok=True)
    made = [
        write_video(
            folder / f"{prefix}-src{k}.mp4",
            seconds=seconds,
            fps=fps,
            width=width,
            height=height,
            keyint=keyint,
            seed=k,
            preset=preset,
        )
        for k in range(min(distinct, count))
    ]
    paths = []
    for i in range(count):
        dst = folder / f"{prefix}{i:03d}.mp4"
        shutil.copyfile(made[i % len(made)], dst)
        paths.append(str(dst))
    for p in made:
        p.unlink()
    return paths
