"""Fixtures: small synthetic videos written with PyAV into a session temp dir.

Every frame is distinguishable: its red channel encodes the frame number, a bright block
moves one step per frame, and green/blue carry gradients (so a resize is visible). Files
are tiny (<= 64x48, <= 2.5 s) so the whole session builds them in a few seconds.
"""

from __future__ import annotations

import fractions
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")


@dataclass(frozen=True)
class VideoSpec:
    """How one fixture video is encoded."""

    name: str
    codec: str
    container: str
    width: int
    height: int
    num_frames: int
    fps: int = 24
    pix_fmt: str = "yuv420p"
    options: tuple[tuple[str, str], ...] = ()
    vfr: bool = False  # irregular pts gaps, time_base 1/1000


SPECS = [
    VideoSpec(
        "h264_bframes",
        "libx264",
        "mp4",
        64,
        48,
        60,
        options=(
            ("x264-params", "bframes=2:keyint=12:min-keyint=12:scenecut=0"),
            ("preset", "veryfast"),
        ),
    ),
    VideoSpec("mpeg4", "mpeg4", "mp4", 64, 48, 48, options=(("g", "12"), ("bf", "2"))),
    VideoSpec(
        "vp9",
        "libvpx-vp9",
        "webm",
        64,
        48,
        40,
        options=(("g", "12"), ("deadline", "realtime"), ("cpu-used", "8")),
    ),
    VideoSpec(
        "h264_vfr",
        "libx264",
        "mkv",
        64,
        48,
        50,
        vfr=True,
        options=(
            ("x264-params", "bframes=2:keyint=10:min-keyint=10:scenecut=0"),
            ("preset", "veryfast"),
        ),
    ),
    VideoSpec(
        "odd_size",
        "libx264",
        "mp4",
        63,
        35,
        30,
        pix_fmt="yuv444p",
        options=(("x264-params", "bframes=1:keyint=8:min-keyint=8:scenecut=0"),),
    ),
]


def frame_image(i: int, width: int, height: int) -> np.ndarray:
    """RGB image for frame ``i``: red = frame number, moving block, gradients."""
    img = np.zeros((height, width, 3), dtype=np.uint8)
    img[..., 0] = (i * 9) % 200 + 20
    img[..., 1] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    img[..., 2] = np.linspace(255, 0, height, dtype=np.uint8)[:, None]
    x = (i * 3) % max(width - 8, 1)
    img[height // 4 : height // 4 + 8, x : x + 8] = 255
    return img


def vfr_pts_ms(num_frames: int) -> list[int]:
    """Irregular, strictly increasing frame times in milliseconds."""
    gaps = [20, 50, 33, 90, 41, 17, 120, 33]
    pts, t = [], 0
    for i in range(num_frames):
        pts.append(t)
        t += gaps[i % len(gaps)]
    return pts


def write_video(path: Path, spec: VideoSpec) -> Path:
    with av.open(str(path), "w", format=None) as out:
        stream = out.add_stream(spec.codec, rate=spec.fps, options=dict(spec.options))
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, spec.pix_fmt
        if spec.vfr:
            stream.time_base = fractions.Fraction(1, 1000)
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
        pts_ms = vfr_pts_ms(spec.num_frames) if spec.vfr else None
        for i in range(spec.num_frames):
            frame = av.VideoFrame.from_ndarray(frame_image(i, spec.width, spec.height), "rgb24")
            frame = frame.reformat(format=spec.pix_fmt)
            if pts_ms is not None:
                frame.pts = pts_ms[i]
                frame.time_base = fractions.Fraction(1, 1000)
            else:
                frame.pts = i
                frame.time_base = fractions.Fraction(1, spec.fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def write_audio(path: Path, *, seconds: float = 1.0, codec: str = "aac") -> Path:
    rate = 44100
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        samples = int(seconds * rate)
        t = np.arange(samples) / rate
        wave = (np.sin(2 * np.pi * 440 * t) * 0.3).astype(np.float32)
        step = 1024
        for start in range(0, samples, step):
            chunk = wave[start : start + step][None, :]
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="mono")
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def naive_decode(path: Path, **to_ndarray_kwargs) -> tuple[list[np.ndarray], list[float]]:
    """Every frame in presentation order (rgb24 HWC) and its pts in seconds."""
    frames, pts = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24", **to_ndarray_kwargs))
            pts.append(float(frame.pts * stream.time_base))
    order = np.argsort(pts, kind="stable")
    return [frames[i] for i in order], [pts[i] for i in order]


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="session")
def videos(video_dir: Path) -> dict[str, Path]:
    """name -> path of every fixture video in SPECS."""
    return {s.name: write_video(video_dir / f"{s.name}.{s.container}", s) for s in SPECS}


@pytest.fixture(scope="session")
def reference(videos: dict[str, Path]) -> dict[str, tuple[list[np.ndarray], list[float]]]:
    """name -> naive full decode (frames, pts seconds)."""
    return {name: naive_decode(path) for name, path in videos.items()}


@pytest.fixture(params=[s.name for s in SPECS])
def video_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def naive():
    """The ``naive_decode`` function (tests do not import conftest)."""
    return naive_decode


@pytest.fixture(scope="session")
def writers():
    """``write_video``, ``write_audio`` and ``SPECS`` for tests that build their own files."""
    return write_video, write_audio, {s.name: s for s in SPECS}
