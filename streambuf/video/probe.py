"""Open a video with PyAV and index its frames from packet timestamps (no decoding).

``probe(source)`` returns a ``VideoInfo``: every frame's real pts (sorted into
presentation order, so B-frames are handled), keyframe flags, frame durations, size and
an average fps. ``decode_clips`` builds the same index on the container it then decodes.

Invariants:

* Frame ``i`` is the ``i``-th frame in presentation order; ``pts_seconds`` is strictly
  increasing and equals ``pts * time_base`` exactly (correctly rounded), never i / fps.
* Frame ``i`` is displayed during ``[pts_seconds[i], pts_seconds[i] + frame_duration_seconds[i])``;
  consecutive intervals touch, and the last ends at ``end_seconds``.
* An index that covers clearly less than what the stream declares (fewer frames than the
  header counts, or ending well before the declared duration) is an error: a demuxer that
  lost sync in a corrupt or truncated file stops silently, and a silently shorter video
  would be a silent failure.
* Containers are always closed (with-statement), also on errors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import IO, Any, Union

import numpy as np

from ..errors import VideoError

__all__ = ["VideoInfo", "VideoSource", "probe", "source_name"]

VideoSource = Union[str, "os.PathLike[str]", IO[bytes]]

# A declared duration may exceed the indexed one by this much (plus two frames) before the
# file is called truncated: containers round durations and may count a trailing gap.
_DURATION_SLACK_S = 0.5


def _import_av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise ImportError("streambuf.video needs PyAV: pip install streambuf[video]") from exc
    return av


def source_name(source: VideoSource) -> str:
    """A name for messages: the path, or a file object's ``name`` (else its repr)."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return str(name) if name is not None else repr(source)


@dataclass(frozen=True, eq=False)
class VideoInfo:
    """The frame index of one video stream (see the module invariants).

    Attributes:
        source: name of the file, for messages.
        pts: frame pts in ``time_base`` units, presentation order (int64).
        time_base: the stream's time base (seconds per pts unit).
        pts_seconds: frame pts in seconds (float64).
        frame_duration_seconds: how long each frame is displayed (float64).
        is_keyframe: whether each frame starts a decodable run (bool).
        width, height: coded frame size in pixels.
        codec: the decoder's name, e.g. ``"h264"``.
        average_fps: ``num_frames / (end_seconds - begin_seconds)``.
    """

    source: str
    pts: np.ndarray
    time_base: Fraction
    pts_seconds: np.ndarray
    frame_duration_seconds: np.ndarray
    is_keyframe: np.ndarray
    width: int
    height: int
    codec: str
    average_fps: float
    _key_before: np.ndarray = field(repr=False)

    @property
    def num_frames(self) -> int:
        return int(self.pts.shape[0])

    @property
    def begin_seconds(self) -> float:
        """The first frame's pts (videos need not start at 0)."""
        return float(self.pts_seconds[0]) if self.num_frames else 0.0

    @property
    def end_seconds(self) -> float:
        """When the last frame stops being displayed."""
        if not self.num_frames:
            return 0.0
        return float(self.pts_seconds[-1] + self.frame_duration_seconds[-1])

    @property
    def duration_seconds(self) -> float:
        return self.end_seconds - self.begin_seconds

    def frame_at(self, seconds: np.ndarray) -> np.ndarray:
        """Index of the frame displayed at each time (times before the first frame map to
        frame 0, times past the end to the last frame)."""
        idx = np.searchsorted(self.pts_seconds, seconds, side="right") - 1
        return np.clip(idx, 0, max(self.num_frames - 1, 0)).astype(np.int64)

    def keyframe_before(self, index: int) -> int:
        """The last keyframe at or before frame ``index`` (0 if none): where to seek."""
        return int(self._key_before[index])

    @classmethod
    def from_pts(
        cls,
        pts: Sequence[int] | np.ndarray,
        /,
        *,
        time_base: Fraction,
        is_keyframe: Sequence[bool] | np.ndarray | None = None,
        last_duration: int | None = None,
        width: int = 0,
        height: int = 0,
        codec: str = "",
        source: str = "<pts>",
    ) -> VideoInfo:
        """Build the index from frame pts in any order (decode order is fine).

        ``is_keyframe`` defaults to "only the first frame"; ``last_duration`` (pts units)
        defaults to the median frame duration. Raises ``ValueError`` for no frames or
        repeated pts.
        """
        pts_in = np.asarray(pts, dtype=np.int64)
        if pts_in.ndim != 1 or pts_in.shape[0] == 0:
            raise ValueError("pts must be a non-empty 1-D sequence of ints")
        order = np.argsort(pts_in, kind="stable")
        pts_arr = pts_in[order]
        if np.any(np.diff(pts_arr) <= 0):
            raise ValueError("frames with equal pts cannot be indexed")
        if is_keyframe is None:
            keys = np.zeros(len(pts_arr), dtype=bool)
            keys[0] = True
        else:
            keys = np.asarray(is_keyframe, dtype=bool)[order]
        tb = Fraction(time_base)
        if np.any(np.abs(pts_arr) * tb.numerator >= 2**53):
            pts_s = np.asarray([float(int(p) * tb) for p in pts_arr], dtype=np.float64)
        else:  # (p * num) / den with p * num exact in float64: one correctly rounded division
            pts_s = pts_arr.astype(np.float64) * tb.numerator / tb.denominator
        dur = np.empty_like(pts_s)
        dur[:-1] = np.diff(pts_s)
        if last_duration:
            dur[-1] = float(last_duration * tb)
        else:
            dur[-1] = float(np.median(dur[:-1])) if len(pts_s) > 1 else 0.0
        span = float(pts_s[-1] + dur[-1] - pts_s[0])
        fps = len(pts_s) / span if span > 0 else 0.0
        key_before = np.maximum.accumulate(np.where(keys, np.arange(len(keys)), 0))
        return cls(
            source=source,
            pts=pts_arr,
            time_base=tb,
            pts_seconds=pts_s,
            frame_duration_seconds=dur,
            is_keyframe=keys,
            width=width,
            height=height,
            codec=codec,
            average_fps=fps,
            _key_before=key_before,
        )


@contextmanager
def open_video(
    source: VideoSource, *, name: str | None = None, hwaccel: Any = None
) -> Iterator[tuple[Any, Any]]:
    """Open ``source`` and yield ``(container, first video stream)``; always closes.

    ``name`` is used in messages (default: ``source_name(source)``); ``hwaccel``: PyAV's
    ``HWAccel`` to decode with (``streambuf.video.gpu``), None: software.

    Raises:
        VideoError: stage "video.open" when the file cannot be opened or has no video.
    """
    av = _import_av()
    name = name or source_name(source)
    if not isinstance(source, str | os.PathLike) and hasattr(source, "seek"):
        source.seek(0)  # a file object probed before must be read from its start again
    try:
        target = os.fspath(source) if isinstance(source, os.PathLike) else source
        container = av.open(target) if hwaccel is None else av.open(target, hwaccel=hwaccel)
    except Exception as exc:  # anything failing here means "cannot open this file"
        raise VideoError(
            f"cannot open video: {type(exc).__name__}: {exc}", stage="video.open", source=name
        ) from exc
    with container:
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams}) or ["none"]
            raise VideoError(
                f"no video stream (streams: {', '.join(kinds)})", stage="video.open", source=name
            )
        yield container, container.streams.video[0]


def build_index(container: Any, stream: Any, name: str) -> VideoInfo:
    """Demux every packet of ``stream`` (no decoding) into a ``VideoInfo``.

    Leaves the container at its end; seek before decoding.
    """
    av = _import_av()
    pts: list[int] = []
    keys: list[bool] = []
    last_pts, last_duration = None, 0  # the duration of the latest frame is all we need
    untimed = 0
    try:
        for packet in container.demux(stream):
            if packet.size == 0:  # the flush packet demux yields at the end
                continue
            p = packet.pts if packet.pts is not None else packet.dts
            if p is None:
                untimed += 1
                continue
            pts.append(int(p))
            keys.append(bool(packet.is_keyframe))
            if last_pts is None or p > last_pts:
                last_pts, last_duration = int(p), int(packet.duration or 0)
    except av.FFmpegError as exc:
        raise VideoError(
            f"cannot read packets: {type(exc).__name__}: {exc}", stage="video.open", source=name
        ) from exc
    if untimed:
        raise VideoError(
            f"{untimed} packets carry no timestamp; remux the file "
            "(e.g. ffmpeg -i in -c copy out.mp4)",
            stage="video.open",
            source=name,
        )
    if not pts:
        raise VideoError("the video stream has no frames", stage="video.open", source=name)
    if not last_duration and len(pts) == 1 and stream.guessed_rate:  # nothing else to go on
        last_duration = round(1 / (stream.guessed_rate * Fraction(stream.time_base)))
    try:
        info = VideoInfo.from_pts(
            pts,
            time_base=Fraction(stream.time_base),
            is_keyframe=keys,
            last_duration=last_duration,
            source=name,
            width=int(stream.codec_context.width),
            height=int(stream.codec_context.height),
            codec=str(stream.codec_context.name),
        )
    except ValueError as exc:
        raise VideoError(f"cannot index frames: {exc}", stage="video.open", source=name) from exc
    _check_coverage(container, stream, info, name)
    return info


def _declared_seconds(container: Any, stream: Any) -> float | None:
    if stream.duration:
        return float(stream.duration * stream.time_base)
    tag = stream.metadata.get("DURATION")  # matroska writes one per track
    if tag:
        try:
            h, m, s = tag.split(":")
            return int(h) * 3600 + int(m) * 60 + float(s)
        except ValueError:
            return None
    if len(container.streams) == 1 and container.duration:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _check_coverage(container: Any, stream: Any, info: VideoInfo, name: str) -> None:
    n, span = info.num_frames, info.duration_seconds
    frame_s = float(np.median(info.frame_duration_seconds))
    declared_frames = int(stream.frames or 0)
    if declared_frames and n < declared_frames:
        raise VideoError(
            f"found {n} of the {declared_frames} frames the header declares: "
            "file truncated or corrupt",
            stage="video.open",
            source=name,
        )
    declared = _declared_seconds(container, stream)
    if declared is not None and span + 2 * frame_s + _DURATION_SLACK_S < declared:
        raise VideoError(
            f"frames cover {span:.3f} s of the {declared:.3f} s the header "
            "declares: file truncated or corrupt",
            stage="video.open",
            source=name,
        )


def probe(source: VideoSource, /) -> VideoInfo:
    """Index the first video stream of ``source`` (a path or seekable binary file object).

    Raises:
        VideoError: stage "video.open" for unreadable, truncated or video-less files.
        ImportError: PyAV is missing (``pip install streambuf[video]``).
    """
    name = source_name(source)
    with open_video(source) as (container, stream):
        return build_index(container, stream, name)
