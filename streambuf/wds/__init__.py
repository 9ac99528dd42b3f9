"""Per-sample WebDataset functions: field decoders (``Decoder``, ``formats``, ``images``)
and the sample verbs (``fields``: ``ToTuple``, ``Rename``, ``MapDict``), with the skip
guard they share (``_guard``). Pure functions of a sample; nothing here reads bytes or
knows a ``Pipeline``."""

from __future__ import annotations

from .decoders import (
    DEFAULT_DECODERS,
    SKIPPED,
    Decoder,
    decode_sample,
    not_skipped,
    register_decoder,
)
from .fields import MapDict, Rename, ToTuple
from .images import IMAGE_SPECS, ImageDecoder

__all__ = [
    "DEFAULT_DECODERS",
    "IMAGE_SPECS",
    "SKIPPED",
    "Decoder",
    "ImageDecoder",
    "MapDict",
    "Rename",
    "ToTuple",
    "decode_sample",
    "not_skipped",
    "register_decoder",
]
