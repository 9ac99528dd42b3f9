"""``Pipeline``: a fluent, picklable ``IterableDataset`` built from stages.

A pipeline starts from a *source*: a sequence of shards (file names, URLs, or plain
items, each its own shard), optionally with ``expand(shard) -> Iterable[sample]``. Each
copy of the pipeline (one per DataLoader worker, per rank) reads only its share, as
``streambuf.sharding`` defines: shard order seeded by (seed, epoch), split across
rank x worker so that every sample is delivered exactly once per epoch.

Fluent methods return a *new* pipeline (the original is unchanged), so a base pipeline
can be reused. Everything stored must pickle (functions at module level, not lambdas,
when DataLoader workers are spawned).

Determinism: with a seed, the output order of one (rank, worker) is a function of
(seed, epoch, rank, world size, num_workers) alone; ``Loader(in_order=True)`` then makes
the whole sequence deterministic.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch.utils.data import IterableDataset

from ._failures import OnError
from ._shared import SharedInt
from .sharding import (
    Equalize,
    assign,
    current_rank_world,
    current_worker,
    equal_batch_counts,
    hash_seed,
    shard_order,
)
from .stages import (
    batch_items,
    filter_items,
    flatten_items,
    map_items,
    prefetch_items,
    shuffle_items,
)

__all__ = ["Pipeline", "ReadShards", "WorkerContext"]


class ReadShards(Protocol):
    """Reads a slot's shards: yields ``islice(samples(shard), offset, None, stride)`` for
    every shard, each sample exactly once (any interleaving). ``stage_bytes`` is the byte
    budget the Loader grants the stage (None outside a Loader); ``ctx`` says where it
    runs (epoch and seed included, for per-epoch randomness)."""

    def __call__(
        self,
        shards: Sequence[Any],
        /,
        *,
        stride: int,
        offset: int,
        stage_bytes: int | None,
        ctx: WorkerContext,
    ) -> Iterator[Any]: ...


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


@dataclass(frozen=True)
class _Stage:
    kind: str
    fn: Any = None
    args: dict[str, Any] = field(default_factory=dict)


class Pipeline(IterableDataset[Any]):
    """A streaming dataset: source -> shard split -> stages.

    Args:
        source: a sequence of shards or items (each item is a shard of one sample).
        expand: ``expand(shard) -> Iterable[sample]``; None means the shard is the sample.
        reader: instead of ``expand``, reads a whole list of shards at once (e.g. several
            concurrently, in lanes): ``reader(shards, stride=, offset=, stage_bytes=, ctx=)``
            must yield, for each shard, the samples ``islice(samples, offset, None,
            stride)``, each exactly once, in any interleaving.
        shuffle_shards: permute the shard order each epoch, seeded by (seed, epoch).
        seed: the base seed for shard order and shuffle stages.
        samples_per_shard: sample count of each shard (an int for all, or a sequence);
            needed only by ``equalize`` when ``expand`` is given.
        equalize: None, ``"drop"`` or ``"pad"``: make every rank yield the same number of
            batches (an unequal count hangs DDP). Needs a ``.batch()`` stage.
        rank, world_size: override ``torch.distributed`` (to simulate ranks, or when
            the process group is created after the pipeline).
    """

    def __init__(
        self,
        source: Sequence[Any] | Iterable[Any],
        /,
        *,
        expand: Callable[[Any], Iterable[Any]] | None = None,
        reader: ReadShards | None = None,
        shuffle_shards: bool = False,
        seed: int = 0,
        samples_per_shard: int | Sequence[int] | None = None,
        equalize: Equalize | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        if equalize not in (None, "drop", "pad"):
            raise ValueError(f"equalize={equalize!r} must be None, 'drop' or 'pad'")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank= and world_size=, or neither")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self._source = source
        self._is_seq = isinstance(source, Sequence)
        if expand is not None and reader is not None:
            raise ValueError("give expand= or reader=, not both")
        self._expand = expand
        self._reader = reader
        self._shuffle_shards = shuffle_shards
        self._seed = int(seed)
        self._samples_per_shard = samples_per_shard
        self._equalize = equalize
        self._rank_world: tuple[int, int] | None = (
            None if rank is None or world_size is None else (rank, world_size)
        )
        self._stages: tuple[_Stage, ...] = ()
        self._epoch = SharedInt(0)

    # -- fluent construction -----------------------------------------------------------
    def _with(self, stage: _Stage) -> Pipeline:
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(self.__dict__)
        new._stages = (*self._stages, stage)
        return new

    def map(
        self,
        fn: Callable[[Any], Any],
        /,
        *,
        threads: int = 1,
        ordered: bool = True,
        max_items: int | None = None,
        max_bytes: int | str | None = None,
    ) -> Pipeline:
        """Apply ``fn`` to each item, on ``threads`` threads inside each worker.

        If ``fn`` has a ``set_epoch(epoch)`` method it is called at the start of each
        epoch in every worker, so per-epoch randomness needs no extra call."""
        return self._with(
            _Stage(
                "map",
                fn,
                {
                    "threads": threads,
                    "ordered": ordered,
                    "max_items": max_items,
                    "max_bytes": max_bytes,
                },
            )
        )

    def decode(
        self,
        decoders: Mapping[str, Callable[[bytes], Any]] | None = None,
        /,
        *,
        threads: int = 1,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        max_decoded_bytes: int | str | None = 256 << 20,
    ) -> Pipeline:
        """Decode WebDataset sample fields by extension (``streambuf.sources.Decoder``):
        raw bytes unless a decoder matches; built-ins for npy, json, txt/cls, pth, images.
        ``on_error="skip"`` drops a sample that fails (counted, logged, at most
        ``max_failures`` per worker); ``max_decoded_bytes`` bounds one decoded image."""
        from .sources.decoders import Decoder, not_skipped

        fn = Decoder(
            decoders,
            on_error=on_error,
            max_failures=max_failures,
            max_decoded_bytes=max_decoded_bytes,
        )
        pipe = self.map(fn, threads=threads)
        return pipe.filter(not_skipped) if on_error == "skip" else pipe

    def flatten(self) -> Pipeline:
        """Yield the elements of each item (an item that is a list of samples, e.g. the
        clips ``video.decode_member`` returns for one tar sample, becomes samples)."""
        return self._with(_Stage("flatten"))

    def filter(self, fn: Callable[[Any], bool], /) -> Pipeline:
        """Keep the items for which ``fn`` is true (equalize then pads by repetition)."""
        return self._with(_Stage("filter", fn))

    def shuffle(
        self, buffer_items: int, /, *, max_bytes: int | str | None = None, seed: int | None = None
    ) -> Pipeline:
        """Bounded shuffle; seeded by (seed, epoch, rank, worker)."""
        return self._with(
            _Stage(
                "shuffle",
                None,
                {"buffer_items": buffer_items, "max_bytes": max_bytes, "seed": seed},
            )
        )

    def batch(
        self,
        n: int,
        /,
        *,
        collate: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
    ) -> Pipeline:
        """Group ``n`` items and collate them (``default_collate`` unless given)."""
        if any(s.kind == "batch" for s in self._stages):
            raise ValueError("a pipeline has at most one .batch() stage")
        return self._with(_Stage("batch", collate, {"n": n, "drop_last": drop_last}))

    def prefetch(self, *, max_items: int, max_bytes: int | str) -> Pipeline:
        """Run everything upstream ahead on a background thread, bounded."""
        return self._with(
            _Stage("prefetch", None, {"max_items": max_items, "max_bytes": max_bytes})
        )

    def _has_stage_buffers(self) -> bool:
        """True if a stage holds items ahead (threaded map, prefetch) or a reader is used."""
        return self._reader is not None or any(
            (s.kind == "map" and s.args["threads"] > 1) or s.kind == "prefetch"
            for s in self._stages
        )

    def _per_stage_bytes(self, stage_bytes: int | None) -> int | None:
        """A Loader's stage grant split evenly among the stages that hold items ahead
        (threaded maps without their own max_bytes, and the shard reader)."""
        if stage_bytes is None:
            return None
        n = (self._reader is not None) + sum(
            1
            for s in self._stages
            if s.kind == "map" and s.args["threads"] > 1 and s.args["max_bytes"] is None
        )
        return max(1, stage_bytes // max(1, n))

    # -- epochs -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; reaches DataLoader workers, persistent ones included."""
        self._epoch.value = int(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def rank_world(self) -> tuple[int, int] | None:
        """The ``(rank, world_size)`` given to the constructor, or None: then they are
        read from ``torch.distributed`` each time an iteration starts."""
        return self._rank_world

    # -- iteration --------------------------------------------------------------------
    def context(self) -> WorkerContext:
        """The context this copy runs in now (rank/world, worker, epoch, seed)."""
        rank, world = self._rank_world or current_rank_world()
        worker, nworkers = current_worker()
        return WorkerContext(rank, world, worker, nworkers, self._epoch.value, self._seed)

    def _sizes(self) -> list[int]:
        n = len(self._source)  # type: ignore[arg-type]
        if self._expand is None and self._reader is None:
            return [1] * n
        sps = self._samples_per_shard
        if sps is None:
            raise ValueError(
                "equalize needs the number of samples per shard: pass samples_per_shard= "
                "(an int, or one count per shard)"
            )
        if isinstance(sps, int):
            return [sps] * n
        if len(sps) != n:
            raise ValueError(f"samples_per_shard has {len(sps)} counts for {n} shards")
        return list(sps)

    def _samples(self, ctx: WorkerContext, stage_bytes: int | None) -> Iterator[Any]:
        if not self._is_seq:  # a one-shot stream: every slot reads it, keeps its stride
            items: Iterable[Any] = self._source
            if self._expand is not None:
                items = itertools.chain.from_iterable(map(self._expand, items))
            yield from itertools.islice(items, ctx.slot, None, ctx.slots)
            return
        source: Sequence[Any] = self._source  # type: ignore[assignment]
        order = shard_order(
            len(source), seed=self._seed, epoch=ctx.epoch, shuffle=self._shuffle_shards
        )
        a = assign(len(source), order, ctx.slot, ctx.slots)
        if self._reader is not None:
            shards = [source[i] for i in a.shards]
            yield from self._reader(
                shards,
                stride=a.stride,
                offset=a.offset,
                stage_bytes=self._per_stage_bytes(stage_bytes),
                ctx=ctx,
            )
            return
        for i in a.shards:
            shard = source[i]
            samples = [shard] if self._expand is None else self._expand(shard)
            if a.stride == 1:
                yield from samples
            else:
                yield from itertools.islice(samples, a.offset, None, a.stride)

    def _stream(
        self, ctx: WorkerContext, stage_bytes: int | None, pass_index: int = 0
    ) -> Iterator[Any]:
        it: Iterator[Any] = self._samples(ctx, stage_bytes)
        for k, st in enumerate(self._stages):
            a = st.args
            set_epoch = getattr(st.fn, "set_epoch", None)
            if callable(set_epoch):  # stage functions with per-epoch randomness
                set_epoch(ctx.epoch)
            if st.kind == "map":
                mb = a["max_bytes"] or self._per_stage_bytes(stage_bytes) or "256MiB"
                it = map_items(
                    it,
                    st.fn,
                    threads=a["threads"],
                    ordered=a["ordered"],
                    max_items=a["max_items"],
                    max_bytes=mb,
                )
            elif st.kind == "filter":
                it = filter_items(it, st.fn)
            elif st.kind == "flatten":
                it = flatten_items(it)
            elif st.kind == "shuffle":
                base = self._seed if a["seed"] is None else a["seed"]
                seed = hash_seed(base, ctx.epoch, ctx.rank, ctx.worker, k, pass_index)
                it = shuffle_items(it, a["buffer_items"], max_bytes=a["max_bytes"], seed=seed)
            elif st.kind == "batch":
                it = batch_items(it, a["n"], collate=st.fn, drop_last=a["drop_last"])
            elif st.kind == "prefetch":
                it = prefetch_items(it, max_items=a["max_items"], max_bytes=a["max_bytes"])
        return it

    def batch_counts(
        self, *, world_size: int, num_workers: int, epoch: int = 0
    ) -> list[list[int]] | None:
        """With ``equalize``: batches per [rank][worker] for ``epoch``; else None."""
        if self._equalize is None:
            return None
        batch = [s for s in self._stages if s.kind == "batch"]
        if not batch:
            raise ValueError("equalize counts batches: add a .batch(n) stage")
        if not self._is_seq:
            raise ValueError("equalize needs a sequence source (its length must be known)")
        n = len(self._source)  # type: ignore[arg-type]
        order = shard_order(n, seed=self._seed, epoch=epoch, shuffle=self._shuffle_shards)
        return equal_batch_counts(
            self._sizes(),
            order,
            world_size=world_size,
            num_workers=num_workers,
            batch_size=batch[0].args["n"],
            drop_last=batch[0].args["drop_last"],
            mode=self._equalize,
        )

    def __iter__(self) -> Iterator[Any]:
        return self._iterate(self.context(), stage_bytes=None)

    def _iterate(self, ctx: WorkerContext, *, stage_bytes: int | None) -> Iterator[Any]:
        """Iterate as the copy described by ``ctx``, with ``stage_bytes`` for the stage
        buffers (a Loader's grant per worker; None: each stage's own default)."""
        counts = self.batch_counts(
            world_size=ctx.world_size, num_workers=ctx.num_workers, epoch=ctx.epoch
        )
        if counts is None:
            yield from self._stream(ctx, stage_bytes)
            return
        target = counts[ctx.rank][ctx.worker]
        produced = 0
        for pass_index in itertools.count():
            got = 0
            for item in self._stream(ctx, stage_bytes, pass_index):
                if produced == target:
                    return
                yield item
                produced += 1
                got += 1
            if produced == target:
                return
            if got == 0:
                raise ValueError(
                    f"equalize: rank {ctx.rank} worker {ctx.worker} must yield {target} "
                    f"batches but its stream is empty (a filter dropped everything?)"
                )

    def __repr__(self) -> str:
        stages = "".join(f".{s.kind}(...)" for s in self._stages)
        n = len(self._source) if self._is_seq else "?"  # type: ignore[arg-type]
        return f"Pipeline(<{n} shards>){stages}"
