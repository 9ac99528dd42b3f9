"""Decode sampled clips from one video with PyAV: ``Clip`` and ``decode_clips``.

How a video is read (docs/video.md):

1. open (path or seekable binary file object) and index the frames from packet pts, no
   decoding (``probe.build_index``);
2. ask the sampler for clips (frame indices), with a generator seeded by
   ``(seed, epoch, index)``;
3. decode the union of the requested frames in presentation order, **forward only**: the
   decoder seeks only when the next requested frame's keyframe lies beyond the frame that
   decoding forward would produce next (so it never decodes frames a seek could skip,
   never seeks where it could just continue, and never goes back); each frame
   is decoded and converted (swscale: resize + rgb24) once however many clips share it,
   by one swscale context per call on one thread (PyAV's default builds a context per
   frame with a thread per CPU: twice the time, and threads created in every worker);
4. build each clip in place: its output tensor (already in ``layout``) is allocated when its
   first frame is decoded and each converted frame is copied into every pending clip that
   uses it, then dropped; a clip is yielded as soon as its last frame is in. So what a
   call holds beyond the yielded clips is the clips in progress plus one frame (no frame
   list, no stacked copy, no layout copy).

Clips are therefore yielded in order of their last frame (ties: sampler order), which for
regular and window samplers is the sampler's order; ``Clip.clip_index`` is always the
sampler's position. The container is closed when the generator finishes, fails or is
closed early.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import default_collate_fn_map

from .._failures import FailurePolicy, OnError
from ..errors import VideoError
from .audio import AudioMissing, AudioSamples, AudioSpec, audio_spec, clip_audio
from .gpu import check_decoder, hwaccel, to_rgb
from .probe import VideoInfo, VideoSource, _import_av, build_index, open_video, source_name
from .samplers import ClipSampler, sampler_rng

__all__ = ["Clip", "DecodeStats", "Layout", "decode_clips"]

Layout = Literal["TCHW", "THWC", "CTHW"]
_LAYOUTS = ("TCHW", "THWC", "CTHW")


@dataclass
class Clip:
    """Frames of one clip, or (after ``default_collate``) a batch of clips.

    Attributes:
        data: uint8, contiguous, RGB; ``layout`` "TCHW" (default), "THWC" or "CTHW"; a
            batch adds a leading dimension.
        pts_seconds: float64 ``(T,)``: each frame's real pts (never index / fps).
        duration_seconds: float64 ``(T,)``: how long each frame is displayed.
        source: the video's name (a batch: a list of names).
        clip_index: the clip's position in the sampler's list (a batch: int64 tensor).
        audio: the audio of the clip's span (``AudioSamples``) when asked for with
            ``audio=``, else None (a batch: one ``AudioSamples``, padded: ``lengths``).
    """

    data: torch.Tensor
    pts_seconds: torch.Tensor
    duration_seconds: torch.Tensor
    source: str | list[str]
    clip_index: int | torch.Tensor
    audio: AudioSamples | None = None

    @classmethod
    def collate(cls, batch: list[Clip], *, collate_fn_map: Any = None) -> Clip:
        """Stack clips of equal shape into one batched ``Clip`` (registered with
        ``default_collate``, so a DataLoader batches clips without a custom collate_fn;
        tensors are stacked by ``default_collate`` itself, in shared memory in workers)."""
        return cls(
            data=default_collate([c.data for c in batch]),
            pts_seconds=default_collate([c.pts_seconds for c in batch]),
            duration_seconds=default_collate([c.duration_seconds for c in batch]),
            source=[
                s for c in batch for s in ([c.source] if isinstance(c.source, str) else c.source)
            ],
            clip_index=default_collate([c.clip_index for c in batch]),
            audio=_collate_audio(batch),
        )


def _collate_audio(batch: list[Clip]) -> AudioSamples | None:
    audio = [c.audio for c in batch]
    if all(a is None for a in audio):
        return None
    if any(a is None for a in audio):
        raise ValueError("cannot batch clips with audio and clips without (audio=None)")
    return AudioSamples.collate(audio)  # type: ignore[arg-type]


default_collate_fn_map[Clip] = Clip.collate


@dataclass
class DecodeStats:
    """Counters of ``decode_clips``, owned by the caller (pass one object to many calls
    to add them up; one thread at a time). ``snapshot()`` returns a copy.

    Attributes:
        videos: videos opened and indexed.
        clips: clips yielded.
        frames_decoded: frames out of the decoder (including ones decoded only to reach a
            requested frame).
        frames_converted: frames converted to RGB (each requested frame once).
        seeks: seeks, including the one that starts decoding each video.
        failures: videos that failed (raised or skipped).
        frames_skippable: packets sent with ``skip_frame="NONREF"`` (frames nothing
            needs; the decoder drops those no other frame references).
        audio_missing: clips yielded whose audio is flagged ``missing`` (silence for a
            video without audio, or audio that ends before the clip or starts after it).
    """

    videos: int = 0
    clips: int = 0
    frames_decoded: int = 0
    frames_converted: int = 0
    seeks: int = 0
    failures: int = 0
    frames_skippable: int = 0
    audio_missing: int = 0

    def snapshot(self) -> DecodeStats:
        return replace(self)


class _Missing(Exception):
    """A frame in the index never came out of the decoder (corrupt or truncated data)."""


def decode_clips(
    source: VideoSource,
    /,
    *,
    sampler: ClipSampler,
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
    width: int | None = None,
    height: int | None = None,
    layout: Layout = "TCHW",
    threads: int = 1,
    on_error: OnError = "raise",
    max_failures: int | None = None,
    policy: FailurePolicy | None = None,
    stats: DecodeStats | None = None,
    name: str | None = None,
    keep: Callable[[int], bool] | None = None,
    audio: bool | dict[str, int | None] | AudioSpec | None = None,
    audio_missing: AudioMissing = "raise",
    decoder: str = "cpu",
) -> Generator[Clip, None, None]:
    """Yield the clips ``sampler`` picks from ``source``, decoded with PyAV.

    Args:
        source: a path, or a seekable binary file object (its ``name`` is used in messages).
        sampler: e.g. ``clips_at_random_indices(num_clips=2, num_frames_per_clip=16)``.
        seed, epoch, index: seed the sampler's generator (``sampler_rng``); the clips are
            a function of these, the sampler and the file.
        width, height: output size (swscale); one alone keeps the aspect ratio; None: as
            coded.
        layout: "TCHW" (default), "THWC" or "CTHW".
        threads: FFmpeg decoder threads (0: FFmpeg decides). Keep 1 in DataLoader workers.
        on_error, max_failures: "raise" (default) or "skip" a failing video with a counted,
            logged warning, at most ``max_failures`` times; ignored when ``policy`` is given.
        policy: a ``FailurePolicy`` shared across calls (e.g. one per pipeline stage), so
            ``max_failures`` counts across videos.
        stats: counters to update (see ``DecodeStats``).
        name: the video's name in messages and ``Clip.source`` (default: the path, or
            the file object's ``name``); pass a redacted URL for remote files.
        keep: decode only the clips whose sampler position ``ci`` has ``keep(ci)`` (a
            slot's share of a video, or the clips a resume still owes); their frames are
            decoded as if the others were not asked for, and ``clip_index`` is still
            the position in the sampler's full list.
        audio: True (the stream's rate and channels) or ``{"sample_rate": 16000,
            "channels": 1}``: each clip carries ``Clip.audio``, the samples of its span
            (``streambuf.video.audio``); None: frames only.
        audio_missing: a video without an audio stream: "raise" (``VideoError``, stage
            "video.audio") or "silence" (zeros flagged ``missing``; needs a sample_rate).
        decoder: "cpu" (FFmpeg's software decoder, swscale; default) or "cuda" /
            "cuda:N": NVDEC through PyAV's hwaccel, converted and resized on the device,
            clips returned on it (``streambuf.video.gpu``).

    Yields:
        ``Clip`` objects (order: see the module docstring).

    Raises:
        VideoError: stage "video.open" (unreadable, truncated, no video stream),
            "video.sample" (the sampler cannot place its clips, e.g. a too-short video) or
            "video.decode" (corrupt data), naming the file; with "skip" the video's
            remaining clips are dropped instead.
        TooManyFailures: more than ``max_failures`` videos were skipped.
        ValueError: bad arguments (raised here, before anything is opened), including
            ``decoder="cuda"`` without a CUDA device or PyAV's cuda hwaccel.
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {_LAYOUTS}")
    for arg, value in (("width", width), ("height", height)):
        if value is not None and value <= 0:
            raise ValueError(f"{arg}={value} must be > 0, or None for the coded size")
    if threads < 0:
        raise ValueError(f"threads={threads} must be >= 0 (0: FFmpeg decides)")
    if not callable(getattr(sampler, "sample", None)):
        raise TypeError(
            f"sampler={sampler!r} has no sample(info, rng) method; use e.g. "
            "streambuf.video.clips_at_random_indices(...)"
        )
    spec = audio if isinstance(audio, AudioSpec) else audio_spec(audio, audio_missing)
    device = check_decoder(decoder)
    if policy is None:
        policy = FailurePolicy(on_error, max_failures, stage="video")
    _import_av()  # fail here, not on first next(), when PyAV is missing
    return _decode(
        source,
        sampler,
        (seed, epoch, index),
        (width, height),
        layout,
        threads,
        policy,
        stats if stats is not None else DecodeStats(),
        name,
        keep,
        spec,
        device,
    )


def _decode(
    source: VideoSource,
    sampler: ClipSampler,
    key: tuple[int, int, int],
    size: tuple[int | None, int | None],
    layout: Layout,
    threads: int,
    policy: FailurePolicy,
    stats: DecodeStats,
    name: str | None,
    keep: Callable[[int], bool] | None,
    spec: AudioSpec | None,
    device: torch.device | None = None,
) -> Generator[Clip, None, None]:
    av = _import_av()
    name = name or source_name(source)
    accel = None if device is None else hwaccel(device)
    try:
        with open_video(source, name=name, hwaccel=accel) as (container, stream):
            info = build_index(container, stream, name)
            stats.videos += 1
            try:
                clips = sampler.sample(info, sampler_rng(*key))
            except ValueError as exc:
                raise VideoError(
                    f"cannot sample clips: {exc}", stage="video.sample", source=name
                ) from exc
            ctx = stream.codec_context
            ctx.thread_count = threads
            if threads != 1:
                ctx.thread_type = "AUTO"
            try:
                wanted = [ci for ci in range(len(clips)) if keep is None or keep(ci)]
                sound = None
                if spec is not None:  # decoded first: a clip carries it when yielded
                    spans = _spans(info, clips, range(len(clips)))
                    sound = clip_audio(container, spans, wanted, spec, name)
                yield from _emit(
                    container,
                    stream,
                    info,
                    clips,
                    wanted,
                    size,
                    layout,
                    name,
                    stats,
                    sound,
                    device,
                )
            except (av.FFmpegError, _Missing) as exc:
                raise VideoError(
                    f"cannot decode: {type(exc).__name__}: {exc}", stage="video.decode", source=name
                ) from exc
    except VideoError as err:
        stats.failures += 1
        policy.handle(err, source=name, error_type=VideoError)


def _spans(
    info: VideoInfo, clips: list[list[int]], wanted: Iterable[int]
) -> dict[int, tuple[float, float]]:
    """Each clip's span: its first frame's pts to its last frame's end."""
    pts, dur = info.pts_seconds, info.frame_duration_seconds
    return {
        ci: (float(pts[min(clips[ci])]), float(pts[max(clips[ci])] + dur[max(clips[ci])]))
        for ci in wanted
    }


def _output_size(info: VideoInfo, size: tuple[int | None, int | None]) -> dict[str, int]:
    width, height = size
    if width is None and height is None:
        return {}
    if width is None:
        assert height is not None
        width = max(1, round(height * info.width / info.height))
    elif height is None:
        height = max(1, round(width * info.height / info.width))
    return {"width": width, "height": height}


def _emit(
    container: Any,
    stream: Any,
    info: VideoInfo,
    clips: list[list[int]],
    wanted: list[int],
    size: tuple[int | None, int | None],
    layout: Layout,
    name: str,
    stats: DecodeStats,
    sound: dict[int, AudioSamples] | None = None,
    device: torch.device | None = None,
) -> Iterator[Clip]:
    kwargs = _output_size(info, size)
    convert = _converter(kwargs, name, device)
    slots: dict[int, list[tuple[int, int]]] = defaultdict(list)  # frame -> (clip, slot)
    for ci in wanted:
        for t, i in enumerate(clips[ci]):
            slots[i].append((ci, t))
    by_last: dict[int, list[int]] = defaultdict(list)
    for ci in wanted:
        by_last[max(clips[ci])].append(ci)
    pending: dict[int, torch.Tensor] = {}  # clip index -> its tensor, being filled
    for i, frame in _forward_frames(container, stream, info, sorted(slots), stats):
        rgb = convert(frame)
        stats.frames_converted += 1
        for ci, t in slots[i]:
            out = pending.get(ci)
            if out is None:
                out = pending[ci] = _alloc(len(clips[ci]), rgb.shape, layout, rgb.device)
            _put_frame(out, t, rgb, layout)
        del rgb, frame
        for ci in by_last.get(i, ()):
            stats.clips += 1  # counted when handed out, even if the consumer stops here
            idx = clips[ci]
            clip = Clip(
                data=pending.pop(ci),
                pts_seconds=torch.from_numpy(info.pts_seconds[idx]),
                duration_seconds=torch.from_numpy(info.frame_duration_seconds[idx]),
                source=name,
                clip_index=ci,
                audio=None if sound is None else sound.pop(ci),
            )
            if clip.audio is not None and clip.audio.missing:
                stats.audio_missing += 1
            yield clip


def _converter(
    size: dict[str, int], name: str, device: torch.device | None
) -> Callable[[Any], torch.Tensor]:
    """Frame -> RGB uint8 ``(H, W, 3)``: swscale on the CPU (one context reused for the
    whole video), or ``gpu.to_rgb`` on the device the frames were decoded on."""
    if device is not None:
        return lambda frame: to_rgb(frame, size, name)
    from av.video.reformatter import VideoReformatter

    sws = VideoReformatter()

    def swscale(frame: Any) -> torch.Tensor:
        converted = sws.reformat(frame, format="rgb24", threads=1, **size)
        return torch.from_numpy(converted.to_ndarray())  # HWC, a view of `converted`

    return swscale


def _alloc(frames: int, hwc: torch.Size, layout: Layout, device: torch.device) -> torch.Tensor:
    h, w, c = hwc
    shape = {"TCHW": (frames, c, h, w), "THWC": (frames, h, w, c), "CTHW": (c, frames, h, w)}
    return torch.empty(shape[layout], dtype=torch.uint8, device=device)


def _put_frame(out: torch.Tensor, t: int, rgb: torch.Tensor, layout: Layout) -> None:
    if layout == "THWC":
        out[t].copy_(rgb)
    elif layout == "TCHW":
        out[t].copy_(rgb.permute(2, 0, 1))
    else:
        out[:, t].copy_(rgb.permute(2, 0, 1))


class _Decoder:
    """Frames out of one stream, decoded packet by packet from a seek point.

    ``needed(i)`` says whether frame ``i`` (presentation index) may be skipped: packets
    of frames that are neither wanted nor reached yet are sent with
    ``skip_frame="NONREF"``, so the decoder drops them when nothing references them (B
    frames, typically) and decodes them otherwise; every other packet is decoded in full.
    Frames that do come out are exactly what a full decode gives (the skipped ones are
    never shown and never needed to build another).
    """

    def __init__(self, container: Any, stream: Any, info: VideoInfo, stats: DecodeStats) -> None:
        self.container, self.stream, self.info, self.stats = container, stream, info, stats
        self.index_of = {p: i for i, p in enumerate(info.pts.tolist())}
        self.ctx = stream.codec_context
        self.target = 0
        self.wanted: set[int] = set()
        self._frames: Iterator[Any] | None = None

    def seek(self, key: int) -> None:
        self.close()
        self.container.seek(
            int(self.info.pts[key]), stream=self.stream, backward=True, any_frame=False
        )
        self.stats.seeks += 1
        self._frames = self._run()

    def _run(self) -> Iterator[Any]:
        ctx, index_of = self.ctx, self.index_of
        try:
            for packet in self.container.demux(self.stream):
                i = index_of.get(packet.pts) if packet.pts is not None else None
                skip = i is not None and i < self.target and i not in self.wanted
                mode = "NONREF" if skip else "DEFAULT"
                if ctx.skip_frame != mode:
                    ctx.skip_frame = mode
                if skip:
                    self.stats.frames_skippable += 1
                yield from ctx.decode(packet)
        finally:
            if ctx.skip_frame != "DEFAULT":
                ctx.skip_frame = "DEFAULT"

    def next(self) -> Any:
        assert self._frames is not None
        return next(self._frames, None)

    def close(self) -> None:
        _close(self._frames)
        self._frames = None


def _forward_frames(
    container: Any, stream: Any, info: VideoInfo, wanted: list[int], stats: DecodeStats
) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, frame)`` for each index in ``wanted`` (sorted, unique), decoding
    forward and seeking only when the wanted frame's keyframe lies beyond the next frame
    the decoder would produce; packets of frames nothing needs are sent as skippable
    (``_Decoder``). Raises ``_Missing`` when a wanted frame does not come out."""
    dec = _Decoder(container, stream, info, stats)
    dec.wanted = set(wanted)
    last = -1  # index of the last frame out of the decoder
    fresh = False  # nothing decoded since the last seek
    started = False
    try:
        for target in wanted:
            dec.target = target
            key = info.keyframe_before(target)
            if not started or key > last + 1:
                dec.seek(key)
                started, fresh = True, True
            while True:
                frame = dec.next()
                if frame is None:
                    raise _Missing(
                        f"frame {target} (pts {info.pts_seconds[target]:.6f} s) "
                        "did not come out of the decoder before the end"
                    )
                stats.frames_decoded += 1
                pts = frame.pts if frame.pts is not None else frame.dts
                i = dec.index_of.get(pts) if pts is not None else None
                if i is None:  # untimed frame: decoders emit presentation order
                    i = key if fresh else last + 1
                if fresh and i > target:  # the seek landed past the keyframe we asked for
                    if key == 0:
                        raise _Missing(f"seeking for frame {target} landed at frame {i}")
                    key = 0
                    dec.seek(0)
                    continue
                fresh, last = False, i
                if i == target:
                    yield i, frame
                    break
                if i > target:
                    raise _Missing(
                        f"frame {target} (pts {info.pts_seconds[target]:.6f} s) "
                        "did not come out of the decoder"
                    )
    finally:
        dec.close()


def _close(frames: Iterator[Any] | None) -> None:
    close = getattr(frames, "close", None)
    if close is not None:
        close()
