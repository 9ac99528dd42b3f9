"""One run of a ``Pipeline`` for one slot (rank x worker): ``Iteration``.

It builds the slot's source (``streambuf._source.SourceRun``) and stages for each *pass*
(one, or more when ``equalize="pad"`` repeats the slot's stream), delivers their output,
settles what it delivers in the ledger, and can say at any moment, in plain data, where
it is (``snapshot()``):

    {"pass": p, "produced": n, "last": bool,       # n outputs delivered; stream ended?
     "source": {...cursor...},                     # SourceRun.cursor()
     "pending": [[shard, index, hint], ...],       # handed out, not settled, seq order
     "stages": {"k": {...}},                       # stages that hold samples (shuffle)
     "groups": [[[shard, index], ...], ...]}       # optional: partly delivered groups

``groups`` names, for each output of a user stage made of several samples and then
flattened with some of its children delivered, the samples it was made of
(``Ledger.groups``): a resume skips those children only where the stage makes that
output of the same samples again (``stages.Flatten``).

The snapshot describes exactly the outputs already delivered: everything the threads
ran ahead on is in ``pending`` or past a cursor. ``Iteration(resume=snapshot)`` continues
from it (the same slot of the same layout: identical remainder); ``progress=`` (a
``streambuf._elastic.Progress``) skips what another layout already delivered.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from ._ledger import Ledger, Rec
from ._meter import FLUSH, FLUSH_NS, SOURCE
from .sharding import assign
from .stages import Batch, Env

if TYPE_CHECKING:
    from ._contracts import PipelineView, WorkerContext

__all__ = ["Iteration"]


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


class Iteration:
    """See the module docstring."""

    def __init__(
        self,
        pipe: PipelineView,
        ctx: WorkerContext,
        *,
        stage_bytes: int | None,
        resume: dict[str, Any] | None = None,
        progress: Any = None,
    ) -> None:
        self.pipe, self.ctx = pipe, ctx
        self.stage_bytes = pipe._per_stage_bytes(stage_bytes)
        self.ledger = Ledger()
        self.resume = resume
        self.progress = progress
        self.pass_index = int(resume["pass"]) if resume else 0
        self.produced = int(resume["produced"]) if resume else 0
        self.last = bool(resume.get("last", False)) if resume else False
        counts = pipe.batch_counts(
            world_size=ctx.world_size,
            num_workers=ctx.num_workers,
            epoch=ctx.epoch,
            progress=progress,
        )
        self.target = None if counts is None else counts[ctx.rank][ctx.worker]
        self._source: Any = None  # the source's run (cursor, unissued, partial)
        self._env: Env | None = None
        self._batched = any(isinstance(s, Batch) for s in pipe._stages)
        self.metered = True  # counted in the pipeline's StageMeter (a mix's parts are not)

    @property
    def done(self) -> bool:
        if self.target is not None:
            return self.produced >= self.target
        return self.last

    # -- building one pass --------------------------------------------------------------
    def _open_source(self, env: Env, resume: dict[str, Any] | None) -> Iterator[Rec]:
        """The pipeline's source (``pipe._src``: a ``streambuf._contracts.Source``),
        opened for this slot and pass."""
        pipe = self.pipe
        src = pipe._src.open(
            pipe._sharding,
            self.ctx,
            ledger=self.ledger,
            stage_bytes=self.stage_bytes,
            resume=resume,
            progress=self.progress if self.pass_index == 0 else None,
        )
        self._source = src
        env.partial = src.partial
        # the partly delivered groups given again: an exact resume's own, an elastic
        # resume's those the source routed to this slot (``Progress.groups_for``)
        saved = (resume or {}).get("groups") or getattr(src, "groups", None) or []
        env.groups = {tuple(g[0]): g for g in saved}
        mode = pipe._sharding.equalize
        if mode is not None:
            sizes, ctx = pipe.sizes(), self.ctx
            # the epoch's first pass, fresh, reads each of its shards from the start to
            # the end (a resumed or elastic one from where it was, its pending samples
            # apart; "pad"'s later passes only as far as the deficit)
            fresh = resume is None and self.pass_index == 0 and self.progress is None
            return _within_declared(
                iter(src),
                sizes,
                src.access,
                pipe._src.label,
                mode,
                last=_last_indices(pipe, sizes, ctx) if fresh else None,
                arg=pipe._sharding.arg_names.get("samples_per_shard", "samples_per_shard"),
            )
        return iter(src)

    def _open_pass(self, resume: dict[str, Any] | None) -> Iterator[Rec]:
        ctx = self.ctx
        meter = getattr(self.pipe, "_meter", None) if self.metered else None
        env = Env(
            ledger=self.ledger,
            base_seed=self.pipe.seed,
            seed_parts=(ctx.epoch, ctx.rank, ctx.worker, self.pass_index),
            stage_bytes=self.stage_bytes,
            meter=meter,
            worker=ctx.worker,
            equalize=self.pipe._sharding.equalize,
        )
        self._env = env
        it = self._open_source(env, resume)
        if meter is not None:
            it = meter.wrap(it, SOURCE, ctx.worker, getattr(self._source, "held", None))
        states = (resume or {}).get("stages") or {}
        for k, stage in enumerate(self.pipe._stages):
            stage.set_epoch(ctx.epoch)
            it = stage.open(it, env, k, states.get(str(k)))
            if meter is not None:
                it = meter.wrap(it, k, ctx.worker, env.held.get(k))
        return it if self._batched else _lookahead(it)

    # -- delivery -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        for rec in self.records(settle=True):
            yield rec.value

    def records(self, *, settle: bool) -> Iterator[Rec]:
        """The outputs as ``Rec`` objects; with ``settle=False`` the caller settles each
        one in ``self.ledger`` (a mixer does, atomically with taking it on)."""
        resume = self.resume
        if resume is not None and self.done:
            return  # the saved state had delivered everything
        meter = getattr(self.pipe, "_meter", None) if self.metered else None
        down = meter.downstream(self.ctx.worker) if meter is not None else None
        clock = time.perf_counter_ns
        ns = n = 0
        last = clock()
        inner = self._records(settle, resume)
        try:
            for rec in inner:
                t = clock()
                yield rec
                if down is not None:  # handing it on: the transport, credits, the consumer
                    ns += clock() - t
                    n += 1
                    if n >= FLUSH or t - last >= FLUSH_NS:
                        down(ns, n)
                        ns = n = 0
                        last = t
        finally:
            inner.close()
            if down is not None and n:
                down(ns, n)

    def _records(self, settle: bool, resume: dict[str, Any] | None) -> Generator[Rec, None, None]:
        while True:
            resumed = resume is not None
            it = self._open_pass(resume)
            resume = None
            got = 0
            try:
                for rec in it:
                    if self.target is not None and self.produced >= self.target:
                        return
                    if settle:
                        self.ledger.settle_all(rec)
                    self.produced += 1
                    self.last = rec.last
                    got += 1
                    yield rec
                    if self.target is not None and self.produced >= self.target:
                        return
            finally:
                _close(it)
            if self.target is None or self.produced >= self.target:
                self.last = True
                return
            mode = self.pipe._sharding.equalize
            if mode == "drop":  # its count is within the slot's stream: never a repeat
                ctx = self.ctx
                raise ValueError(
                    f"equalize='drop': rank {ctx.rank} worker {ctx.worker} must yield "
                    f"{self.target} batches, counted from the samples per shard, and its "
                    f"stream ended after {self.produced}: a stage dropped samples (a filter, "
                    "a stage making one output of several), and starting the stream again "
                    "would repeat samples. Use equalize='pad' (it repeats samples to fill the "
                    "count, by design), or drop equalize"
                )
            # a resumed pass may have had nothing left, and so may the first pass after
            # an elastic resume (``progress``: all of its share done); the next repeats
            if got == 0 and not resumed and (self.pass_index > 0 or self.progress is None):
                ctx = self.ctx
                raise ValueError(
                    f"equalize: rank {ctx.rank} worker {ctx.worker} must yield {self.target} "
                    f"batches but its stream is empty (a filter dropped everything?)"
                )
            self.pass_index += 1

    def _fetch_access(self) -> Any:
        """An access to this slot's shards for fetching (no lanes started)."""
        return self.pipe._src.access(self.pipe._sharding, self.ctx, stage_bytes=self.stage_bytes)

    def refetch(self, positions: list[tuple[int, ...]]) -> dict[tuple[int, ...], Any]:
        """Outputs at ``positions`` made again: their source samples fetched (grouped by
        shard) and put through the stages (each stage's ``replay``)."""
        access = self._fetch_access()
        groups: dict[int, list[tuple[int, Any]]] = {}
        for pos in positions:
            groups.setdefault(pos[0], []).append((pos[1], None))
        out: dict[tuple[int, ...], Any] = {}
        for shard, wanted in groups.items():
            got = dict(access.fetch(shard, wanted))
            for pos in positions:
                if pos[0] == shard and pos[1] in got:
                    value = got[pos[1]]
                    for stage in self.pipe._stages:
                        value = stage.replay(value, pos)
                    out[pos] = value
        return out

    def snapshot(self) -> dict[str, Any]:
        """Where this iteration is, as plain data (see the module docstring)."""
        with self.ledger.lock:
            env, src = self._env, self._source
            if src is None and (self.resume is not None or self.progress is not None):
                return self._not_opened()
            out = {
                "pass": self.pass_index,
                "produced": self.produced,
                "last": self.done,
                "source": src.cursor() if src is not None else None,
                "pending": self.ledger.pending() + (src.unissued() if src is not None else []),
                "stages": {str(k): f() for k, f in env.snapshots.items()} if env else {},
            }
            # a group flatten has expanded is the ledger's; one not reached yet, env's
            groups = self.ledger.groups() + (list(env.groups.values()) if env else [])
            if groups:
                out["groups"] = groups
            return out

    def _not_opened(self) -> dict[str, Any]:
        """A resumed iteration's snapshot before its source opened: nothing delivered
        since the resume, so where the resume put it (it said "the epoch's start" before,
        and a state taken between ``iter()`` and the first item started the epoch over)."""
        if self.resume is not None:
            return copy.deepcopy(self.resume)
        ctx, n = self.ctx, self.pipe._src.num_shards() or 0
        a = assign(n, self.pipe._sharding.order(n, ctx.epoch), ctx.slot, ctx.slots)
        out: dict[str, Any] = {
            "pass": 0,
            "produced": 0,
            "last": False,
            "source": None,
            "pending": copy.deepcopy(self.progress.pending_for(a.shards, a.stride, a.offset)),
            "stages": {},
        }
        groups = self.progress.groups_for(a.shards, a.stride, a.offset)
        if groups:
            out["groups"] = copy.deepcopy(groups)
        return out


def _within_declared(
    it: Iterator[Rec],
    declared: list[int],
    access: Any,
    label: Callable[[int], str],
    mode: str,
    *,
    last: dict[int, int] | None = None,
    arg: str = "samples_per_shard",
) -> Iterator[Rec]:
    """The source's records, refusing a shard whose sample count is not the declared one:
    with ``equalize`` the batch counts come from ``samples_per_shard``.

    * **Understated** (a sample past the declared count): the slot's stream would end
      early and silently lose the rest ("pad") or more than needed ("drop"). With "pad"
      it is always seen: the first pass reaches the target only once every declared
      sample of the slot was taken, and ``.batch()`` looks one sample ahead, so the next
      record, if any, is one past a declared count.
    * **Overstated** (a shard read to its end short of its count): the batch counts
      would be made up by repeating samples, silently (declared 1000 for shards of 40:
      each sample ~21 times). Checked in a fresh pass (``last`` given: not resumed,
      where pending samples come back out of order) that ends by running out: each of
      the slot's shards must have given the last sample the declared count puts in this
      slot (``last``: shard -> index; a slot that shares a shard reads every m-th
      sample of it), an empty shard included. Under ``on_error="skip"`` a failed shard
      gives only its good prefix, counted and logged where it failed, so a short shard
      is not refused there.
    """
    top: dict[int, int] = {}  # shard -> the highest sample index read in this pass
    try:
        for rec in it:
            shard, index = rec.pos[0], rec.pos[1]
            if index < declared[shard]:
                if last is not None and index > top.get(shard, -1):
                    top[shard] = index
                yield rec
                continue
            raise ValueError(
                f"shard {_shard_name(access, label, shard)} has more samples than "
                f"{arg} declares: {declared[shard]} declared, at least "
                f"{index + 1} read (sample {index}); equalize={mode!r} counts batches from "
                "the declared counts, so the extra samples would be lost; pass the true "
                f"counts ({arg}=[...], one per shard)"
            )
        policy = getattr(access, "policy", None)
        if last is None or getattr(policy, "on_error", "raise") == "skip":
            return
        short = [(s, top.get(s, -1)) for s, i in sorted(last.items()) if top.get(s, -1) < i]
        if short:
            shard, end = short[0]
            more = f" (and {len(short) - 1} more shards)" if len(short) > 1 else ""
            ended = f"it ended at sample {end}" if end >= 0 else "it gave no sample"
            raise ValueError(
                f"shard {_shard_name(access, label, shard)} has fewer samples than "
                f"{arg} declares: {declared[shard]} declared, {ended}{more}; "
                f"equalize={mode!r} counts batches from the declared counts, "
                "so the missing samples would be made up by repeating others; pass the "
                f"true counts ({arg}=[...], one per shard)"
            )
    finally:
        _close(it)


def _last_indices(pipe: Any, sizes: list[int], ctx: Any) -> dict[int, int]:
    """Shard -> the index of the last sample this slot reads of it, by the declared
    counts (``sharding.assign``: the slot's shards, and its stride and offset where it
    shares one); shards the slot gets no sample of are left out."""
    workers = max(1, ctx.num_workers)
    slot, slots = ctx.rank * workers + ctx.worker, max(1, ctx.world_size) * workers
    n = len(sizes)
    a = assign(n, pipe._sharding.order(n, ctx.epoch), slot, slots)
    out = {}
    for s in a.shards:
        k = len(range(a.offset, sizes[s], a.stride))
        if k:
            out[s] = a.offset + (k - 1) * a.stride
    return out


def _shard_name(access: Any, label: Callable[[int], str], shard: int) -> str:
    return str(access.name(shard)) if hasattr(access, "name") else label(shard)


def _lookahead(it: Iterator[Rec]) -> Iterator[Rec]:
    """Mark the last record of a stream (without batches, each output is a record)."""
    nxt = next(it, None)
    while nxt is not None:
        cur, nxt = nxt, next(it, None)
        cur.last = nxt is None
        yield cur
