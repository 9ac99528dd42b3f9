"""Image fields, decoded with Pillow into the output modes webdataset names.

``ImageDecoder(spec)`` with ``spec`` one of ``IMAGE_SPECS`` (webdataset's names):

=============  =========================================================
``l8``         numpy ``uint8`` ``(H, W)``
``rgb8``       numpy ``uint8`` ``(H, W, 3)`` (the default of ``decode()``)
``rgba8``      numpy ``uint8`` ``(H, W, 4)``
``l``/``rgb``/``rgba``     numpy ``float32`` in [0, 1], same shapes
``torchl8``/``torchrgb8``/``torchrgba8``  torch ``uint8``, ``(C, H, W)`` (``(H, W)`` for l)
``torchl``/``torchrgb``/``torch``/``torchrgba``  torch ``float32`` in [0, 1]
``pil``/``pilrgb``/``pill``/``pilrgba``  a ``PIL.Image`` in RGB / L / RGBA
=============  =========================================================

Values are those of webdataset's ``ImageHandler`` for the same spec (same Pillow
conversion, same scaling). It applies to fields whose last extension is in
``IMAGE_EXTENSIONS``: webdataset's list less the formats Pillow can only identify, not
decode (``h5``, ``hdf``, ``bufr``, ``grib``, ``wmf``, ``emf``, ``ps``, ``eps``) and the
video containers (``mpg``, ``mpeg``: hand those to ``streambuf.video.decode_member``).

Size bound: an image whose decoded size (pixels x channels x bytes per value, or the
source's own bands when more) exceeds ``max_decoded_bytes`` is refused from its header,
before any pixel is decoded; Pillow's decompression bomb guard stays on too.
"""

from __future__ import annotations

import io
from typing import Any, Final

from .formats import DecodedSizeError

__all__ = ["IMAGE_EXTENSIONS", "IMAGE_SPECS", "ImageDecoder", "decode_image"]

# (array kind, float, Pillow mode)
IMAGE_SPECS: Final[dict[str, tuple[str, bool, str]]] = {
    "l8": ("numpy", False, "L"),
    "rgb8": ("numpy", False, "RGB"),
    "rgba8": ("numpy", False, "RGBA"),
    "l": ("numpy", True, "L"),
    "rgb": ("numpy", True, "RGB"),
    "rgba": ("numpy", True, "RGBA"),
    "torchl8": ("torch", False, "L"),
    "torchrgb8": ("torch", False, "RGB"),
    "torchrgba8": ("torch", False, "RGBA"),
    "torchl": ("torch", True, "L"),
    "torchrgb": ("torch", True, "RGB"),
    "torch": ("torch", True, "RGB"),
    "torchrgba": ("torch", True, "RGBA"),
    "pill": ("pil", False, "L"),
    "pil": ("pil", False, "RGB"),
    "pilrgb": ("pil", False, "RGB"),
    "pilrgba": ("pil", False, "RGBA"),
}

IMAGE_EXTENSIONS: Final = frozenset(
    "blp bmp dib cur pcx dcx dds fit fits fli flc ftc ftu gbr gif png apng jp2 j2k jpc "
    "jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg msp pcd pxr pbm pgm ppm pnm "
    "psd bw rgb rgba sgi ras tga icb vda vst webp xbm xpm".split()
)


class ImageDecoder:
    """Decode an image field to ``spec`` (see the module docstring); picklable.

    Called as a field decoder, ``fn(data)``; ``decode(data, bound=)`` with another
    size bound (``Decoder`` passes its ``max_decoded_bytes``).
    """

    def __init__(self, spec: str = "rgb8", *, max_decoded_bytes: int | None = 256 << 20) -> None:
        if not isinstance(spec, str) or spec.lower() not in IMAGE_SPECS:
            raise ValueError(
                f"image spec {spec!r} is not one of {', '.join(IMAGE_SPECS)} "
                "(webdataset's names: e.g. 'rgb8' for uint8 HWC numpy, 'torchrgb8' for "
                "uint8 CHW tensors)"
            )
        self.spec = spec.lower()
        self.max_decoded_bytes = max_decoded_bytes

    def __repr__(self) -> str:
        return f"ImageDecoder({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageDecoder) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((self.spec, self.max_decoded_bytes))

    def applies(self, field: str) -> bool:
        return field.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS

    def __call__(self, data: bytes) -> Any:
        return self.decode(data, bound=self.max_decoded_bytes)

    def decode(self, data: bytes, *, bound: int | None) -> Any:
        """The decoded image; refused from its header past ``bound`` bytes (None: no
        limit)."""
        return self.decode_counted(data, bound=bound)[0]

    def decode_counted(
        self,
        data: bytes,
        *,
        bound: int | None,
        bound_name: str | None = None,
        option: str = "max_decoded_bytes",
    ) -> tuple[Any, int]:
        """``(image, the bytes its header says it decodes to)``; refused from the header,
        before any pixel is decoded, past ``bound`` (``bound_name`` says which limit that
        is, ``option`` which argument raises it)."""
        try:
            from PIL import Image
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("decoding images needs Pillow: pip install pillow") from exc
        import numpy as np

        kind, is_float, mode = IMAGE_SPECS[self.spec]
        with Image.open(io.BytesIO(data)) as img:  # lazy: reads the header only
            width, height = img.size
            need = width * height * max(len(img.getbands()), len(mode) * (4 if is_float else 1))
            if bound is not None and need > bound:
                label = bound_name or f"max_decoded_bytes={bound}"
                raise DecodedSizeError(
                    f"a {width}x{height} image decodes to {need} bytes, more than "
                    f"{bound} ({label}); raise {option} (None: no limit) if such images are "
                    "expected, or store them smaller in the shards"
                )
            img.load()
            out = img.convert(mode)
        if kind == "pil":
            return out, need
        arr = np.asarray(out)
        if is_float:
            arr = arr.astype(np.float32) / 255.0
        if kind == "numpy":
            return arr, need
        import torch

        tensor = torch.from_numpy(arr.transpose(2, 0, 1).copy() if arr.ndim == 3 else arr.copy())
        return tensor, need


def decode_image(data: bytes, *, max_decoded_bytes: int | None = 256 << 20) -> Any:
    """An image as a ``uint8`` RGB array ``(H, W, 3)`` (spec ``"rgb8"``)."""
    return ImageDecoder("rgb8", max_decoded_bytes=max_decoded_bytes)(data)
