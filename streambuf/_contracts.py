"""The contracts between a ``Pipeline`` and the modules that run it: where a copy runs
(``WorkerContext``), what a shard reader opens (``ReaderRun``, ``SourceReader``), what a
pipeline reads from (``Source``), and the part of a pipeline that its iteration, state
and mixing read (``PipelineView``).

A leaf of the package: ``pipeline.py`` implements these, and the modules below it
(``_iteration``, ``_state``, ``_verbs``) name them instead of importing the Pipeline, so
the layers import one way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .buffer import Order

if TYPE_CHECKING:
    from ._counters import PipelineStats
    from ._ledger import Ledger
    from ._source import Access
    from .sharding import Sharding
    from .stages import Stage

__all__ = ["PipelineView", "ReaderRun", "Source", "SourceReader", "WorkerContext"]


@dataclass(frozen=True)
class WorkerContext:
    """Where one copy of a pipeline runs: the inputs of its deterministic order."""

    rank: int
    world_size: int
    worker: int
    num_workers: int
    epoch: int
    seed: int
    # the bytes a Loader charged to its max_bytes for this copy's source read buffers
    # (``shards()``' lanes: ``TarReader.fit``); None: not charged (they come off the
    # source's stage grant)
    read_bytes: int | None = None

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
    adaptive: bool = False  # lanes <-> inline, by measurement (streambuf._inline)
    max_items: int = 64
    max_bytes: int = 256 << 20
    name: str = "source"
    threads: int | str | None = None  # threads over the lanes (None: one each; "auto")
    on_threads: Callable[[int], None] | None = None  # told the thread count in use


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


class Source(Protocol):
    """What a pipeline reads from: ``streambuf._source_kinds.SequenceSource`` (items,
    ``expand``, a ``SourceReader``'s shards), ``IterableSource`` (one-shot) or a mix's
    ``streambuf.mixing.MixSpec``. Configuration only (picklable). ``Iteration`` opens it;
    ``_state`` and ``_identity`` ask it what a saved state records and checks, never
    which kind it is."""

    @property
    def buffers(self) -> bool:
        """It holds samples ahead of the stages (a reader's lanes, a mix's sources), so
        it takes a share of the stage byte grant."""
        ...

    @property
    def state_kind(self) -> str:
        """The shape of its cursor and pending rows in a snapshot: ``"lanes"`` (a
        ``SourceRun``'s), ``"mix"`` or ``"none"`` (not resumable)."""
        ...

    def open(
        self,
        sharding: Sharding,
        ctx: WorkerContext,
        *,
        ledger: Ledger,
        stage_bytes: int | None,
        resume: dict[str, Any] | None,
        progress: Any,
    ) -> Any:
        """The slot's run for one pass: iterates ``Rec`` objects; ``cursor()``,
        ``unissued()`` and ``partial`` for the snapshot."""
        ...

    def access(self, sharding: Sharding, ctx: WorkerContext, *, stage_bytes: int | None) -> Any:
        """The slot's ``Access`` for fetching samples back by position (no lanes)."""
        ...

    def num_shards(self) -> int | None:
        """Shards (None: a one-shot iterable); a saved state's ``shards``."""
        ...

    def names(self) -> list[str] | None:
        """Each shard's identity (``streambuf._identity.shard_name``), or None: the
        shards are identified by their count."""
        ...

    def fingerprint(self) -> str:
        """What the source adds to a state's ``fingerprint`` beyond its shard list
        ("" for a list of shards; a mix: its sources' whole fingerprints)."""
        ...

    def identity(self) -> str:
        """What the source adds to the identity of the data beyond its shard list, in
        order, without its stages (``streambuf._state.data_identity``: what ranks must
        agree on): a sequence's items' identity, a mix's sources' data identities."""
        ...

    def lanes(self) -> tuple[int, str] | None:
        """``(lanes, order)`` a slot's shards are read with (before the cap at its shard
        count), or None when it cannot be known: an exact resume restores each lane's
        cursor, so a change of either resumes elastically."""
        ...

    def has_data(self, sharding: Sharding, epoch: int, slot: int, slots: int) -> bool:
        """Whether ``slot`` of ``slots`` has anything to read in ``epoch`` (True when
        only a run can tell)."""
        ...

    def elastic_refusal(self) -> str | None:
        """Why it cannot resume at another layout, or None when it can."""
        ...

    def state_refusal(self) -> str | None:
        """Why it has no state to save at all (a one-shot iterable, or a mix with one
        among its sources), or None when it has."""
        ...

    def sizes(self) -> list[int] | None:
        """Samples per shard when the source itself knows them (plain items: 1 each),
        else None (``samples_per_shard`` says)."""
        ...

    def label(self, shard: int) -> str:
        """Shard ``shard`` in a message."""
        ...

    def stats(self) -> PipelineStats:
        """What it counted, summed over every worker that read it (``Pipeline.stats()``)."""
        ...

    def decodes_on(self) -> str | None:
        """The device its samples are decoded onto (a video reader's
        ``decoder="cuda"``), or None: host memory. Such a source runs only in the
        training process (a Loader refuses workers for it)."""
        ...


class PipelineView(Protocol):
    """What ``_iteration``, ``_state`` and ``mixing`` read of a ``Pipeline`` (its
    configuration; they never change it except through ``set_epoch``)."""

    _src: Source
    _sharding: Sharding
    _stages: tuple[Stage, ...]

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
