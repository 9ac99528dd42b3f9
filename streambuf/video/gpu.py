"""Decoding onto a CUDA device: ``decoder="cuda"`` (NVDEC through PyAV's hwaccel).

What ``decoder="cuda"`` changes in ``decode_clips`` / ``clips()`` (and nothing else):

* the container is opened with ``av.codec.hwaccel.HWAccel("cuda", is_hw_owned=True)``:
  FFmpeg parses the stream on the CPU, NVDEC decodes the pictures into device memory,
  and the frames stay there (``is_hw_owned``); their planes reach torch through DLPack
  (``torch.from_dlpack``: no copy);
* the colour conversion (YUV 4:2:0, ``nv12`` from NVDEC, to RGB: the frame's BT.601 /
  709 / 2020 matrix, limited or full range) and the resize (bilinear, antialiased when
  shrinking) run on the device in torch (``to_rgb``) instead of swscale, and each clip's
  tensor is allocated on the device: a clip never visits host memory;
* everything else is the CPU path: the same index, the same forward-only plan with
  skippable packets, the same clips, pts and resume.

Where it runs: in the training process (``Loader(num_workers=0)``; ``clips(threads=)``
decodes that many videos at once and NVDEC works asynchronously). DataLoader worker
processes cannot hand device memory to the trainer without copies, and a forked child
cannot use a CUDA context, so the Loader refuses workers for such a pipeline
(``Pipeline._decodes_on``). The byte budget then bounds the decoded clips held on the
device: ``max_bytes`` counts every tensor's storage, so the lanes' queued clips and the
batches ahead of the consumer are device bytes under that one bound.

Output differs from swscale's by rounding and chroma interpolation: at most a few levels
per channel on the same planes (``tests/video/test_gpu_decode.py`` measures it on CPU
planes, where everything but the device runs). 8-bit 4:2:0 only; a 10-bit or 4:4:4
stream raises ``VideoError`` naming the format (decode it with ``decoder="cpu"``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from ..device import check_device
from ..errors import VideoError

__all__ = ["check_decoder", "hwaccel", "to_rgb", "yuv420_to_rgb"]

# (Kr, Kb) of the YCbCr matrices (ITU-R BT.601, BT.709, BT.2020 non-constant luminance)
_KR_KB = {"601": (0.299, 0.114), "709": (0.2126, 0.0722), "2020": (0.2627, 0.0593)}
# FFmpeg's AVColorSpace values: BT709 = 1, BT2020_NCL = 9, BT2020_CL = 10; everything
# else (unspecified, BT470BG, SMPTE170M, ...) is converted as BT.601, as swscale does
_MATRIX_OF_COLORSPACE = {1: "709", 9: "2020", 10: "2020"}
_JPEG_RANGE = 2  # AVCOL_RANGE_JPEG: full range; anything else is limited (MPEG)


def check_decoder(decoder: Any) -> torch.device | None:
    """``decoder`` as the CUDA device to decode on, or None for ``"cpu"`` (swscale).

    Checked where the pipeline is built, in the caller's thread: ``"cuda"`` is torch's
    current device there (``torch.cuda.set_device(local_rank)`` under DDP), resolved
    now, since lane threads start on device 0; ``"cuda:N"`` is device N. Needs a CUDA
    device in this process and a PyAV (>= 16) whose FFmpeg has the cuda hwaccel.

    Raises:
        TypeError: not a str.
        ValueError: another value, no CUDA device, or no cuda hwaccel in PyAV.
    """
    if not isinstance(decoder, str):
        raise TypeError(f"decoder={decoder!r} must be 'cpu', 'cuda' or 'cuda:N'")
    if decoder == "cpu":
        return None
    if not decoder.startswith("cuda"):
        raise ValueError(f"decoder={decoder!r} must be 'cpu', 'cuda' or 'cuda:N'")
    dev = check_device(decoder, name="decoder")  # no CUDA here: ValueError naming the fix
    assert dev is not None
    missing = _pyav_cuda_missing()
    if missing:
        raise ValueError(f"decoder={decoder!r} but {missing}, or use decoder='cpu'")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return torch.device("cuda", index)


@functools.cache
def _pyav_cuda_missing() -> str:
    """What this PyAV lacks for decoding on CUDA ("" when nothing); probed once per
    process (every video of a pipeline asks)."""
    from .probe import _import_av

    _import_av()
    from av.codec.hwaccel import HWAccel, hwdevices_available

    if "cuda" not in hwdevices_available():
        return (
            "this PyAV's FFmpeg has no cuda hwaccel (it has: "
            f"{', '.join(hwdevices_available()) or 'none'}); install a PyAV wheel built with it"
        )
    try:  # settings only: no device is opened here
        HWAccel("cuda", is_hw_owned=True)
    except TypeError:
        return (
            "it needs PyAV >= 16 (HWAccel(is_hw_owned=True) keeps frames on the device); upgrade av"
        )
    return ""


def hwaccel(device: torch.device) -> Any:
    """The ``av.open(hwaccel=...)`` value that decodes on ``device`` and keeps frames
    there (no fallback: a stream NVDEC cannot decode fails, it does not silently move to
    the CPU)."""
    from av.codec.hwaccel import HWAccel

    return HWAccel(
        "cuda", device=str(device.index or 0), allow_software_fallback=False, is_hw_owned=True
    )


def yuv420_to_rgb(
    y: torch.Tensor, u: torch.Tensor, v: torch.Tensor, *, matrix: str, full_range: bool
) -> torch.Tensor:
    """RGB uint8 ``(H, W, 3)`` from 8-bit 4:2:0 planes (``y``: ``(H, W)``; ``u``, ``v``:
    half size, rounded up or down: odd sizes), on their device. Each chroma sample
    covers a 2x2 block (top-left sited, like swscale's unscaled path; an odd edge
    repeats the last one); ``matrix`` is "601", "709" or "2020"; ``full_range``: JPEG
    range (0-255), else limited (16-235 luma, 16-240 chroma)."""
    kr, kb = _KR_KB[matrix]
    h, w = y.shape
    dev = y.device
    rows = torch.div(torch.arange(h, device=dev), 2, rounding_mode="floor").clamp_(
        max=u.shape[0] - 1
    )
    cols = torch.div(torch.arange(w, device=dev), 2, rounding_mode="floor").clamp_(
        max=u.shape[1] - 1
    )
    yf = y.float()
    uf = u.float().index_select(0, rows).index_select(1, cols) - 128.0
    vf = v.float().index_select(0, rows).index_select(1, cols) - 128.0
    if not full_range:
        yf = (yf - 16.0) * (255.0 / 219.0)
        uf = uf * (255.0 / 224.0)
        vf = vf * (255.0 / 224.0)
    r = yf + (2.0 * (1.0 - kr)) * vf
    b = yf + (2.0 * (1.0 - kb)) * uf
    g = (yf - kr * r - kb * b) / (1.0 - kr - kb)
    return torch.stack((r, g, b), dim=-1).round_().clamp_(0, 255).to(torch.uint8)


_CONVERTS = ("nv12", "yuv420p", "yuvj420p")  # 8-bit 4:2:0 (NVDEC gives nv12)


def _planes(frame: Any, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Y, U and V planes of a 4:2:0 frame as tensors on the frame's device."""
    sw = getattr(frame, "sw_format", None)  # a device frame's layout in memory
    fmt = sw.name if sw is not None else frame.format.name
    if fmt not in _CONVERTS:
        raise VideoError(
            f"decoder='cuda' converts 8-bit 4:2:0 frames ({', '.join(_CONVERTS)}); this "
            f"stream's are {fmt}: decode it with decoder='cpu'",
            stage="video.decode",
            source=name,
        )
    try:
        # the capsule with stream=None: PyAV refuses a stream for device frames (NVDEC
        # wrote them on FFmpeg's default stream, ordered with torch's default stream)
        planes = [torch.from_dlpack(p.__dlpack__()) for p in frame.planes]
    except (NotImplementedError, TypeError, ValueError, BufferError, RuntimeError) as exc:
        raise VideoError(
            f"cannot read the decoded {fmt} frame's planes through DLPack: "
            f"{type(exc).__name__}: {exc}; decode it with decoder='cpu'",
            stage="video.decode",
            source=name,
        ) from exc
    h, w = planes[0].shape
    halves = ({h // 2, (h + 1) // 2}, {w // 2, (w + 1) // 2})
    if fmt == "nv12":
        y, uv = planes
        u, v = uv[..., 0], uv[..., 1]
    else:
        y, u, v = planes
    if not all(c.shape[0] in halves[0] and c.shape[1] in halves[1] for c in (u, v)):
        raise VideoError(
            f"a {fmt} frame of {w}x{h} with chroma planes of {tuple(u.shape)}: not 4:2:0; "
            "decode it with decoder='cpu'",
            stage="video.decode",
            source=name,
        )
    return y, u, v


def to_rgb(frame: Any, size: dict[str, int], name: str) -> torch.Tensor:
    """RGB uint8 ``(H, W, 3)`` of a decoded frame, on the frame's device, resized to
    ``size`` (``{"width", "height"}``; empty: as coded) with bilinear interpolation
    (antialiased when shrinking, as swscale's filter is)."""
    y, u, v = _planes(frame, name)
    matrix = _MATRIX_OF_COLORSPACE.get(int(frame.colorspace), "601")
    rgb = yuv420_to_rgb(y, u, v, matrix=matrix, full_range=int(frame.color_range) == _JPEG_RANGE)
    if not size or (size["height"], size["width"]) == tuple(rgb.shape[:2]):
        return rgb
    chw = rgb.permute(2, 0, 1).unsqueeze(0).float()
    shrink = size["height"] < rgb.shape[0] or size["width"] < rgb.shape[1]
    out = F.interpolate(
        chw,
        size=(size["height"], size["width"]),
        mode="bilinear",
        align_corners=False,
        antialias=shrink,
    )
    return out[0].round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
