"""``decoder="cuda"`` (streambuf.video.gpu): what can run without a GPU runs here.

The device path is PyAV's hwaccel (NVDEC) plus a torch colour conversion and resize on
the frames' device. On a CPU the conversion runs on the same kind of planes (DLPack views
of nv12 / yuv420p frames) and is compared with swscale; the option is refused where it
is built when there is no CUDA device; a Loader refuses worker processes for such a
pipeline. The end-to-end test needs a CUDA device and is skipped, saying so, without one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

import streambuf as sb
from streambuf.errors import VideoError
from streambuf.video import clips, clips_at_random_indices, decode_clips
from streambuf.video.gpu import to_rgb, yuv420_to_rgb

av = pytest.importorskip("av")
from av.video.reformatter import ColorRange, Colorspace  # noqa: E402

SAMPLER = clips_at_random_indices(num_clips=2, num_frames_per_clip=4)


def _colourful(height: int = 48, width: int = 64) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    return np.stack([(xx * 4) % 256, (yy * 5) % 256, ((xx + yy) * 2) % 256], -1).astype(np.uint8)


def _diff(a: torch.Tensor | np.ndarray, b: np.ndarray) -> tuple[float, int]:
    d = np.abs(np.asarray(a, dtype=np.int64) - b.astype(np.int64))
    return float(d.mean()), int(d.max())


@pytest.mark.parametrize("fmt", ["nv12", "yuv420p"])
@pytest.mark.parametrize("full", [False, True], ids=["limited", "full"])
@pytest.mark.parametrize("space", ["601", "709"])
def test_conversion_matches_swscale_and_reads_matrix_and_range_from_the_frame(
    fmt: str, full: bool, space: str
) -> None:
    cs = Colorspace.ITU601 if space == "601" else Colorspace.ITU709
    rg = ColorRange.JPEG if full else ColorRange.MPEG
    frame = av.VideoFrame.from_ndarray(_colourful(), format="rgb24").reformat(
        format=fmt, dst_colorspace=cs, dst_color_range=rg
    )
    ref = frame.reformat(format="rgb24", src_colorspace=cs, src_color_range=rg).to_ndarray()
    out = to_rgb(frame, {}, "synthetic")
    assert out.dtype == torch.uint8 and tuple(out.shape) == ref.shape
    mean, worst = _diff(out, ref)
    assert mean <= 2.0 and worst <= 6, (mean, worst)  # rounding and chroma siting only
    # the same planes read with the other matrix or range are far off: the frame's own
    # colorspace and range were used, not a default
    y, *chroma = (torch.from_dlpack(p) for p in frame.planes)
    u, v = (chroma[0][..., 0], chroma[0][..., 1]) if fmt == "nv12" else chroma
    other = yuv420_to_rgb(y, u, v, matrix="709" if space == "601" else "601", full_range=full)
    swapped = yuv420_to_rgb(y, u, v, matrix=space, full_range=not full)
    assert _diff(other, ref)[0] > 2 * mean + 2
    assert _diff(swapped, ref)[0] > 2 * mean + 2


@pytest.mark.parametrize("fmt", ["nv12", "yuv420p"])
def test_odd_sizes_convert_like_swscale(fmt: str) -> None:
    """An odd-sized frame's chroma planes are half its size rounded up (yuv420p) or down
    (nv12, as NVDEC's are exported): the last row and column use the last sample."""
    frame = av.VideoFrame.from_ndarray(_colourful(35, 63), format="rgb24").reformat(format=fmt)
    ref = frame.reformat(format="rgb24").to_ndarray()
    out = to_rgb(frame, {}, "odd")
    assert tuple(out.shape) == (35, 63, 3)
    mean, worst = _diff(out, ref)
    assert mean <= 2.0 and worst <= 8, (mean, worst)


@pytest.mark.parametrize("size", [None, (32, 24), (96, 72)], ids=["coded", "shrink", "grow"])
def test_decoded_frames_convert_like_swscale(videos, size) -> None:
    """Frames decoded from a real H.264 file (yuv420p), and the same frames as nv12
    (what NVDEC gives): RGB within a few levels of swscale's, resized too."""
    kwargs = {} if size is None else {"width": size[0], "height": size[1]}
    with av.open(str(videos["h264_bframes"])) as container:
        frames = [f for _, f in zip(range(6), container.decode(video=0), strict=False)]
    for frame in frames:
        ref = frame.reformat(format="rgb24", **kwargs).to_ndarray().astype(np.int64)
        for f in (frame, frame.reformat(format="nv12")):
            out = to_rgb(f, kwargs, "h264_bframes")
            assert tuple(out.shape) == ref.shape
            d = np.abs(out.numpy().astype(np.int64) - ref)
            if size is None:  # the same pixels: rounding only (measured: max 3)
                assert d.max() <= 4, (f.format.name, d.max())
            else:  # another filter: the moving block's edges differ (measured: mean
                # 2.5-3.1, 99th percentile 9)
                assert d.mean() <= 4.0 and np.percentile(d, 99) <= 14, (f.format.name, size)


def test_a_format_it_cannot_convert_is_named(videos) -> None:
    with av.open(str(videos["odd_size"])) as container:  # yuv444p
        frame = next(container.decode(video=0))
    with pytest.raises(VideoError, match=r"this stream's are yuv444p: .*decoder='cpu'") as err:
        to_rgb(frame, {}, "odd_size.mp4")
    assert err.value.source == "odd_size.mp4" and err.value.stage == "video.decode"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_device_is_refused_where_the_pipeline_is_built(videos) -> None:
    path = str(videos["h264_bframes"])
    with pytest.raises(ValueError, match=r"decoder='cuda'.*CUDA is not available"):
        clips([path], sampler=SAMPLER, decoder="cuda")
    with pytest.raises(ValueError, match=r"decoder='cuda:1'.*CUDA is not available"):
        decode_clips(path, sampler=SAMPLER, decoder="cuda:1")
    with pytest.raises(ValueError, match=r"decoder='gpu' must be 'cpu', 'cuda' or 'cuda:N'"):
        clips([path], sampler=SAMPLER, decoder="gpu")
    with pytest.raises(TypeError, match="decoder=0"):
        clips([path], sampler=SAMPLER, decoder=0)  # type: ignore[arg-type]


def _on_device(pipe: sb.Pipeline) -> sb.Pipeline:
    """``pipe`` with its video reader set to decode onto a device (what clips() builds
    with decoder='cuda' where one exists; its options are checked there, not here)."""
    src = pipe._src
    reader = dataclasses.replace(src.reader, decoder="cuda")
    return sb.Pipeline._of(dataclasses.replace(src, reader=reader), pipe._sharding)


def test_loader_refuses_workers_for_a_pipeline_decoding_onto_a_device(videos) -> None:
    on_device = _on_device(clips([str(videos["h264_bframes"])], sampler=SAMPLER))
    assert on_device._decodes_on() == "cuda"
    other = _on_device(clips([str(videos["mpeg4"])], sampler=SAMPLER))
    mixed = sb.mix([on_device, other], weights=[1, 1])
    assert mixed._decodes_on() == "cuda"
    for p in (on_device.batch(2), mixed.batch(2)):
        with pytest.raises(
            ValueError, match=r"num_workers=2: .*decodes onto 'cuda'.*num_workers=0"
        ):
            sb.Loader(p, num_workers=2, max_batches=4, max_bytes="64MiB")
        sb.Loader(p, num_workers=0, max_batches=4, max_bytes="64MiB").close()  # accepted
        auto = sb.Loader(p, num_workers="auto", max_batches=4, max_bytes="64MiB")
        assert auto.num_workers == 0  # "auto" picks the only count that works
        auto.close()
    plain = clips([str(videos["h264_bframes"])], sampler=SAMPLER).batch(2)
    assert plain._decodes_on() is None
    sb.Loader(plain, num_workers=2, max_batches=4, max_bytes="64MiB").close()


def test_sources_decoding_onto_different_devices_are_not_mixed(videos) -> None:
    on_device = _on_device(clips([str(videos["h264_bframes"])], sampler=SAMPLER))
    on_host = clips([str(videos["mpeg4"])], sampler=SAMPLER)
    with pytest.raises(
        ValueError, match=r"source 1 decodes onto host memory and source 0 onto cuda"
    ):
        sb.mix([on_device, on_host], weights=[1, 1])


@pytest.mark.timeout(60)
def test_a_plain_dataloader_worker_refuses_a_pipeline_decoding_onto_a_device(videos) -> None:
    from torch.utils.data import DataLoader

    pipe = _on_device(clips([str(videos["h264_bframes"])], sampler=SAMPLER))
    with pytest.raises(RuntimeError, match=r"decodes onto 'cuda' and runs only in the training"):
        next(iter(DataLoader(pipe, batch_size=None, num_workers=1, timeout=30)))


def _cuda_hwaccel() -> str | None:
    """Why the device test cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "needs a CUDA device (decoder='cuda' decodes with NVDEC); none in this process"
    from av.codec.hwaccel import hwdevices_available

    if "cuda" not in hwdevices_available():
        return "this PyAV's FFmpeg has no cuda hwaccel"
    return None


@pytest.mark.skipif(_cuda_hwaccel() is not None, reason=str(_cuda_hwaccel()))
def test_cuda_clips_match_cpu_clips_and_stay_on_the_device(videos) -> None:
    path = str(videos["h264_bframes"])
    kw = {"sampler": SAMPLER, "seed": 3, "width": 32, "height": 24}
    cpu = {int(c.clip_index): c for c in decode_clips(path, **kw)}
    gpu = {int(c.clip_index): c for c in decode_clips(path, decoder="cuda", **kw)}
    assert cpu.keys() == gpu.keys()
    for ci, c in cpu.items():
        g = gpu[ci]
        assert g.data.device.type == "cuda" and g.data.shape == c.data.shape
        assert torch.equal(g.pts_seconds, c.pts_seconds)
        mean, _ = _diff(g.data.cpu(), c.data.numpy())
        assert mean <= 3.0, (ci, mean)
    pipe = clips([path] * 4, sampler=SAMPLER, width=32, height=24, decoder="cuda").batch(2)
    with sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="8MiB") as loader:
        batches = list(loader)
    assert len(batches) == 4 and all(b.data.device.type == "cuda" for b in batches)


# -- BT.2020 and one-sided shrinking ---------------------------------------------------------
def _yuv420p_frame(
    y: np.ndarray, u: np.ndarray, v: np.ndarray, *, colorspace: int, full: bool
) -> Any:
    """A yuv420p frame of these planes (height a multiple of 4), tagged with an FFmpeg
    colorspace number and range."""
    h, w = y.shape
    packed = np.concatenate([y, u.reshape(h // 4, w), v.reshape(h // 4, w)])
    frame = av.VideoFrame.from_ndarray(packed.astype(np.uint8), format="yuv420p")
    frame.colorspace = colorspace
    frame.color_range = 2 if full else 1  # AVCOL_RANGE_JPEG, AVCOL_RANGE_MPEG
    return frame


def _encode(rgb: np.ndarray, kr: float, kb: float, full: bool) -> np.ndarray:
    """Y'CbCr of RGB in [0, 1] by the standard's equations, quantized to 8 bits."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    luma = kr * r + (1 - kr - kb) * g + kb * b
    pb, pr = (b - luma) / (2 * (1 - kb)), (r - luma) / (2 * (1 - kr))
    if full:
        ycc = np.stack([255 * luma, 128 + 255 * pb, 128 + 255 * pr], -1)
    else:
        ycc = np.stack([16 + 219 * luma, 128 + 224 * pb, 128 + 224 * pr], -1)
    return np.clip(np.round(ycc), 0, 255)


def _decode_reference(ycc: np.ndarray, kr: float, kb: float, full: bool) -> np.ndarray:
    """RGB of 8-bit Y'CbCr by the inverse of the standard's RGB -> Y'PbPr matrix."""
    kg = 1 - kr - kb
    forward = np.array(
        [
            [kr, kg, kb],
            [-kr / (2 * (1 - kb)), -kg / (2 * (1 - kb)), 0.5],
            [0.5, -kg / (2 * (1 - kr)), -kb / (2 * (1 - kr))],
        ]
    )
    if full:
        ypbpr = (ycc - [0, 128, 128]) / 255
    else:
        ypbpr = (ycc - [16, 128, 128]) / [219, 224, 224]
    rgb = ypbpr @ np.linalg.inv(forward).T
    return np.clip(np.round(rgb * 255), 0, 255)


@pytest.mark.parametrize("full", [False, True], ids=["limited", "full"])
def test_bt2020_frames_convert_by_the_standards_coefficients(full: bool) -> None:
    """A frame tagged BT.2020 (FFmpeg's colorspace 9) converts by Kr = 0.2627,
    Kb = 0.0593: within one level of the inverse of the standard's matrix on the same
    planes, within three of the colours they encode (8-bit rounding); BT.709's matrix
    on them is far off in the saturated colours."""
    kr, kb = 0.2627, 0.0593
    rng = np.random.default_rng(0)
    corners = np.array([[i >> 2 & 1, i >> 1 & 1, i & 1] for i in range(8)], dtype=float)
    colours = np.concatenate([corners, rng.random((56, 3))]).reshape(8, 8, 3)
    rgb = colours.repeat(2, 0).repeat(2, 1)  # one colour per 2x2 block: chroma exact
    ycc = _encode(rgb, kr, kb, full)
    y = ycc[..., 0]
    u, v = ycc[::2, ::2, 1], ycc[::2, ::2, 2]
    frame = _yuv420p_frame(y, u, v, colorspace=9, full=full)
    out = to_rgb(frame, {}, "bt2020").numpy().astype(np.int64)
    assert out.shape == (16, 16, 3)
    reference = _decode_reference(ycc, kr, kb, full)
    assert np.abs(out - reference).max() <= 1
    assert np.abs(out - np.round(rgb * 255)).max() <= 3
    planes = [torch.from_numpy(p.astype(np.uint8)) for p in (y, u, v)]
    assert torch.equal(
        yuv420_to_rgb(*planes, matrix="2020", full_range=full),
        torch.from_numpy(out).to(torch.uint8),
    )
    as_709 = yuv420_to_rgb(*planes, matrix="709", full_range=full).numpy().astype(np.int64)
    assert np.abs(as_709 - reference).max() >= 10


def _stripes(height: int, width: int, period: int, axis: int) -> np.ndarray:
    """Luma 255 on every ``period``-th column (axis 1) or row (axis 0), else 0."""
    at = np.arange(width if axis == 1 else height) % period == 0
    line = np.where(at, 255, 0)
    return np.broadcast_to(line if axis == 1 else line[:, None], (height, width)).copy()


@pytest.mark.parametrize("other", ["kept", "grown"])
@pytest.mark.parametrize("axis", [1, 0], ids=["width", "height"])
@pytest.mark.parametrize("factor", [3, 4])
def test_a_resize_that_shrinks_one_side_only_is_antialiased(
    factor: int, axis: int, other: str
) -> None:
    """One side shrunk by ``factor`` (the other kept, or grown): stripes one pixel wide
    every ``factor`` pixels along it average out to their mean (255 / factor) away from
    the edges, as torch's antialiased bilinear filter gives; sampled without the filter
    they alias (every output pixel lands between stripes: 0)."""
    h, w = 24, 48
    y = _stripes(h, w, factor, axis)
    grey = np.full((h // 2, w // 2), 128)
    frame = _yuv420p_frame(y, grey, grey, colorspace=1, full=True)  # R = G = B = Y
    kept = (h, w)[1 - axis] * (2 if other == "grown" else 1)
    shrunk = (h, w)[axis] // factor
    out_h, out_w = (kept, shrunk) if axis == 1 else (shrunk, kept)
    out = to_rgb(frame, {"height": out_h, "width": out_w}, "stripes").numpy()
    assert out.shape == (out_h, out_w, 3)
    chw = torch.from_numpy(y).float()[None, None].expand(1, 3, h, w)
    want = torch.nn.functional.interpolate(
        chw, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=True
    )[0].permute(1, 2, 0)
    assert np.abs(out.astype(np.int64) - want.round().numpy().astype(np.int64)).max() <= 1
    inner = out[:, 1:-1] if axis == 1 else out[1:-1, :]  # (the edges weigh fewer stripes)
    assert np.abs(inner.astype(float) - 255 / factor).max() <= 1.0, inner[..., 0]
