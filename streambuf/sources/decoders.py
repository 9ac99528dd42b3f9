"""Field decoders for WebDataset samples, chosen by extension: what webdataset decodes,
minus the formats that run code.

Defaults (extensions as webdataset names them; a field ``x.seg.png`` is looked up as
``x.seg.png``, then ``seg.png``, then ``png``):

* ``*.gz``: gunzipped first (bounded, see below), then decoded by the inner extension
  (``txt.gz`` -> ``str``, ``npy.gz`` -> array), like webdataset's ``gzfilter``; the field
  keeps its name.
* ``npy``: ``numpy.load(..., allow_pickle=False)`` (object arrays are refused).
* ``npz``: ``dict`` of name -> array, ``allow_pickle=False``.
* ``ten``/``tb``: webdataset's tenbin format, a list of arrays (``formats.decode_tenbin``).
* ``cbor`` (needs ``cbor2``), ``mp``/``msg`` (needs ``msgpack``): ``pip install
  'streambuf[formats]'``; without the package, a clear ``ImportError``.
* ``json``/``jsn``: ``json.loads``.
* ``txt``/``text``/``transcript``: UTF-8 ``str``.
* ``cls``/``cls2``/``class``/``count``/``index``/``inx``/``id``: ``int``.
* ``pth``: ``torch.load(..., weights_only=True)``: tensors and plain containers only; a
  pickle that would import or call anything else is refused.
* images (``jpg``, ``png``, ``webp``, ... ``images.IMAGE_EXTENSIONS``): Pillow, as
  ``"rgb8"`` (``uint8`` numpy ``(H, W, 3)``) unless an image spec is given:
  ``Decoder("torchrgb8")`` (webdataset's names, ``images.IMAGE_SPECS``).
* anything else: left as ``bytes``. There is no pickle decoder: ``pyd``/``pkl``/``pickle``
  fields stay bytes unless the user registers one, because unpickling untrusted shards
  runs code (webdataset unpickles them).

Specs, in the order they are consulted for a field:

1. mappings ``{"ext": fn}`` given to ``Decoder``/``decode()`` (most specific extension
   first; ``fn`` takes the field's ``bytes``; ``None`` keeps the bytes). A mapping entry
   for ``gz`` or ``txt.gz`` receives the compressed bytes.
2. image specs (a string such as ``"torchrgb"``) and webdataset-style handlers
   (``handler(key, data)`` with ``key`` = ``"." + field``, returning None when it does not
   apply: ``webdataset.handle_extension(...)``, ``webdataset.torch_video`` work as they
   are), in the order given.
3. ``register_decoder(ext, fn)`` entries (process-wide; a spawned DataLoader worker only
   sees registrations made at import time of your module), then the defaults above.

Size bounds (untrusted shards): ``max_decoded_bytes`` (default 256 MiB) bounds each
decoded image (from its header, before any pixel is decoded), each npz field (from its
arrays' headers) and each gzip layer (inflation stops one step past it); with
``max_sample_bytes`` (``Pipeline.decode`` takes it from ``shards(max_sample_bytes=)``)
the sample's fields, gz fields counted at their inflated size, may not add up to more.
A gzip bomb therefore costs at most ``max_decoded_bytes`` and the time to inflate them.

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

from collections.abc import Callable, Mapping
from typing import Any

from .._failures import OnError
from .._units import parse_bytes, parse_optional_bytes
from . import formats as fmt
from ._guard import SKIPPED, SampleFn, _Skipped, not_skipped
from .images import IMAGE_EXTENSIONS, IMAGE_SPECS, ImageDecoder, decode_image

__all__ = [
    "DEFAULT_DECODERS",
    "SKIPPED",
    "Decoder",
    "decode_image",
    "decode_sample",
    "not_skipped",
    "register_decoder",
]

FieldDecoder = Callable[[bytes], Any]
Handler = Callable[[str, bytes], Any]  # webdataset's: ("." + field, data) -> value or None
DecodeSpec = str | Mapping[str, FieldDecoder | None] | Handler | None
DEFAULT_MAX_DECODED_BYTES = 256 << 20  # Pillow's DecompressionBombWarning level, in RGB

# kept importable from here (they moved to ``formats``)
decode_npy, decode_json, decode_text = fmt.decode_npy, fmt.decode_json, fmt.decode_text
decode_int, decode_pth = fmt.decode_int, fmt.decode_pth


def _table() -> dict[str, FieldDecoder]:
    table: dict[str, FieldDecoder] = {
        "npy": fmt.decode_npy,
        "npz": fmt.decode_npz,
        "pth": fmt.decode_pth,
        "cbor": fmt.decode_cbor,
    }
    table.update(dict.fromkeys(("ten", "tb"), fmt.decode_tenbin))
    table.update(dict.fromkeys(("mp", "msg"), fmt.decode_msgpack))
    table.update(dict.fromkeys(("json", "jsn"), fmt.decode_json))
    table.update(dict.fromkeys(("txt", "text", "transcript"), fmt.decode_text))
    ints = ("cls", "cls2", "class", "count", "index", "inx", "id")
    table.update(dict.fromkeys(ints, fmt.decode_int))
    table.update(dict.fromkeys(sorted(IMAGE_EXTENSIONS), ImageDecoder("rgb8")))
    return table


DEFAULT_DECODERS: dict[str, FieldDecoder] = _table()
_registry: dict[str, FieldDecoder | None] = {}
_KEEP = object()  # "found, keep the bytes"


def register_decoder(ext: str, fn: FieldDecoder | None, /) -> None:
    """Use ``fn`` for fields ending in ``ext`` (e.g. ``"pyd"``, ``"seg.png"``) in this
    process; ``None`` keeps such fields as bytes. Later registrations win."""
    if not isinstance(ext, str) or not ext or ext.startswith("."):
        raise ValueError(f"ext={ext!r} must be an extension without the dot, like 'png'")
    _registry[ext.lower()] = fn


def _candidates(field: str) -> list[str]:
    parts = field.lower().split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def _find(tables: list[Mapping[str, FieldDecoder | None]], field: str) -> Any:
    """The entry for the most specific extension of ``field`` (earlier tables win a
    tie), ``_KEEP`` for a None entry, or None when no table has one."""
    for ext in _candidates(field):
        for table in tables:
            if ext in table:
                fn = table[ext]
                return _KEEP if fn is None else fn
    return None


class Decoder(SampleFn):
    """Decode every field of a sample by extension; picklable if its functions are.

    Args:
        *specs: mappings ``{"ext": fn}``, image specs (``"rgb8"``, ``"torchrgb8"``, ...)
            and webdataset-style handlers ``handler(key, data)``; see the module docstring
            for the order. None is ignored.
        defaults: also use ``register_decoder`` entries and ``DEFAULT_DECODERS``.
        on_error: ``"raise"`` (default): a failing field raises ``ShardError``.
            ``"skip"``: the whole sample is skipped (returns ``SKIPPED``; see the module
            docstring), counted and logged.
        max_failures: with ``"skip"``, more skipped samples than this (per process)
            raise ``TooManyFailures``; None: no limit.
        max_decoded_bytes: the most bytes one image, npz field or gzip layer may decode
            to (int or "256MiB"); None: no limit.
        max_sample_bytes: the most bytes a sample's fields may add up to, gz fields at
            their inflated size; None: no limit.

    Calling it on a sample returns a new dict; ``__``-prefixed entries and values that
    are not bytes pass through.
    """

    stage = "decode"

    def __init__(
        self,
        *specs: DecodeSpec,
        defaults: bool = True,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        max_decoded_bytes: int | str | None = DEFAULT_MAX_DECODED_BYTES,
        max_sample_bytes: int | str | None = None,
    ) -> None:
        super().__init__(on_error=on_error, max_failures=max_failures)
        self.__name__ = "decode"  # the stage name: map(decode)
        self.defaults = defaults
        self.max_decoded_bytes = (
            None
            if max_decoded_bytes is None
            else parse_bytes(max_decoded_bytes, name="max_decoded_bytes")
        )
        self.max_sample_bytes = parse_optional_bytes(max_sample_bytes, name="max_sample_bytes")
        self.decoders: dict[str, FieldDecoder | None] = {}
        self.handlers: list[Any] = []
        for spec in specs:
            if spec is None:
                continue
            if isinstance(spec, Mapping):
                self.decoders.update({k.lower().lstrip("."): v for k, v in spec.items()})
            elif isinstance(spec, str):
                if spec.lower() not in IMAGE_SPECS:
                    raise ValueError(
                        f"decode({spec!r}): a string spec names an image output mode, one "
                        f"of {', '.join(IMAGE_SPECS)} (webdataset's names)"
                    )
                self.handlers.append(ImageDecoder(spec))
            elif isinstance(spec, ImageDecoder) or callable(spec):
                self.handlers.append(spec)
            else:
                raise TypeError(
                    f"decode spec {spec!r} must be a mapping {{ext: fn}}, an image spec "
                    "string or a handler(key, data)"
                )

    def _tables(self) -> list[Mapping[str, FieldDecoder | None]]:
        return [_registry, DEFAULT_DECODERS] if self.defaults else []

    def _decode_field(self, field: str, data: bytes, room: int | None) -> tuple[Any, int]:
        """(decoded value, bytes it counts against ``max_sample_bytes``)."""
        name = field
        fn = _find([self.decoders], name)
        while fn is None and (name.lower() == "gz" or name.lower().endswith(".gz")):
            limit, limit_name = (
                self.max_decoded_bytes,
                f"max_decoded_bytes={self.max_decoded_bytes}",
            )
            if room is not None and (limit is None or room < limit):
                limit = room
                limit_name = f"what other fields leave of max_sample_bytes={self.max_sample_bytes}"
            data = fmt.gunzip(data, limit=limit, limit_name=limit_name)
            name = name[:-3]
            fn = _find([self.decoders], name)
        if fn is None:
            for handler in self.handlers:
                if isinstance(handler, ImageDecoder):
                    if handler.applies(name):
                        return handler.decode(data, bound=self.max_decoded_bytes), len(data)
                    continue
                value = handler("." + name, data)
                if value is not None:
                    return value, len(data)
            fn = _find(self._tables(), name) if name else None
        if fn is None or fn is _KEEP:
            return data, len(data)
        if isinstance(fn, ImageDecoder):
            return fn.decode(data, bound=self.max_decoded_bytes), len(data)
        if fn is fmt.decode_npz:
            limit_name = f"max_decoded_bytes={self.max_decoded_bytes}"
            return fmt.decode_npz(data, limit=self.max_decoded_bytes, limit_name=limit_name), len(
                data
            )
        return fn(data), len(data)

    def __call__(self, sample: Mapping[str, Any], /) -> dict[str, Any] | _Skipped:
        """The decoded sample (a new dict), or ``SKIPPED`` under ``on_error="skip"``."""
        out: dict[str, Any] = {}
        room = self.max_sample_bytes
        for field, value in sample.items():
            if field.startswith("__") or not isinstance(value, bytes | bytearray | memoryview):
                out[field] = value
                continue
            try:
                out[field], used = self._decode_field(field, bytes(value), room)
                if room is not None:
                    room -= used
                    if room < 0:
                        raise fmt.DecodedSizeError(
                            f"the fields up to this one add up to more than "
                            f"max_sample_bytes={self.max_sample_bytes}"
                        )
            except ImportError:
                raise
            except Exception as exc:
                fix = ""
                if isinstance(exc, fmt.DecodedSizeError):
                    fix = (
                        "raise max_decoded_bytes= / max_sample_bytes= of decode() (None: "
                        "no limit) if such fields are expected"
                    )
                return self.fail(sample, f"cannot decode field {field!r}", fix=fix, cause=exc)
        return out


def decode_sample(sample: Mapping[str, Any], /, *specs: DecodeSpec) -> dict[str, Any]:
    """Decode one sample with ``Decoder(*specs)``; see the module docstring."""
    out = Decoder(*specs)(sample)
    assert isinstance(out, dict)  # on_error="raise" never skips
    return out
