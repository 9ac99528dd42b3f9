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

Size bounds (untrusted shards), each checked before the bytes exist (from an image's
header, an npz member's ``.npy`` header, a gzip stream as it inflates, in steps of at
most 4 MiB), so a bomb costs at most its bound and the time to inflate it:

* ``max_decoded_bytes`` (default 256 MiB): one field: each decoded image, npz field and
  gzip layer.
* ``max_decoded_sample_bytes`` (default ``"auto"``: 4 x ``max_decoded_bytes``, 1 GiB):
  one sample: what the bounded decoders produce for all its fields together (gz fields
  at their inflated size, images at their decoded size, npz fields at their arrays'
  size). Each field's limit is what the fields before it left, so decoding stops as soon
  as the sample's total would pass it: six gzip fields of 250 MiB each are refused
  after 1 GiB, not decoded to 1.5 GiB first. Fields kept as bytes and formats that decode
  about 1:1 (npy, json, txt, ...) do not count: ``shards(max_member_bytes=,
  max_sample_bytes=)`` bound those as they are read. Raise it for samples that hold
  several large decoded volumes or frame stacks (``decode(max_decoded_sample_bytes=
  "8GiB")``; None: no limit); raising ``max_decoded_bytes`` raises the ``"auto"`` bound
  with it, and ``max_decoded_bytes=None`` turns both off.
* ``max_sample_bytes`` (off by default; ``Pipeline.decode`` takes it from
  ``shards(max_sample_bytes=)``): the sample's fields, gz fields counted at their
  inflated size and the others as stored, may not add up to more.

A refusal is a ``ShardError`` naming the field, the sample, the shard and the argument
to raise.

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
from .._units import MAX_BYTES, parse_bytes, parse_optional_bytes
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
#: ``max_decoded_sample_bytes="auto"``: this many times ``max_decoded_bytes`` (1 GiB at
#: its default): a sample of a few fields each near the per-field bound decodes, a
#: sample of many such fields (a bomb spread over fields) is refused; raising the
#: per-field bound for big volumes raises this one with it.
SAMPLE_BOUND_FACTOR = 4

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
        max_decoded_sample_bytes: the most bytes the fields of one sample may decode to
            together (gz fields inflated, images and npz arrays decoded; fields kept as
            bytes not counted), checked before they are produced. ``"auto"`` (default):
            4 x ``max_decoded_bytes`` (1 GiB; None if that is None); None: no limit.
        max_sample_bytes: the most bytes a sample's fields may add up to, gz fields at
            their inflated size, the others as stored; None: no limit.

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
        max_decoded_sample_bytes: int | str | None = "auto",
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
        self.max_decoded_sample_bytes = sample_bound(
            max_decoded_sample_bytes, per_field=self.max_decoded_bytes
        )
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

    def _limit(self, room: _Room, *, inflating: bool) -> tuple[int | None, str]:
        """The most bytes the next bounded step of a field (a gzip layer, an image, an
        npz field) may produce, and what says so: ``max_decoded_bytes``, or what the
        fields before it leave of a per-sample bound, whichever is less. So a sample's
        fields are refused before their bytes exist, not after. (``room.option`` keeps
        the argument that binds, for the message.)"""
        best = self.max_decoded_bytes
        label, room.option = f"max_decoded_bytes={best}", "max_decoded_bytes"
        rooms = [(room.decoded, "max_decoded_sample_bytes", self.max_decoded_sample_bytes)]
        if inflating:  # max_sample_bytes counts gz fields at their inflated size
            rooms.append((room.sample, "max_sample_bytes", self.max_sample_bytes))
        for left, option, bound in rooms:
            if left is not None and (best is None or left < best):
                best, room.option = left, option
                label = f"what the fields before it leave of {option}={bound}"
        return best, label

    def _decode_field(self, field: str, data: bytes, room: _Room) -> Any:
        """The decoded value; counts what it decoded to in ``room``."""
        name = field
        fn = _find([self.decoders], name)
        decoded = 0  # bytes the bounded steps produced (max_decoded_sample_bytes)
        while fn is None and (name.lower() == "gz" or name.lower().endswith(".gz")):
            limit, label = self._limit(room, inflating=True)
            data = fmt.gunzip(data, limit=limit, limit_name=label)
            decoded = len(data)  # the last layer's output is what stays
            name = name[:-3]
            fn = _find([self.decoders], name)
        room.take(sample=len(data), decoded=decoded)
        if fn is None:
            for handler in self.handlers:
                if isinstance(handler, ImageDecoder):
                    if handler.applies(name):
                        return self._image(handler, data, room)
                    continue
                value = handler("." + name, data)
                if value is not None:
                    return value
            fn = _find(self._tables(), name) if name else None
        if fn is None or fn is _KEEP:
            return data
        if isinstance(fn, ImageDecoder):
            return self._image(fn, data, room)
        if fn is fmt.decode_npz:
            limit, label = self._limit(room, inflating=False)
            arrays = fmt.decode_npz(data, limit=limit, limit_name=label)
            room.take(decoded=sum(int(getattr(a, "nbytes", len(a))) for a in arrays.values()))
            return arrays
        return fn(data)

    def _image(self, decoder: ImageDecoder, data: bytes, room: _Room) -> Any:
        limit, label = self._limit(room, inflating=False)
        value, need = decoder.decode_counted(
            data, bound=limit, bound_name=label, option=room.option
        )
        room.take(decoded=need)
        return value

    def __call__(self, sample: Mapping[str, Any], /) -> dict[str, Any] | _Skipped:
        """The decoded sample (a new dict), or ``SKIPPED`` under ``on_error="skip"``."""
        out: dict[str, Any] = {}
        room = _Room(self.max_decoded_sample_bytes, self.max_sample_bytes)
        for field, value in sample.items():
            if field.startswith("__") or not isinstance(value, bytes | bytearray | memoryview):
                out[field] = value
                continue
            try:
                out[field] = self._decode_field(field, bytes(value), room)
                if room.decoded is not None and room.decoded < 0:  # the limits prevent it
                    room.option = "max_decoded_sample_bytes"
                    raise fmt.DecodedSizeError(
                        f"the fields up to this one decode to more than "
                        f"max_decoded_sample_bytes={self.max_decoded_sample_bytes}"
                    )
                if room.sample is not None and room.sample < 0:
                    room.option = "max_sample_bytes"
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
                        f"raise {room.option}= of decode() (e.g. {room.option}='4GiB'; "
                        "None: no limit) if such samples are expected"
                    )
                return self.fail(sample, f"cannot decode field {field!r}", fix=fix, cause=exc)
        return out


class _Room:
    """What one sample's fields may still add up to under each per-sample bound (None:
    no such bound): ``decoded`` (``max_decoded_sample_bytes``: bytes the bounded
    decoders produce) and ``sample`` (``max_sample_bytes``: gz fields inflated, others
    as stored). One per call: a ``Decoder`` is shared by threads."""

    __slots__ = ("decoded", "option", "sample")

    def __init__(self, decoded: int | None, sample: int | None) -> None:
        self.decoded, self.sample = decoded, sample
        self.option = "max_decoded_bytes"  # the argument whose limit the last step had

    def take(self, *, sample: int = 0, decoded: int = 0) -> None:
        if self.sample is not None:
            self.sample -= sample
        if self.decoded is not None:
            self.decoded -= decoded


def sample_bound(value: int | str | None, *, per_field: int | None) -> int | None:
    """``max_decoded_sample_bytes`` as bytes: ``"auto"`` is ``SAMPLE_BOUND_FACTOR`` x the
    per-field ``max_decoded_bytes`` (None, no limit, when that is None); None: no limit;
    otherwise a byte size."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None if per_field is None else min(MAX_BYTES, SAMPLE_BOUND_FACTOR * per_field)
    try:
        return parse_optional_bytes(value, name="max_decoded_sample_bytes")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (or 'auto', or None for no limit)") from None


def decode_sample(sample: Mapping[str, Any], /, *specs: DecodeSpec) -> dict[str, Any]:
    """Decode one sample with ``Decoder(*specs)``; see the module docstring."""
    out = Decoder(*specs)(sample)
    assert isinstance(out, dict)  # on_error="raise" never skips
    return out
