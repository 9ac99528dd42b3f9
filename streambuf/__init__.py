"""streambuf: byte-bounded, sharded prefetch buffers that keep GPUs fed from streams.

Public API only; see README.md and docs/design.md.
"""

from __future__ import annotations

from . import audio as audio
from . import io as io  # byte transport: open_stream, expand_urls, the shard cache
from . import nodes as nodes  # torchdata.nodes: Prefetcher, ParallelMapper, PipelineNode
from . import video as video
from . import wds as wds  # per-sample WebDataset functions: Decoder, ToTuple, ...
from ._contracts import WorkerContext
from ._counters import PipelineStats, ThreadStats
from ._meter import StageStats
from .budget import BudgetStats, CreditBudget
from .buffer import BoundedBuffer, BufferStats, ShardedBuffer
from .checkpointing import DistributedState, check_ranks
from .compose import Stage, StageState
from .depth import DepthTuner, TunerDecision
from .device import DevicePrefetcher
from .errors import (
    AudioError,
    BufferClosed,
    ShardError,
    StageError,
    StreambufError,
    TooManyFailures,
    VideoError,
    WorkerError,
)
from .loader import Loader
from .mixing import MixStats, mix, mix_stats
from .pipeline import Pipeline
from .prefetch import ThreadPrefetcher, prefetch
from .resources import Limits, Recommendation, read_limits, recommend
from .sizing import nbytes
from .sources.pipe import shards
from .stats import LoaderStats, StatsLog, log_every
from .token_files import token_files
from .window import Window

__version__ = "0.1.0"

__all__ = [
    "AudioError",
    "BoundedBuffer",
    "BudgetStats",
    "BufferClosed",
    "BufferStats",
    "CreditBudget",
    "DepthTuner",
    "DevicePrefetcher",
    "DistributedState",
    "Limits",
    "Loader",
    "LoaderStats",
    "MixStats",
    "Pipeline",
    "PipelineStats",
    "Recommendation",
    "ShardError",
    "ShardedBuffer",
    "Stage",
    "StageError",
    "StageState",
    "StageStats",
    "StatsLog",
    "StreambufError",
    "ThreadPrefetcher",
    "ThreadStats",
    "TooManyFailures",
    "TunerDecision",
    "VideoError",
    "Window",
    "WorkerContext",
    "WorkerError",
    "check_ranks",
    "log_every",
    "mix",
    "mix_stats",
    "nbytes",
    "prefetch",
    "read_limits",
    "recommend",
    "shards",
    "token_files",
]
