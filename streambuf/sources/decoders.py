"""Field decoders for WebDataset samples, chosen by extension.

Defaults (extensions as webdataset names them; a field ``x.seg.png`` is looked up as
``x.seg.png``, then ``seg.png``, then ``png``):

* ``npy``: ``numpy.load(..., allow_pickle=False)`` (object arrays are refused).
* ``json``/``jsn``: ``json.loads``.
* ``txt``/``text``/``transcript``: UTF-8 ``str``.
* ``cls``/``cls2``/``class``/``count``/``index``/``inx``/``id``: ``int``.
* ``pth``: ``torch.load(..., weights_only=True)``: tensors and plain containers only; a
  pickle that would import or call anything else is refused.
* ``jpg``/``jpeg``/``png``/``ppm``/``pgm``/``pbm``/``bmp``/``tif``/``tiff``/``webp``:
  Pillow (``pip install pillow``), converted to RGB, returned as a ``uint8`` numpy array
  ``(H, W, 3)``. Pillow rather than ``torchvision.io.decode_image`` because Pillow is a
  small, always-available wheel and torchvision is not a dependency; its decompression
  bomb guard (``Image.MAX_IMAGE_PIXELS``) stays on. An image whose decoded size
  (width x height x channels, at least the 3 returned) exceeds ``max_decoded_bytes``
  (default 256 MiB, Pillow's own warning threshold for RGB) is refused from its header,
  before any pixel is decoded.
* anything else: left as ``bytes``. There is no pickle decoder: ``pyd``/``pickle`` fields
  stay bytes unless the user registers one, because unpickling untrusted shards runs code.

Custom decoders: pass ``{"ext": fn}`` to ``Decoder``/``decode_sample`` (per call, and
picklable with the pipeline), or ``register_decoder(ext, fn)`` (process-wide; a spawned
DataLoader worker only sees registrations made at import time of your module). ``fn``
takes the field's ``bytes`` and returns anything; ``None`` as ``fn`` keeps the bytes.

Failures become ``ShardError`` (stage ``"decode"``) naming the sample key and field, and
the URL; the original exception is ``__cause__``. With ``on_error="skip"`` the whole
sample is skipped, not just the field (a sample missing a field would break ``collate``
or the user's code far from the cause): counted, logged (one WARNING each) and, beyond
``max_failures``, ``TooManyFailures``; counts are per process (each DataLoader worker
counts its own). A map stage cannot drop an item, so ``Decoder`` then returns
``SKIPPED`` and a following ``filter(not_skipped)`` drops it (``Pipeline.decode`` adds
that filter). ``ImportError`` (e.g. Pillow missing) is never skipped: it is a setup
error, not bad data.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from .._failures import FailurePolicy, OnError
from .._units import parse_bytes
from ..errors import ShardError
from .urls import redact

__all__ = [
    "DEFAULT_DECODERS",
    "SKIPPED",
    "Decoder",
    "decode_sample",
    "not_skipped",
    "register_decoder",
]

FieldDecoder = Callable[[bytes], Any]
DEFAULT_MAX_DECODED_BYTES = 256 << 20  # Pillow's DecompressionBombWarning level, in RGB
_STAGE = "decode"


class _Skipped:
    def __repr__(self) -> str:
        return "SKIPPED"

    def __reduce__(self) -> str:
        return "SKIPPED"  # unpickles as this module's singleton


SKIPPED: Final = _Skipped()
"""What ``Decoder(on_error="skip")`` returns for a sample it skipped."""


def not_skipped(item: Any, /) -> bool:
    """Filter predicate: False for ``SKIPPED``, so ``filter(not_skipped)`` drops it."""
    return item is not SKIPPED


def decode_npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_json(data: bytes) -> Any:
    return json.loads(data)


def decode_text(data: bytes) -> str:
    return data.decode("utf-8")


def decode_int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def decode_pth(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def decode_image(data: bytes, *, max_decoded_bytes: int | None = DEFAULT_MAX_DECODED_BYTES) -> Any:
    """An image as a ``uint8`` RGB array ``(H, W, 3)``; refused from its header if its
    decoded size would exceed ``max_decoded_bytes`` (None: no limit)."""
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("decoding images needs Pillow: pip install pillow") from exc
    import numpy as np

    with Image.open(io.BytesIO(data)) as img:  # lazy: reads the header only
        width, height = img.size
        need = width * height * max(3, len(img.getbands()))
        if max_decoded_bytes is not None and need > max_decoded_bytes:
            raise ValueError(
                f"a {width}x{height} image decodes to {need} bytes, more than "
                f"max_decoded_bytes={max_decoded_bytes}; raise max_decoded_bytes (None: no "
                "limit) if such images are expected, or store them smaller in the shards"
            )
        return np.asarray(img.convert("RGB"), dtype=np.uint8)


def _table() -> dict[str, FieldDecoder]:
    table: dict[str, FieldDecoder] = {"npy": decode_npy, "pth": decode_pth}
    table.update(dict.fromkeys(("json", "jsn"), decode_json))
    table.update(dict.fromkeys(("txt", "text", "transcript"), decode_text))
    table.update(dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), decode_int))
    images = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "webp")
    table.update(dict.fromkeys(images, decode_image))
    return table


DEFAULT_DECODERS: dict[str, FieldDecoder] = _table()
_registry: dict[str, FieldDecoder | None] = {}


def register_decoder(ext: str, fn: FieldDecoder | None, /) -> None:
    """Use ``fn`` for fields ending in ``ext`` (e.g. ``"pyd"``, ``"seg.png"``) in this
    process; ``None`` keeps such fields as bytes. Later registrations win."""
    if not isinstance(ext, str) or not ext or ext.startswith("."):
        raise ValueError(f"ext={ext!r} must be an extension without the dot, like 'png'")
    _registry[ext.lower()] = fn


def _candidates(field: str) -> list[str]:
    parts = field.lower().split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


class Decoder:
    """Decode every field of a sample by extension; picklable if its functions are.

    Args:
        decoders: extension -> function (or None to keep bytes); consulted first.
        defaults: also use ``register_decoder`` entries and ``DEFAULT_DECODERS``.
        on_error: ``"raise"`` (default): a failing field raises ``ShardError``.
            ``"skip"``: the whole sample is skipped (returns ``SKIPPED``; see the module
            docstring), counted and logged.
        max_failures: with ``"skip"``, more skipped samples than this (per process)
            raise ``TooManyFailures``; None: no limit.
        max_decoded_bytes: the largest decoded image (int or "256MiB"), checked from the
            image header before decoding; None: no limit.

    Calling it on a sample returns a new dict; ``__``-prefixed entries pass through.
    """

    def __init__(
        self,
        decoders: Mapping[str, FieldDecoder | None] | None = None,
        *,
        defaults: bool = True,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        max_decoded_bytes: int | str | None = DEFAULT_MAX_DECODED_BYTES,
    ) -> None:
        self.decoders = {k.lower().lstrip("."): v for k, v in (decoders or {}).items()}
        self.defaults = defaults
        self.on_error: OnError = on_error
        self.max_failures = max_failures
        self._policy = FailurePolicy(on_error, max_failures, stage=_STAGE)  # validates
        self.max_decoded_bytes = (
            None
            if max_decoded_bytes is None
            else parse_bytes(max_decoded_bytes, name="max_decoded_bytes")
        )

    @property
    def skipped(self) -> int:
        """Samples skipped so far in this process (``on_error="skip"``)."""
        return self._policy.skipped

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_policy"]  # holds a lock; each process counts its own failures
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._policy = FailurePolicy(self.on_error, self.max_failures, stage=_STAGE)

    def _lookup(self, field: str) -> FieldDecoder | None:
        tables: list[Mapping[str, FieldDecoder | None]] = [self.decoders]
        if self.defaults:
            tables += [_registry, DEFAULT_DECODERS]
        for ext in _candidates(field):
            for table in tables:
                if ext in table:
                    return table[ext]
        return None

    def __call__(self, sample: Mapping[str, Any], /) -> dict[str, Any] | _Skipped:
        """The decoded sample (a new dict), or ``SKIPPED`` under ``on_error="skip"``."""
        out: dict[str, Any] = {}
        for field, value in sample.items():
            fn = None if field.startswith("__") else self._lookup(field)
            if fn is None or not isinstance(value, bytes | bytearray | memoryview):
                out[field] = value
                continue
            try:
                if fn is decode_image:
                    out[field] = decode_image(
                        bytes(value), max_decoded_bytes=self.max_decoded_bytes
                    )
                else:
                    out[field] = fn(bytes(value))
            except ImportError:
                raise
            except Exception as exc:
                key = sample.get("__key__", "?")
                url = sample.get("__url__")
                source = redact(url) if url is not None else None
                err = ShardError(
                    f"cannot decode field {field!r} of sample {key!r}: "
                    f"{type(exc).__name__}: {redact(exc)}",
                    stage=_STAGE,
                    source=source,
                )
                err.__cause__ = exc
                self._policy.handle(
                    err, source=source, error_type=ShardError, what="sample skipped"
                )
                return SKIPPED
        return out


def decode_sample(
    sample: Mapping[str, Any], /, decoders: Mapping[str, FieldDecoder | None] | None = None
) -> dict[str, Any]:
    """Decode one sample with ``Decoder(decoders)``; see the module docstring."""
    out = Decoder(decoders)(sample)
    assert isinstance(out, dict)  # on_error="raise" never skips
    return out
