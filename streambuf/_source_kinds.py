"""The source kinds of a ``Pipeline``: how one slot's stream is opened.

``SequenceSource`` (a list of shards: items, ``expand``-ed shards, a ``SourceReader``'s
tar shards or videos, read by a ``SourceRun``) and ``IterableSource`` (a one-shot
iterable, split by position); a mix's ``MixSpec`` (``mixing.py``) is the third. Each is the
``Source`` protocol of ``streambuf._contracts``, which ``Iteration`` opens without asking
which kind it is.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._access import ExpandAccess, ItemAccess
from ._counters import PipelineStats
from ._identity import shard_name, shard_names
from ._ledger import Ledger, Rec
from ._source import SourceRun
from .sharding import Assignment, assign

if TYPE_CHECKING:
    from .sharding import Sharding

__all__ = ["IterableSource", "SequenceSource"]


# ``ctx`` is a ``WorkerContext``, not imported: the contracts name ``_source.Access``
@dataclass
class SequenceSource:
    """A list of shards: items (each a shard of one sample), ``expand``-ed shards, or a
    ``SourceReader``'s (tar shards, videos). Configuration (picklable); ``open`` splits
    the epoch's shard order for the slot (``streambuf.sharding``) and reads it with a
    ``SourceRun``; ``access`` is the same split for fetching samples back by position."""

    shards: Sequence[Any]
    expand: Any = None
    reader: Any = None

    state_kind = "lanes"

    @property
    def buffers(self) -> bool:
        return self.reader is not None  # items and expand= are read inline

    def decodes_on(self) -> str | None:
        decoder = getattr(self.reader, "decoder", "cpu")
        return None if decoder == "cpu" else str(decoder)

    def num_shards(self) -> int:
        return len(self.shards)

    def names(self) -> list[str] | None:
        """Names when the items are shard references (a reader's or ``expand``'s paths
        or URLs); plain items are samples, identified by count."""
        if self.reader is None and self.expand is None:
            return None
        if len(self.shards) and shard_name(self.shards[0]) is None:
            return None
        return shard_names(self.shards)

    def fingerprint(self) -> str:
        """ "" (the shard list is checked by identity, ``streambuf._identity``), or what
        a sequence of plain items says it is (``state_identity()``: e.g. ``token_files``'
        blocks name their files, whose order the block numbers depend on)."""
        identity = getattr(self.shards, "state_identity", None)
        return f";items[{identity()}]" if callable(identity) else ""

    def identity(self) -> str:
        return self.fingerprint()  # the items' identity is all a sequence adds

    def lanes(self) -> tuple[int, str] | None:
        """Items and ``expand``: one inline lane; a reader says its own (``lanes()``:
        ``shards()``'s ``lanes``/``order``, ``video.clips()``'s threads), or None."""
        if self.reader is None:
            return 1, "round_robin"
        lanes = getattr(self.reader, "lanes", None)
        return lanes() if callable(lanes) else None

    def has_data(self, sharding: Sharding, epoch: int, slot: int, slots: int) -> bool:
        return bool(self._split(sharding, epoch, slot, slots).shards)

    def elastic_refusal(self) -> str | None:
        return None

    def state_refusal(self) -> str | None:
        return None

    def sizes(self) -> list[int] | None:
        if self.reader is None and self.expand is None:
            return [1] * len(self.shards)
        return None

    def label(self, shard: int) -> str:
        return repr(self.shards[shard])[:200]

    def read_bytes(self, workers: int = 1) -> int:
        """A copy's read buffers as set (a reader's ``read_bytes``: ``shards()``' lanes)
        among ``workers`` copies, which a Loader charges to its ``max_bytes``; 0: none."""
        reads = getattr(self.reader, "read_bytes", None)
        return int(reads(self.shards, workers)) if callable(reads) else 0

    def read_cut(self, allot: int, workers: int, other_fixed: int = 0) -> tuple[str, bool] | None:
        """What a charge of ``allot`` bytes a worker does to the reads (``read_bytes``):
        a sentence and whether they still pass it, or None where they are as set."""
        note = getattr(self.reader, "cut_note", None)
        return note(self.shards, allot, workers, other_fixed) if callable(note) else None

    def stats(self) -> PipelineStats:
        """A reader's counters (``shards()``, ``video.clips()``: its ``stats()``)."""
        counted = getattr(self.reader, "stats", None)
        return counted() if callable(counted) else PipelineStats()

    def workers_ended(self) -> None:
        """The Loader's workers are gone: a reader's thread gauges go back to 0."""
        ended = getattr(self.reader, "workers_ended", None)
        if callable(ended):
            ended()

    def _split(self, sharding: Sharding, epoch: int, slot: int, slots: int) -> Assignment:
        n = len(self.shards)
        return assign(n, sharding.order(n, epoch), slot, slots)

    def _access(
        self, ctx: Any, split: Assignment, stage_bytes: int | None
    ) -> tuple[Any, dict[str, Any]]:
        if self.reader is not None:
            run = self.reader.open(
                self.shards,
                ctx=ctx,
                stage_bytes=stage_bytes,
                stride=split.stride,
                offset=split.offset,
            )
            lanes = dict(
                lanes=run.lanes,
                order=run.order,
                adaptive=run.adaptive,
                max_items=run.max_items,
                max_bytes=run.max_bytes,
                name=run.name,
                threads=run.threads,
                on_threads=run.on_threads,
            )
            return run.access, lanes
        if self.expand is None:
            return ItemAccess(self.shards), dict(lanes=1, name="source")
        return ExpandAccess(self.shards, self.expand), dict(lanes=1, name="source")

    def open(
        self,
        sharding: Sharding,
        ctx: Any,
        *,
        ledger: Ledger,
        stage_bytes: int | None,
        resume: dict[str, Any] | None,
        progress: Any,
    ) -> SourceRun:
        split = self._split(sharding, ctx.epoch, ctx.slot, ctx.slots)
        access, lanes = self._access(ctx, split, stage_bytes)
        return SourceRun(
            access,
            split.shards,
            ledger=ledger,
            stride=split.stride,
            offset=split.offset,
            cursor=resume["source"] if resume else None,
            pending=resume["pending"] if resume else None,
            progress=progress,
            **lanes,
        )

    def access(self, sharding: Sharding, ctx: Any, *, stage_bytes: int | None) -> Any:
        split = self._split(sharding, ctx.epoch, ctx.slot, ctx.slots)
        return self._access(ctx, split, stage_bytes)[0]


@dataclass
class IterableSource:
    """A one-shot iterable, split by position across slots (``islice``); not resumable
    and not fetchable."""

    items: Iterable[Any]

    state_kind = "none"
    buffers = False

    def decodes_on(self) -> None:
        return None

    def num_shards(self) -> None:
        return None

    def names(self) -> None:
        return None

    def fingerprint(self) -> str:
        return ""

    def identity(self) -> str:
        return ""

    def lanes(self) -> None:
        return None

    def has_data(self, sharding: Sharding, epoch: int, slot: int, slots: int) -> bool:
        return True  # its length is not known

    def elastic_refusal(self) -> str:
        return "a pipeline over a one-shot iterable cannot be resumed"

    def state_refusal(self) -> str:
        return (
            "a pipeline over a one-shot iterable has no state to save; give it a sequence "
            "(a list of shards or items) to make it resumable"
        )

    def sizes(self) -> None:
        return None

    def label(self, shard: int) -> str:
        return f"item {shard}"

    def stats(self) -> PipelineStats:
        return PipelineStats()

    def open(
        self,
        sharding: Sharding,
        ctx: Any,
        *,
        ledger: Ledger,
        stage_bytes: int | None,
        resume: dict[str, Any] | None,
        progress: Any,
    ) -> _OneShot:
        if resume is not None or progress is not None:
            raise ValueError(self.elastic_refusal())
        return _OneShot(self.items, ctx.slot, ctx.slots)

    def access(self, sharding: Sharding, ctx: Any, *, stage_bytes: int | None) -> Any:
        raise ValueError("a pipeline over a one-shot iterable cannot fetch samples back")


class _OneShot:
    """The run of an ``IterableSource``: samples ``slot``, ``slot + slots``, ..."""

    def __init__(self, items: Iterable[Any], slot: int, slots: int) -> None:
        self.items, self.slot, self.slots = items, slot, slots
        self.partial: dict[tuple[int, ...], list[int]] = {}

    def __iter__(self) -> Iterator[Rec]:
        for i, x in itertools.islice(enumerate(self.items), self.slot, None, self.slots):
            yield Rec(x, (0, i), i)

    def cursor(self) -> None:
        return None

    def unissued(self) -> list[list[Any]]:
        return []

    def close(self) -> None:
        pass
