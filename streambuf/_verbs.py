"""The WebDataset-style verbs of ``Pipeline``: ``decode``, ``to_tuple``, ``rename``,
``map_dict``, ``select``.

Each is a plain ``map``/``filter`` stage over a picklable sample function from
``streambuf.sources`` (``Decoder``, ``ToTuple``, ``Rename``, ``MapDict``), so it
checkpoints and resumes like any other stage (no state of its own), crosses into
DataLoader workers, and under ``on_error="skip"`` is followed by ``filter(not_skipped)``
that drops the samples it skipped (counted and logged per worker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from ._failures import OnError

if TYPE_CHECKING:
    from .wds.decoders import DecodeSpec

__all__ = ["SampleVerbs"]


class SampleVerbs:
    """Mixed into ``Pipeline``; see the module docstring."""

    if TYPE_CHECKING:
        _src: Any

        def map(self, fn: Callable[[Any], Any], /, *, threads: int = 1) -> Self: ...

        def filter(self, fn: Callable[[Any], bool], /) -> Self: ...

    def _sample_fn(self, fn: Any, *, threads: int = 1) -> Self:
        from .wds import not_skipped

        pipe = self.map(fn, threads=threads)
        return pipe.filter(not_skipped) if fn.on_error == "skip" else pipe

    def decode(
        self,
        *specs: DecodeSpec,
        threads: int = 1,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        max_decoded_bytes: int | str | None = 256 << 20,
        max_sample_bytes: int | str | None = None,
        max_decoded_sample_bytes: int | str | None = "auto",
    ) -> Self:
        """Decode WebDataset sample fields by extension (``streambuf.wds.Decoder``):
        raw bytes unless a decoder matches; built-ins for ``*.gz`` (then the inner
        extension), npy, npz, tenbin, cbor, msgpack, json, txt/cls, pth and images.

        ``specs``: an image spec (``"rgb8"`` default, ``"torchrgb8"``, ``"pil"``, ...,
        webdataset's names), mappings ``{"ext": fn}``, webdataset handlers.
        ``on_error="skip"`` drops a sample that fails (counted, logged, at most
        ``max_failures`` per worker). ``max_decoded_bytes`` bounds one image, npz field
        or gzip layer; ``max_decoded_sample_bytes`` what one sample's fields decode to
        together (``"auto"``: 4 x ``max_decoded_bytes``, 1 GiB; raise it, e.g. "8GiB", for
        samples of several large volumes; None: no limit), each field stopped as soon as
        the total would pass it; ``max_sample_bytes`` (None: the
        ``shards(max_sample_bytes=)`` of this pipeline, if any) the sample with gz fields
        at their inflated size. See ``streambuf.wds.decoders``."""
        from .wds.decoders import Decoder

        if max_sample_bytes is None:
            options = getattr(getattr(self._src, "reader", None), "options", None)
            max_sample_bytes = getattr(options, "max_sample_bytes", None)
        fn = Decoder(
            *specs,
            on_error=on_error,
            max_failures=max_failures,
            max_decoded_bytes=max_decoded_bytes,
            max_sample_bytes=max_sample_bytes,
            max_decoded_sample_bytes=max_decoded_sample_bytes,
        )
        return self._sample_fn(fn, threads=threads)

    def to_tuple(
        self,
        *fields: str | list[str],
        missing_is_error: bool = True,
        none_is_error: bool | None = None,
        on_error: OnError = "raise",
        max_failures: int | None = None,
    ) -> Self:
        """Turn dict samples into tuples of fields, as webdataset's ``to_tuple``:
        ``to_tuple("jpg;png", "cls")`` (first alternative present; ``"jpg cls"`` is
        split). A missing field raises ``ShardError`` naming it and the sample (or gives
        None with ``missing_is_error=False``). ``streambuf.wds.ToTuple``."""
        from .wds.fields import ToTuple

        fn = ToTuple(
            *fields,
            missing_is_error=missing_is_error,
            none_is_error=none_is_error,
            on_error=on_error,
            max_failures=max_failures,
        )
        return self._sample_fn(fn)

    def rename(
        self,
        *,
        keep: bool = True,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        **mapping: str | list[str],
    ) -> Self:
        """Rename fields, as webdataset's ``rename``: ``rename(image="jpg;png",
        label="cls")`` (new=old); ``keep=False`` keeps only the renamed fields.
        ``streambuf.wds.Rename``."""
        from .wds.fields import Rename

        fn = Rename(keep=keep, on_error=on_error, max_failures=max_failures, **mapping)
        return self._sample_fn(fn)

    def map_dict(
        self,
        *,
        threads: int = 1,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        **fns: Callable[[Any], Any],
    ) -> Self:
        """Apply a function per field, as webdataset's ``map_dict``:
        ``map_dict(jpg=augment, cls=remap)`` (on a copy of each sample; ``threads`` as in
        ``map``). ``streambuf.wds.MapDict``."""
        from .wds.fields import MapDict

        fn = MapDict(on_error=on_error, max_failures=max_failures, **fns)
        return self._sample_fn(fn, threads=threads)

    def select(self, predicate: Callable[[Any], bool], /) -> Self:
        """Keep the samples for which ``predicate`` is true (webdataset's ``select``;
        the same stage as ``filter``)."""
        return self.filter(predicate)
