"""streambuf: byte-bounded, sharded prefetch buffers that keep GPUs fed from streams.

Public API only; see README.md and DESIGN.md.
"""

from __future__ import annotations

from .buffer import BoundedBuffer, BufferStats, ShardedBuffer
from .errors import (
    BufferClosed,
    ShardError,
    StageError,
    StreambufError,
    TooManyFailures,
    VideoError,
    WorkerError,
)
from .prefetch import Prefetcher, prefetch
from .sizing import nbytes

__version__ = "0.1.0"

__all__ = [
    "BoundedBuffer",
    "BufferClosed",
    "BufferStats",
    "Prefetcher",
    "ShardError",
    "ShardedBuffer",
    "StageError",
    "StreambufError",
    "TooManyFailures",
    "VideoError",
    "WorkerError",
    "nbytes",
    "prefetch",
]
