"""Network shard sources: URL lists, resumable streams, tar samples, decoders, lanes.

``expand_urls`` -> ``stream_shards`` (lanes of ``open_stream`` + ``iter_tar_samples``)
-> ``Decoder``. Remote protocols need ``pip install streambuf[remote]``.
"""

from __future__ import annotations

from .decoders import DEFAULT_DECODERS, Decoder, decode_sample, register_decoder
from .lanes import ShardStream, SourceStats, stream_shards
from .opener import IOCounters, IOStats, ShardReader, open_stream
from .tar import iter_tar_samples
from .urls import expand_urls, redact, secrets_of

__all__ = [
    "DEFAULT_DECODERS",
    "Decoder",
    "IOCounters",
    "IOStats",
    "ShardReader",
    "ShardStream",
    "SourceStats",
    "decode_sample",
    "expand_urls",
    "iter_tar_samples",
    "open_stream",
    "redact",
    "register_decoder",
    "secrets_of",
    "stream_shards",
]
