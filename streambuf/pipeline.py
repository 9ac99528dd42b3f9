"""``Pipeline``: a fluent, picklable ``IterableDataset`` built from stages.

A pipeline starts from a *source*: a sequence of shards (file names, URLs, or plain
items, each its own shard), optionally with ``expand(shard) -> Iterable[sample]``, or a
``SourceReader`` (``shards()``, ``video.clips()``). Each copy of the pipeline (one per
DataLoader worker, per rank) reads only its share, as ``streambuf.sharding`` defines:
shard order seeded by (seed, epoch), split across rank x worker so that every sample is
delivered exactly once per epoch.

Fluent methods return a *new* pipeline (the original is unchanged), so a base pipeline
can be reused. Everything stored must pickle (functions at module level, not lambdas,
when DataLoader workers are spawned).

Determinism: with a seed, the output order of one (rank, worker) is a function of
(seed, epoch, rank, world size, num_workers) alone; ``Loader(in_order=True)`` then makes
the whole sequence deterministic.

State: ``state_dict()``/``load_state_dict()`` checkpoint an in-process iteration (the
``Loader`` has its own, over its workers); see docs/design.md, "State and resume".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from torch.utils.data import IterableDataset

from . import _state
from ._contracts import Source, SourceReader, WorkerContext
from ._counters import PipelineStats
from ._dataset import DatasetIndices, DatasetItems, GetItem, check_dataset, is_map_style
from ._diagnosis import Diagnosis, diagnose, render
from ._iteration import Iteration
from ._meter import StageMeter, StageStats
from ._shared import SharedInt
from ._source_kinds import IterableSource, SequenceSource
from ._tuner import START_THREADS
from ._units import check_int
from ._verbs import SampleVerbs
from .compose import Stage as UserStage
from .packing import Pack
from .prefetch import parse_threads
from .sharding import Equalize, Sharding, current_rank_world, current_worker, equal_batch_counts
from .stages import (
    Batch,
    Filter,
    Flatten,
    Map,
    Prefetch,
    Shuffle,
    Stage,
    stateful_then_reordered,
)

__all__ = ["Pipeline"]


class Pipeline(SampleVerbs, IterableDataset[Any]):
    """A streaming dataset: source -> shard split -> stages.

    Args:
        source: a sequence of shards or items (each item is a shard of one sample), or a
            one-shot iterable (split by position; not resumable).
        expand: ``expand(shard) -> Iterable[sample]``; None means the shard is the sample.
        reader: instead of ``expand``, a ``SourceReader`` that reads the slot's shards
            (with lanes, seeking to resume).
        shuffle_shards: permute the shard order each epoch, seeded by (seed, epoch).
        seed: the base seed for shard order and shuffle stages.
        samples_per_shard: sample count of each shard (an int for all, or a sequence);
            needed only by ``equalize`` when ``expand``/``reader`` is given.
        equalize: None, ``"drop"`` or ``"pad"``: make every rank yield the same number of
            batches (an unequal count hangs DDP). Needs a ``.batch()`` stage.
        rank, world_size: override ``torch.distributed`` (to simulate ranks); otherwise
            they are read each time an iteration starts.
    """

    def __init__(
        self,
        source: Sequence[Any] | Iterable[Any],
        /,
        *,
        expand: Callable[[Any], Iterable[Any]] | None = None,
        reader: SourceReader | None = None,
        shuffle_shards: bool = False,
        seed: int = 0,
        samples_per_shard: int | Sequence[int] | None = None,
        equalize: Equalize | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        sharding = Sharding.pick(locals())
        if expand is not None and reader is not None:
            raise ValueError("give expand= or reader=, not both")
        if expand is not None and not callable(expand):
            raise TypeError(f"expand={expand!r} must be callable")
        if isinstance(source, str | bytes):
            raise TypeError("source must be a sequence of shards, not one string; wrap it in [...]")
        if is_map_style(source):  # a map-style dataset: read by index, each index once
            source = DatasetItems(source)
        src: Source = (
            SequenceSource(source, expand, reader)
            if isinstance(source, Sequence)
            else IterableSource(source)
        )
        self._setup(src, sharding)

    @classmethod
    def from_dataset(
        cls,
        dataset: Any,
        /,
        *,
        shuffle: bool = False,
        seed: int = 0,
        threads: int | str = 1,
        rank: int | None = None,
        world_size: int | None = None,
        equalize: Equalize | None = None,
    ) -> Pipeline:
        """A pipeline over a map-style dataset (a ``torch.utils.data.Dataset`` with
        ``__len__`` and ``__getitem__``): its items are ``dataset[i]``.

        The indices ``0 .. len(dataset) - 1`` are split over rank x worker as a list of
        items is (``streambuf.sharding``): each index is read once per epoch over all
        ranks and workers, never one past the end (whatever ``__getitem__`` does there),
        and the pipeline resumes exactly, as any pipeline does. ``Pipeline(dataset)``
        reads a map-style dataset the same way, on one thread.

        Args:
            dataset: ``len(dataset)`` (an int >= 0) and ``dataset[i]``; it must pickle
                to reach worker processes. For an iterable (a generator, an
                ``IterableDataset``) use ``sb.Pipeline(iterable)``.
            shuffle: permute the index order each epoch, seeded by (seed, epoch).
                Default False.
            seed: the base seed of the index order and the shuffle stages. Default 0.
            threads: threads calling ``dataset[i]`` concurrently in each worker (an
                int, or ``"auto"``: chosen by measurement, as ``map(threads="auto")``);
                the order stays the index order. Default 1: read inline.
            rank, world_size: override ``torch.distributed`` (to simulate ranks).
                Default None: read when an iteration starts.
            equalize: None, ``"drop"`` or ``"pad"``: the same batch count on every rank
                (needs a ``.batch()`` stage). Default None.
        """
        check_dataset(dataset)
        parse_threads(threads)  # refused here, not by the map built below
        sharding = Sharding.pick(
            dict(
                shuffle_shards=shuffle,
                seed=seed,
                equalize=equalize,
                rank=rank,
                world_size=world_size,
            ),
            shuffle_shards="shuffle",
        )
        if threads == 1:
            return cls._of(SequenceSource(DatasetItems(dataset)), sharding)
        return cls._of(SequenceSource(DatasetIndices(dataset)), sharding).map(
            GetItem(dataset), threads=threads
        )

    @classmethod
    def _of(cls, src: Source, sharding: Sharding) -> Pipeline:
        """A pipeline over a Source built by a factory (``shards()``, ``video.clips()``,
        ``mix()``) with the ``Sharding`` it built from its own keyword arguments."""
        pipe = cls.__new__(cls)
        IterableDataset.__init__(pipe)
        pipe._setup(src, sharding)
        return pipe

    def _setup(self, src: Source, sharding: Sharding) -> None:
        # what Iteration opens (the one Source protocol, streambuf._contracts.Source) and
        # who reads what of it: all a pipeline holds besides its stages
        self._src = src
        self._sharding = sharding
        if sharding.equalize is not None:  # here, not in a worker at the first batch
            if src.num_shards() is None:
                raise ValueError(
                    f"equalize={sharding.equalize!r} needs a sequence source (its length must "
                    "be known); pass a list of shards"
                )
            self.sizes()  # samples_per_shard: given, and one count per shard
        self._stages: tuple[Stage, ...] = ()
        self._meter: StageMeter | None = StageMeter(0)  # time per stage, shared with workers
        self._epoch = SharedInt(0)
        self._current: Iteration | None = None  # the in-process iteration (state_dict)
        self._resume: dict[str, Any] | None = None  # loaded, for the next iteration

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_current"] = None  # threads and locks stay in this process
        return state

    # -- fluent construction -----------------------------------------------------------
    def _with(self, stage: Stage) -> Pipeline:
        if any(isinstance(s, Batch) for s in self._stages) and not isinstance(
            stage, Map | Filter | Prefetch
        ):
            raise ValueError(
                f"{stage.name}() after .batch(): only map, filter and prefetch may follow "
                "batching; move it before .batch()"
            )
        if any(isinstance(s, Pack) for s in self._stages) and not isinstance(
            stage, Map | Filter | Prefetch | Batch
        ):
            raise ValueError(
                f"{stage.name}() after .pack(): only map, filter, batch and prefetch may "
                "follow packing (a block has no position of its own to resume from); "
                "move it before .pack()"
            )
        stages = (*self._stages, stage)
        if stage.reorders and stateful_then_reordered(self._stages) is None:
            unsaveable = stateful_then_reordered(stages)
            if unsaveable is not None:  # iterating is fine; a mid-epoch resume is not
                warnings.warn(
                    f"{unsaveable} (load_state_dict() refuses a state saved mid-epoch)",
                    stacklevel=3,
                )
        new = self.__class__.__new__(self.__class__)
        new.__dict__.update(self.__dict__)
        new._stages = stages
        new._meter = StageMeter(len(new._stages))
        new._current, new._resume = None, None
        return new

    def map(
        self,
        fn: Callable[[Any], Any],
        /,
        *,
        threads: int | str = 1,
        ordered: bool = True,
        max_items: int | None = None,
        max_bytes: int | str | None = None,
        adaptive: bool = True,
        max_threads: int | None = None,
    ) -> Pipeline:
        """Apply ``fn`` to each item, on ``threads`` threads inside each worker.

        ``threads="auto"``: the count is chosen by measurement (up to ``max_threads``,
        default 64, and what ``max_bytes`` has room for): it grows while the rate rises
        and shrinks when fewer threads deliver clearly more (a GIL-bound function); in a
        Loader, worker 0 measures and every worker takes its count (docs/design.md,
        "Autotuned parallelism"); pin a number to turn it off.

        ``adaptive`` (default): while running ``fn`` inline in the worker's own thread
        measures faster than the threads (a cheap function holding the GIL), it runs
        inline; re-checked as the run goes (``streambuf.prefetch``). If ``fn`` has a
        ``set_epoch(epoch)`` method it is called at the start of each epoch in every
        worker, so per-epoch randomness needs no extra call."""
        return self._with(
            Map(
                fn,
                threads=threads,
                ordered=ordered,
                max_items=max_items,
                max_bytes=max_bytes,  # type: ignore[arg-type]
                adaptive=adaptive,
                max_threads=max_threads,
            )
        )

    def compose(self, stage: Any, /) -> Pipeline:
        """Add a stage you wrote: an instance of a ``streambuf.Stage`` subclass (the
        contract: ``streambuf.compose``; prove it resumes with
        ``streambuf.testing.check_resume``)."""
        if not isinstance(stage, UserStage):
            raise TypeError(
                f"compose() takes an instance of a streambuf.Stage subclass, got "
                f"{type(stage).__name__}; for a function use .map(fn) or .filter(fn)"
            )
        return self._with(stage)

    def flatten(self) -> Pipeline:
        """Yield the elements of each item (an item that is a list of samples, e.g. the
        clips ``video.decode_member`` returns for one tar sample, becomes samples)."""
        if any(isinstance(s, Flatten | Pack) for s in self._stages):
            raise ValueError("a pipeline has at most one .flatten() or .pack() stage")
        return self._with(Flatten())

    def pack(
        self,
        seq_len: int,
        /,
        *,
        key: str | None = "tokens",
        eos: int | None = None,
        drop_last: bool = True,
        pad: int = 0,
    ) -> Pipeline:
        """Pack tokenized documents into blocks of ``seq_len`` tokens: each sample's 1-D
        integer array (``sample[key]``; the sample itself with ``key=None``), followed by
        ``eos`` when given, concatenated in stream order and cut; each output is
        ``{"tokens": int64 [seq_len], "document_ids": int32 [seq_len]}`` (the index of
        the document each position came from, within the block; -1: padding). The last
        partial block is dropped (``drop_last=True``) or padded with ``pad``. Every
        token exactly once, exact and elastic resume (``streambuf.packing``)."""
        if any(isinstance(s, Flatten | Pack) for s in self._stages):
            raise ValueError("a pipeline has at most one .flatten() or .pack() stage")
        return self._with(Pack(seq_len, key=key, eos=eos, drop_last=drop_last, pad=pad))

    def filter(self, fn: Callable[[Any], bool], /) -> Pipeline:
        """Keep the items for which ``fn`` is true (equalize then pads by repetition)."""
        return self._with(Filter(fn))

    def shuffle(
        self, buffer_items: int, /, *, max_bytes: int | str | None = None, seed: int | None = None
    ) -> Pipeline:
        """Bounded shuffle; seeded by (seed, epoch, rank, worker)."""
        return self._with(Shuffle(buffer_items, max_bytes=max_bytes, seed=seed))  # type: ignore[arg-type]

    def batch(
        self,
        n: int,
        /,
        *,
        collate: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
    ) -> Pipeline:
        """Group ``n`` items and collate them (``default_collate`` unless given)."""
        if any(isinstance(s, Batch) for s in self._stages):
            raise ValueError("a pipeline has at most one .batch() stage")
        return self._with(Batch(n, collate, drop_last))

    def prefetch(self, *, max_items: int, max_bytes: int | str) -> Pipeline:
        """Run everything upstream ahead on a background thread, bounded."""
        return self._with(Prefetch(max_items, max_bytes))

    def _has_stage_buffers(self) -> bool:
        """True if a stage holds items ahead (threaded map, prefetch) or the source does
        (a reader's lanes, a mix's sources)."""
        return self._src.buffers or any(s.buffers for s in self._stages)

    def _decodes_on(self) -> str | None:
        """The device the source decodes onto (``Source.decodes_on``), None: host."""
        return self._src.decodes_on()

    def _fixed_stage_bytes(self) -> int:
        """Bytes the stages hold in each copy whatever the budget (``pack``'s block)."""
        return sum(s.fixed_bytes() for s in self._stages)

    def _fixed_stage_holders(self) -> str:
        """The stages that hold fixed bytes, with their bytes, for an error message."""
        return ", ".join(
            f"{s.name!r} {s.fixed_bytes()}" for s in self._stages if s.fixed_bytes() > 0
        )

    def _per_stage_bytes(self, stage_bytes: int | None) -> int | None:
        """A Loader's stage grant split evenly among the stages that hold items ahead
        (threaded maps without their own max_bytes, and the source's lanes)."""
        if stage_bytes is None:
            return None
        n = self._src.buffers + sum(
            1 for s in self._stages if isinstance(s, Map) and s.buffers and s.max_bytes is None
        )
        return max(1, stage_bytes // max(1, n))

    # -- epochs -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; reaches DataLoader workers, persistent ones included.

        After ``load_state_dict`` (before the iteration that resumes it), only the
        epoch the state resumes is accepted (the saved epoch, or the next one when the
        state is complete), as ``Loader.set_epoch``: another raises ``ValueError``."""
        epoch = check_int(epoch, name="epoch")
        if self._resume is not None:
            _state.check_set_epoch(self._resume, epoch)
        self._epoch.value = epoch

    @property
    def epoch(self) -> int:
        return self._epoch.value

    @property
    def seed(self) -> int:
        return self._sharding.seed

    @property
    def rank_world(self) -> tuple[int, int] | None:
        """The ``(rank, world_size)`` given to the constructor, or None: then they are
        read from ``torch.distributed`` each time an iteration starts."""
        return self._sharding.rank_world

    def num_shards(self) -> int | None:
        """Shards in the source (None for a one-shot iterable)."""
        return self._src.num_shards()

    def _workers_ended(self) -> None:
        """The Loader shut its workers down (or killed them): gauges of the threads they
        ran go back to 0 (``stats().threads``)."""
        for s in self._stages:
            if isinstance(s, Map):
                s.workers_ended()
        ended = getattr(self._src, "workers_ended", None)
        if callable(ended):
            ended()

    def stats(self) -> PipelineStats:
        """Everything this pipeline counts, summed over every worker that ran it (or any
        fluent descendant) since it was built: ``shards`` (``shards()``: shard reads,
        samples, I/O, cache), ``videos`` (``video.clips()``), ``mix`` (``mix()``: samples
        taken per source, restarts) and a mix's ``sources``; ``as_dict(flat=True)`` for
        loggers. ``threads``: the count each ``map(threads="auto")`` stage (and the lanes of
        ``shards(lanes="auto")``, stage ``"shards"``) uses now."""
        threads = tuple(
            t for t in (s.thread_stats() for s in self._stages if isinstance(s, Map)) if t
        )
        got = self._src.stats()
        return replace(got, threads=(*got.threads, *threads)) if threads else got

    def stage_stats(self) -> tuple[StageStats, ...]:
        """Where the time went, per stage, summed over every worker that ran this
        pipeline (not its fluent ancestors or descendants): the source, each stage in
        order, then ``downstream`` (handing outputs on). See ``streambuf.StageStats``."""
        if self._meter is None:  # (benchmarks measure the pipeline without it)
            return ()
        names = [self._source_name(), *(s.name for s in self._stages)]
        got = self._meter.stats(names)
        return tuple(replace(s, threads=n) for s, n in zip(got, self._stage_threads()))

    def _stage_threads(self) -> list[int]:
        """Threads per link (source, stages, downstream): the source's lanes (chosen at
        run time: the mean thread count so far), a threaded map's per worker
        (``"auto"``: the mean over its runs so far), else 1."""
        lanes = self._src.lanes()
        out = [max(1, lanes[0]) if lanes else 1]
        tuned = self._src.stats().threads  # a reader whose threads are chosen at run time
        if tuned and tuned[0].mean:
            out[0] = max(1, round(tuned[0].mean))
        for stage in self._stages:
            n = 1
            if isinstance(stage, Map) and stage.threaded:
                n, auto = parse_threads(stage.threads, stage.max_threads)
                got = stage.thread_stats() if auto else None
                if got is not None:  # the mean count over its runs
                    n = round(got.mean) if got.mean else START_THREADS
            out.append(max(1, n))
        return [*out, 1]

    def report(self, *, wait_fraction: float | None = None, workers: int = 0) -> str:
        """Where the time went, per stage (``stage_stats()``) as a table in the order data
        flows, and which stage limits throughput with the one change most likely to help
        (``streambuf._diagnosis``). ``Loader.report()`` adds the consumer's side."""
        stages, found = self._diagnose(wait_fraction=wait_fraction, workers=workers)
        return render(stages, found)

    def _diagnose(
        self, *, wait_fraction: float | None, workers: int
    ) -> tuple[tuple[StageStats, ...], Diagnosis | None]:
        stages = self.stage_stats()
        return stages, diagnose(stages, wait_fraction=wait_fraction, workers=workers)

    def _source_name(self) -> str:
        src = self._src
        reader = getattr(src, "reader", None)
        if reader is not None:
            kind = type(reader).__name__.removesuffix("Reader").lower() or "reader"
            return f"source ({kind})"
        expand = getattr(src, "expand", None)
        if expand is not None:
            return f"source (expand {getattr(expand, '__name__', type(expand).__name__)})"
        kind = getattr(src, "state_kind", "items")
        return {"lanes": "source (items)", "none": "source (iterable)"}.get(
            kind, f"source ({kind})"
        )

    # -- iteration --------------------------------------------------------------------
    def context(self) -> WorkerContext:
        """The context this copy runs in now (rank/world, worker, epoch, seed)."""
        rank, world = self.rank_world or current_rank_world()
        worker, nworkers = current_worker()
        return WorkerContext(rank, world, worker, nworkers, self._epoch.value, self.seed)

    def sizes(self) -> list[int]:
        """Samples per shard (from ``samples_per_shard``; 1 each for plain items)."""
        known = self._src.sizes()
        if known is not None:
            return known
        n = self._src.num_shards() or 0
        sps = self._sharding.samples_per_shard
        arg = self._sharding.arg_names.get("samples_per_shard", "samples_per_shard")
        if sps is None:
            raise ValueError(
                f"equalize={self._sharding.equalize!r} needs the number of samples per shard: pass "
                f"{arg}= (an int, or one count per shard)"
            )
        if isinstance(sps, int):
            return [sps] * n
        if len(sps) != n:
            raise ValueError(
                f"{arg} has {len(sps)} counts for {n} shards: give one count "
                "per shard, in the order of the shard list (or one int for all)"
            )
        return list(sps)

    def batch_counts(
        self, *, world_size: int, num_workers: int, epoch: int = 0, progress: Any = None
    ) -> list[list[int]] | None:
        """With ``equalize``: batches per [rank][worker] for ``epoch`` (of what is left,
        given an elastic resume's ``progress``); else None."""
        mode = self._sharding.equalize
        if mode is None:
            return None
        batch = [s for s in self._stages if isinstance(s, Batch)]
        if not batch:
            raise ValueError("equalize counts batches: add a .batch(n) stage")
        if any(isinstance(s, Pack) for s in self._stages):
            raise ValueError(
                "equalize counts batches from the samples per shard, and .pack() makes a "
                "number of blocks that depends on the documents' lengths: drop equalize"
            )
        if self._src.num_shards() is None:
            raise ValueError("equalize needs a sequence source (its length must be known)")
        sizes = self.sizes()
        order = self._sharding.order(len(sizes), epoch)
        return equal_batch_counts(
            sizes,
            order,
            world_size=world_size,
            num_workers=num_workers,
            batch_size=batch[0].n,
            drop_last=batch[0].drop_last,
            mode=mode,
            progress=progress,
        )

    def __iter__(self) -> Iterator[Any]:
        on = self._decodes_on()
        if on is not None:
            from torch.utils.data import get_worker_info

            if get_worker_info() is not None:
                raise RuntimeError(
                    f"this pipeline decodes onto {on!r} and runs only in the training "
                    "process: iterate it with num_workers=0 (streambuf.Loader refuses "
                    "workers for it), or use decoder='cpu' in DataLoader workers"
                )
        ctx = self.context()
        resume, progress, ctx = _state.plan_pipeline(self, ctx, self._resume)
        self._resume = None
        it = self._iterate(ctx, stage_bytes=None, resume=resume, progress=progress)
        self._current = it
        return iter(it)

    def _iterate(
        self,
        ctx: WorkerContext,
        *,
        stage_bytes: int | None,
        resume: dict[str, Any] | None = None,
        progress: Any = None,
    ) -> Iteration:
        """One run as the copy described by ``ctx``, with ``stage_bytes`` for the stage
        buffers (a Loader's grant per worker; None: each stage's own default)."""
        return Iteration(self, ctx, stage_bytes=stage_bytes, resume=resume, progress=progress)

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state of the current in-process iteration: what it has delivered, as
        plain data (JSON-serialisable, small). Before iterating: the start of an epoch."""
        return _state.pipeline_state(self, self._current)

    def load_state_dict(self, state: dict[str, Any] | Sequence[dict[str, Any]], /) -> None:
        """Resume the next iteration where ``state`` (one state, or the states of all
        ranks of a run with another layout) left off; see docs/design.md."""
        self._resume = _state.check_loadable(self, state)

    def __repr__(self) -> str:
        stages = "".join(f".{s.name}" for s in self._stages)
        n = self._src.num_shards()
        return f"Pipeline(<{'?' if n is None else n} shards>){stages}"
