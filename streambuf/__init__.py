"""streambuf: byte-bounded, sharded prefetch buffers that keep GPUs fed from streams.

Public API only; see README.md and DESIGN.md.
"""

from __future__ import annotations

from .budget import BudgetStats, CreditBudget
from .buffer import BoundedBuffer, BufferStats, ShardedBuffer
from .device import DevicePrefetcher
from .errors import (
    BufferClosed,
    ShardError,
    StageError,
    StreambufError,
    TooManyFailures,
    VideoError,
    WorkerError,
)
from .loader import Loader, LoaderStats
from .pipeline import Pipeline, WorkerContext
from .prefetch import Prefetcher, prefetch
from .sizing import nbytes

__version__ = "0.1.0"

__all__ = [
    "BoundedBuffer",
    "BudgetStats",
    "BufferClosed",
    "BufferStats",
    "CreditBudget",
    "DevicePrefetcher",
    "Loader",
    "LoaderStats",
    "Pipeline",
    "Prefetcher",
    "ShardError",
    "ShardedBuffer",
    "StageError",
    "StreambufError",
    "TooManyFailures",
    "VideoError",
    "WorkerContext",
    "WorkerError",
    "nbytes",
    "prefetch",
]
