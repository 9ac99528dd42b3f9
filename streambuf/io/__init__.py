"""Byte transport: URL lists (``urls``), resumable streams over local files, HTTP, S3 and
fsspec (``opener``, ``_http``, ``_resumable``), and the node-local shard cache
(``cache``, ``_cache_io``, ``_manifest``). Knows bytes and URLs, not samples or
pipelines. Remote protocols need ``pip install streambuf[remote]``."""

from __future__ import annotations

from .cache import CacheStats, ShardCache, cached_file
from .opener import IOCounters, IOStats, ShardReader, open_stream
from .urls import expand_urls, redact, secrets_of

__all__ = [
    "CacheStats",
    "IOCounters",
    "IOStats",
    "ShardCache",
    "ShardReader",
    "cached_file",
    "expand_urls",
    "open_stream",
    "redact",
    "secrets_of",
]
