"""Tar shard sources: tar records and samples (``tar``), a slot's shards read in lanes
(``lanes``, ``access``), every reading option (``ShardOptions``) and the ``shards()``
factory that wraps them in a ``streambuf.Pipeline`` (``pipe``: ``TarReader`` per worker,
``shard_stats`` for the counters). Bytes come from ``streambuf.io``; per-sample decoding
is ``streambuf.wds``.
"""

from __future__ import annotations

from .lanes import ShardStream, SourceStats, stream_shards
from .options import ShardOptions
from .pipe import ShardTotals, TarReader, shard_stats, shards
from .tar import iter_tar_records, iter_tar_samples

__all__ = [
    "ShardOptions",
    "ShardStream",
    "ShardTotals",
    "SourceStats",
    "TarReader",
    "iter_tar_records",
    "iter_tar_samples",
    "shard_stats",
    "shards",
    "stream_shards",
]
