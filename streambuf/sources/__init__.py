"""Network shard sources: URL lists, resumable streams, tar samples, decoders, lanes.

``expand_urls`` -> ``stream_shards`` (lanes of ``open_stream`` + ``iter_tar_records``)
-> ``Decoder`` (``formats``, ``images``) and the webdataset verbs (``fields``:
``ToTuple``, ``Rename``, ``MapDict``); ``shards`` wraps them in a ``streambuf.Pipeline`` (``TarReader`` per
worker, ``shard_stats`` for the counters); ``ShardOptions`` holds every reading option;
``ShardCache`` is the node-local cache of remote shards (``cache_dir``/``cache_limit``).
Remote protocols need ``pip install streambuf[remote]``.
"""

from __future__ import annotations

from .cache import CacheStats, ShardCache, cached_file
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
from .lanes import ShardStream, SourceStats, stream_shards
from .opener import IOCounters, IOStats, ShardReader, open_stream
from .options import ShardOptions
from .pipe import ShardCounters, ShardTotals, TarReader, shard_stats, shards
from .tar import iter_tar_records, iter_tar_samples
from .urls import expand_urls, redact, secrets_of

__all__ = [
    "DEFAULT_DECODERS",
    "IMAGE_SPECS",
    "SKIPPED",
    "CacheStats",
    "Decoder",
    "IOCounters",
    "IOStats",
    "ImageDecoder",
    "MapDict",
    "Rename",
    "ShardCache",
    "ShardCounters",
    "ShardOptions",
    "ShardReader",
    "ShardStream",
    "ShardTotals",
    "SourceStats",
    "TarReader",
    "ToTuple",
    "cached_file",
    "decode_sample",
    "expand_urls",
    "iter_tar_records",
    "iter_tar_samples",
    "not_skipped",
    "open_stream",
    "redact",
    "register_decoder",
    "secrets_of",
    "shard_stats",
    "shards",
    "stream_shards",
]
