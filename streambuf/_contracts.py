"""The contracts between a ``Pipeline`` and the modules that run it: where a copy runs
(``WorkerContext``), what a shard reader opens (``ReaderRun``, ``SourceReader``), and the
part of a pipeline that its iteration, state and mixing read (``PipelineView``).

A leaf of the package: ``pipeline.py`` implements these, and the modules below it
(``_iteration``, ``_state``, ``_verbs``) name them instead of importing the Pipeline, so
the layers import one way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .buffer import Order

if TYPE_CHECKING:
    from ._source import Access
    from .sharding import Equalize
    from .stages import Stage

__all__ = ["PipelineView", "ReaderRun", "SourceReader", "WorkerContext"]


@dataclass(frozen=True)
class WorkerContext:
    """Where one copy of a pipeline runs: the inputs of its deterministic order."""

    rank: int
    world_size: int
    worker: int
    num_workers: int
    epoch: int
    seed: int

    @property
    def slot(self) -> int:
        return self.rank * self.num_workers + self.worker

    @property
    def slots(self) -> int:
        return self.world_size * self.num_workers


@dataclass
class ReaderRun:
    """What a ``SourceReader`` opens for one iteration: the access and its lanes."""

    access: Access
    lanes: int
    order: Order = "round_robin"
    max_items: int = 64
    max_bytes: int = 256 << 20
    name: str = "source"


class SourceReader(Protocol):
    """Reads the shards of a pipeline (``shards()``, ``video.clips()``): configuration
    only (picklable); ``open`` is called in each worker for each iteration with the
    slot's sample split (``stride``/``offset``) and its stage byte grant."""

    def open(
        self,
        source: Sequence[Any],
        /,
        *,
        ctx: WorkerContext,
        stage_bytes: int | None,
        stride: int,
        offset: int,
    ) -> ReaderRun: ...


class PipelineView(Protocol):
    """What ``_iteration``, ``_state`` and ``mixing`` read of a ``Pipeline`` (its
    configuration; they never change it except through ``set_epoch``)."""

    _source: Any
    _src: Any  # the Source: SequenceSource, IterableSource or a mix's MixSpec
    _is_seq: bool
    _expand: Callable[[Any], Iterable[Any]] | None
    _reader: SourceReader | None
    _mix: Any  # a streambuf.mixing.MixSpec when built by mix()
    _stages: tuple[Stage, ...]
    _seed: int
    _shuffle_shards: bool
    _equalize: Equalize | None

    @property
    def seed(self) -> int: ...

    def sizes(self) -> list[int]: ...

    def batch_counts(
        self, *, world_size: int, num_workers: int, epoch: int = 0, progress: Any = None
    ) -> list[list[int]] | None: ...

    def _per_stage_bytes(self, stage_bytes: int | None) -> int | None: ...

    def context(self) -> WorkerContext: ...

    def num_shards(self) -> int | None: ...

    def set_epoch(self, epoch: int) -> None: ...
