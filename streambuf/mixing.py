"""``mix``: samples drawn from several pipelines at chosen proportions, resumable.

``mix([a, b], weights=[0.7, 0.3])`` is a ``Pipeline`` whose source draws, for each
sample, one of the source pipelines with probability proportional to its weight (among
those not exhausted) and takes that pipeline's next sample. Stages after it (``shuffle``,
``batch``, ...) see the blend.

* **Each source keeps its own sharding**: every slot (rank x worker) runs its own share
  of each source (its lanes, its stages, its part of the stage byte grant).
* **Determinism**: draw ``d`` of a slot is a function of (seed, epoch, rank, worker, d)
  (a counter-based generator), so the blend is a function of the layout and the data.
* **Stop**: ``"all_exhausted"``: an exhausted source drops out, the others go on (every
  sample of every source once per epoch); ``"first_exhausted"``: the epoch ends with the
  first source that runs out; ``"never"``: an exhausted source starts again (a new pass,
  counted in ``restarts``); the stream does not end.
* **Positions**: a sample is ``(source, pass, *its position in the source)``.
* **State**: the draw count, which sources are done, their restarts, and each source's
  own snapshot; samples taken from a source but not delivered are pending and are made
  again from their positions on resume (``Iteration.refetch``: fetched and put through
  the source's stages). Exact resume only (the same layout).
* **Errors** from a source keep their type, with a note naming the source.

``pipe.stats().mix`` (or ``mix_stats(pipe)``) gives the samples taken from each source
and its restarts, summed over every worker that ran the pipeline; ``pipe.stats().sources``
what each source counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from ._counters import PipelineStats, SharedCounters
from ._ledger import Ledger, Rec
from ._units import check_choice, check_int, check_weight
from .errors import add_note
from .sharding import Sharding, hash_seed

if TYPE_CHECKING:
    from ._contracts import WorkerContext
    from ._iteration import Iteration
    from .pipeline import Pipeline

__all__ = ["MixStats", "mix", "mix_stats"]

Stop = Literal["all_exhausted", "first_exhausted", "never"]
_M64 = (1 << 64) - 1


def _uniform(seed: int, counter: int) -> float:
    """A number in [0, 1): splitmix64 of (seed, counter)."""
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


@dataclass(frozen=True)
class MixStats:
    """Samples taken from each source (``taken[k]``) and its restarts (``stop="never"``)."""

    taken: tuple[int, ...]
    restarts: tuple[int, ...]

    def shares(self) -> tuple[float, ...]:
        total = sum(self.taken) or 1
        return tuple(t / total for t in self.taken)

    @classmethod
    def of(cls, totals: dict[str, int], sources: int) -> MixStats:
        """From the totals of ``mix_counters(sources)``."""
        return cls(
            tuple(totals[f"taken/{k}"] for k in range(sources)),
            tuple(totals[f"restarts/{k}"] for k in range(sources)),
        )


_TAKEN = tuple(f"taken/{k}" for k in range(64))  # the per-sample counter names, made once


def mix_counters(sources: int) -> SharedCounters:
    """The counters of a mix: samples taken from each source and its restarts."""
    return SharedCounters(
        [f"taken/{k}" for k in range(sources)] + [f"restarts/{k}" for k in range(sources)]
    )


@dataclass(frozen=True)
class MixSpec:
    """What ``mix`` was given (picklable): the mixed pipeline's Source (the protocol
    ``streambuf._contracts.Source``). Its shards are its sources (a sample's position
    starts with the source's index); its sources resume only as saved."""

    pipelines: tuple[Pipeline, ...]
    weights: tuple[float, ...]
    seed: int
    stop: Stop
    counters: SharedCounters = field(compare=False)

    state_kind = "mix"
    buffers = True  # each source's lanes and stages: a share of the stage grant

    def num_shards(self) -> int:
        return len(self.pipelines)

    def decodes_on(self) -> str | None:
        return next((d for p in self.pipelines if (d := p._decodes_on())), None)

    def names(self) -> None:
        return None  # identified by count; the sources' own lists are in fingerprint()

    def fingerprint(self) -> str:
        from ._state import fingerprint

        return f"mix[{self.stop};{','.join(fingerprint(p) for p in self.pipelines)}]"

    def identity(self) -> str:
        from ._state import data_identity

        return f"mix[{','.join(data_identity(p) for p in self.pipelines)}]"

    def lanes(self) -> None:
        return None  # each source's own, inside its snapshot

    def has_data(self, sharding: Sharding, epoch: int, slot: int, slots: int) -> bool:
        return True  # its sources' shares: known only by running them

    def elastic_refusal(self) -> str:
        return (
            "a mix() pipeline resumes only at the layout it was saved at (same world size "
            "and num_workers)"
        )

    def state_refusal(self) -> str | None:
        """A mix saves its sources' states: one that has none refuses for the mix (its
        samples could not be fetched back at the resume)."""
        for k, p in enumerate(self.pipelines):
            refused = p._src.state_refusal()
            if refused is not None:
                return f"{self.label(k)}: {refused}"
        return None

    def sizes(self) -> None:
        return None

    def label(self, shard: int) -> str:
        return f"mixed source {shard} ({self.pipelines[shard]!r})"

    def workers_ended(self) -> None:
        """The Loader's workers are gone: each source's thread gauges go back to 0."""
        for p in self.pipelines:
            p._workers_ended()

    def stats(self) -> PipelineStats:
        """Its draws, and what each source counts."""
        return PipelineStats(
            mix=MixStats.of(self.counters.totals(), len(self.pipelines)),
            sources=tuple(p.stats() for p in self.pipelines),
        )

    def open(
        self,
        sharding: Sharding,
        ctx: WorkerContext,
        *,
        ledger: Ledger,
        stage_bytes: int | None,
        resume: dict[str, Any] | None,
        progress: Any,
    ) -> MixRun:
        """This slot's mixer for one iteration: the mixed pipeline's source (the Source
        protocol of ``streambuf._source``). Exact resume only: ``progress`` is None."""
        return MixRun(
            self,
            ctx,
            ledger=ledger,
            stage_bytes=stage_bytes,
            cursor=resume["source"] if resume else None,
            pending=resume["pending"] if resume else None,
        )

    def access(self, sharding: Sharding, ctx: WorkerContext, *, stage_bytes: int | None) -> Any:
        raise ValueError(
            "a mixed pipeline cannot fetch one sample back by position; mix() takes "
            "plain pipelines as sources (pass every source to one mix())"
        )


class MixRun:
    """One slot's mixer: the source of a mixed pipeline's ``Iteration``."""

    def __init__(
        self,
        spec: MixSpec,
        ctx: WorkerContext,
        *,
        ledger: Ledger,
        stage_bytes: int | None,
        cursor: dict[str, Any] | None,
        pending: list[list[Any]] | None,
    ) -> None:
        self.spec, self.ctx, self.ledger = spec, ctx, ledger
        k = len(spec.pipelines)
        self.share = None if stage_bytes is None else max(1, stage_bytes // k)
        state = (cursor or {}).get("mix") or {}
        self.counter = int(state.get("counter", 0))
        self.done = list(state.get("done", [False] * k))
        self.restarts = list(state.get("restarts", [0] * k))
        subs = state.get("subs") or [None] * k
        self.subs: list[Iteration] = [self._open(i, subs[i]) for i in range(k)]
        self._iters = [sub.records(settle=False) for sub in self.subs]
        self._pending = [_split_row(row) for row in pending or []]
        self.partial = {pos: settled for pos, settled in self._pending if settled}
        self._replayed_n = 0
        self._seq = 0
        self._taken_pass = list(state.get("taken_pass", [0] * k))
        self.seed = hash_seed(spec.seed, ctx.epoch, ctx.rank, ctx.worker)

    def _open(self, k: int, snapshot: dict[str, Any] | None) -> Iteration:
        ctx = self.ctx
        if self.restarts[k]:  # a new pass over source k: another shard order
            ctx = replace(ctx, epoch=ctx.epoch * 1_000_003 + self.restarts[k])
        it = self.spec.pipelines[k]._iterate(ctx, stage_bytes=self.share, resume=snapshot)
        it.metered = False  # its time is the mix source's (the outer pipeline's report)
        return it

    def _pick(self) -> int | None:
        live = [k for k, d in enumerate(self.done) if not d]
        if not live or (self.spec.stop == "first_exhausted" and any(self.done)):
            return None
        total = sum(self.spec.weights[k] for k in live)
        u = _uniform(self.seed, self.counter) * total
        for k in live:
            u -= self.spec.weights[k]
            if u < 0:
                return k
        return live[-1]

    def _take(self, k: int) -> Rec | None:
        """The next sample of source ``k`` as a mixed ``Rec`` (None: it is exhausted)."""
        try:
            rec = next(self._iters[k], None)
        except Exception as exc:
            add_note(exc, f"streambuf: raised in {self.spec.label(k)}")
            raise
        if rec is None:
            return None
        with self.ledger.lock:  # taken on here and let go there at once: never in neither
            out = Rec(rec.value, (k, self.restarts[k], *rec.pos), self._seq)
            self._seq += 1
            self.ledger.issued(out.seq, out.pos, None)
            self.subs[k].ledger.settle_all(rec)
            self.counter += 1
            self._taken_pass[k] += 1
        self.spec.counters.add_one(self.ctx.worker, _TAKEN[k] if k < len(_TAKEN) else f"taken/{k}")
        return out

    def _replay(self) -> Iterator[Rec]:
        """The samples taken but not delivered before the resume, made again from their
        positions, handed out first in their original order."""
        by_source: dict[int, list[tuple[int, ...]]] = {}
        for pos, _ in self._pending:
            by_source.setdefault(pos[0], []).append(pos[2:])
        made: dict[tuple[int, ...], Any] = {}
        for k, positions in by_source.items():
            fetched = self.subs[k].refetch(positions)
            for pos, _ in self._pending:
                if pos[0] == k and pos[2:] in fetched:
                    made[pos] = fetched[pos[2:]]
        for pos, settled in self._pending:
            if pos not in made:
                raise LookupError(f"resume: mixed sample {pos} is gone (the data changed?)")
            with self.ledger.lock:
                rec = Rec(made[pos], pos, self._seq)
                self._seq += 1
                self.ledger.issued(rec.seq, pos, None, settled)
                self._replayed_n += 1
            yield rec

    def __iter__(self) -> Iterator[Rec]:
        yield from self._replay()
        try:
            while (k := self._pick()) is not None:
                rec = self._take(k)
                if rec is not None:
                    yield rec
                    continue
                if self.spec.stop == "never" and self._taken_pass[k] > 0:
                    self.restarts[k] += 1
                    self._taken_pass[k] = 0
                    self.spec.counters.add_one(self.ctx.worker, f"restarts/{k}")
                    self.subs[k] = self._open(k, None)
                    self._iters[k] = self.subs[k].records(settle=False)
                else:  # exhausted (a source with nothing for this slot never restarts)
                    self.done[k] = True
        finally:
            for it in self._iters:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    # -- the SourceRun interface the Iteration snapshots ----------------------------------
    def cursor(self) -> dict[str, Any]:
        return {
            "mix": {
                "counter": self.counter,
                "done": list(self.done),
                "restarts": list(self.restarts),
                "taken_pass": list(self._taken_pass),
                "subs": [sub.snapshot() for sub in self.subs],
            }
        }

    def unissued(self) -> list[list[Any]]:
        return [
            [*pos, None, *([settled] if settled else [])]
            for pos, settled in self._pending[self._replayed_n :]
        ]

    def buffer_stats(self) -> Any:
        return None


def _split_row(row: Sequence[Any]) -> tuple[tuple[int, ...], list[int] | None]:
    """A pending row ``[*pos, hint]`` or ``[*pos, hint, settled]`` -> (pos, settled)."""
    settled = list(row[-1]) if isinstance(row[-1], list) else None
    body = row[:-1] if settled is not None else row
    return tuple(int(x) for x in body[:-1]), settled


def mix(
    pipelines: Sequence[Pipeline],
    /,
    *,
    weights: Sequence[float],
    seed: int = 0,
    stop: Stop = "all_exhausted",
) -> Pipeline:
    """A ``Pipeline`` blending ``pipelines`` by ``weights`` (see the module docstring).

    Example::

        web = sb.shards("s3://bucket/web-{000000..000999}.tar").decode()
        curated = sb.shards("s3://bucket/curated-{0000..0099}.tar").decode()
        pipe = sb.mix([web, curated], weights=[0.8, 0.2], seed=1).shuffle(1000).batch(32)

    Args:
        pipelines: the sources: pipelines of samples (no ``.batch()``), each with its own
            shards, lanes and stages.
        weights: one positive number per source (normalised).
        seed: seeds the draws (with epoch, rank and worker).
        stop: ``"all_exhausted"`` (default), ``"first_exhausted"`` or ``"never"``.

    Raises:
        TypeError, ValueError: not pipelines, a batched source, bad weights or ``stop``.
    """
    from .pipeline import Pipeline
    from .stages import Batch

    pipelines = list(pipelines)
    if not pipelines:
        raise ValueError("mix() needs at least one pipeline")
    for i, p in enumerate(pipelines):
        if not isinstance(p, Pipeline):
            raise TypeError(f"mix(): source {i} is a {type(p).__name__}, not a streambuf.Pipeline")
        if any(isinstance(s, Batch) for s in p._stages):
            raise ValueError(f"mix(): source {i} is batched; mix samples, then .batch() the mix")
        if isinstance(p._src, MixSpec):
            raise ValueError(
                f"mix(): source {i} is itself a mix, whose samples cannot be made again "
                "one at a time from their positions (a mix does, on resume); pass all "
                "the sources to one mix() with their weights multiplied out"
            )
        if p._decodes_on() != pipelines[0]._decodes_on():
            raise ValueError(
                f"mix(): source {i} decodes onto {p._decodes_on() or 'host memory'} and "
                f"source 0 onto {pipelines[0]._decodes_on() or 'host memory'}: their "
                "samples could not be batched together; give every source the same decoder"
            )
        held = [s.name for s in p._stages if not getattr(s, "replays", True)]
        if held:
            raise ValueError(
                f"mix(): source {i} has the stage {held[0]!r}, which cannot make one sample "
                "again from its position (a mix does, on resume); compose it after mix()"
            )
        if p._sharding.equalize is not None:
            raise ValueError(
                f"mix(): source {i} has equalize=; equalize the mixed pipeline's ranks by steps instead"
            )
    try:
        given = [] if isinstance(weights, str | bytes) else list(weights)
    except TypeError:  # not iterable
        given = []
    if not given:
        raise TypeError(f"mix(): weights={weights!r} must be a list of numbers, one per source")
    if len(given) != len(pipelines):
        raise ValueError(f"mix(): {len(given)} weights for {len(pipelines)} pipelines")
    w = [check_weight(x, name=f"weights[{i}]") for i, x in enumerate(given)]
    top = max(w)  # (scaled first: a sum of finite weights may overflow to inf)
    total = sum(x / top for x in w)
    shares = tuple(x / top / total for x in w)
    for i, share in enumerate(shares):
        if not share > 0:
            raise ValueError(
                f"mix(): weights[{i}]={given[i]!r} is too small beside the largest "
                f"({max(given)!r}) to be drawn at all"
            )
    check_choice(stop, name="stop", choices=("all_exhausted", "first_exhausted", "never"))
    spec = MixSpec(
        tuple(pipelines),
        shares,
        check_int(seed, name="seed", minimum=-(1 << 63)),
        stop,
        mix_counters(len(pipelines)),
    )
    return Pipeline._of(spec, Sharding(seed=spec.seed))


def mix_stats(pipeline: Pipeline, /) -> MixStats:
    """Samples taken from each source of a ``mix`` pipeline (all its workers), restarts:
    ``pipeline.stats().mix``."""
    stats = getattr(pipeline, "stats", None)
    mixed = stats().mix if callable(stats) else None
    if mixed is None:
        raise TypeError("mix_stats() needs a pipeline built by streambuf.mix()")
    return mixed
