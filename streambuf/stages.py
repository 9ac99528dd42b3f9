"""The stages of a ``Pipeline``: small objects with an explicit state.

A stage is configuration (picklable: it crosses into DataLoader workers) with one
method, ``open(up, env, k, state)``, that runs it for one iteration over a stream of
``Rec`` objects (value, position, seq; ``streambuf._ledger``) and registers, when it
holds samples of its own, a ``snapshot()`` for the pipeline's state:

* ``Map`` (``threads > 1`` or ``"auto"``: the lane runner through ``ThreadPrefetcher``; ordered by default),
  ``Prefetch``: hold samples only in flight: those are pending in the ledger; no state.
* ``Filter``: a dropped sample is settled (it is owed to nobody).
* ``Flatten``: children take their parent's position plus their index; a resumed parent
  skips the children already settled.
* ``Shuffle``: a reservoir of at most ``buffer_items`` samples (and ``max_bytes``); when
  a bound is reached one random sample leaves. Its randomness is a counter-based
  generator (splitmix64 of seed and draw number), so its state is the draw count, the
  positions in its pool (in pool order) and the positions it emitted that are not
  settled yet; a resumed shuffle takes those samples back from the replayed stream and
  continues exactly where it was.
* ``Batch``: groups ``n`` samples (in place, equal to ``default_collate``), looking one
  sample ahead so that each batch knows whether it is the last one.

The plain-item functions (``map_items``, ``filter_items``, ``flatten_items``,
``shuffle_items``, ``batch_items``, ``prefetch_items``) are the same stages, for any
iterable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ._collate import Collator
from ._counters import THREAD_COUNTS, SharedCounters, ThreadStats, thread_gauge, thread_stats
from ._lanes import ITEMS_PER_THREAD
from ._ledger import Ledger, Rec, leaves
from ._units import check_bool, check_size, parse_bytes, parse_count, parse_optional_bytes
from .errors import add_note, stop_as_error
from .prefetch import ThreadPrefetcher, parse_threads
from .sharding import current_worker, hash_seed
from .sizing import nbytes

__all__ = [
    "Batch",
    "Env",
    "Filter",
    "Flatten",
    "Map",
    "Prefetch",
    "Shuffle",
    "Stage",
    "batch_items",
    "describe",
    "filter_items",
    "flatten_items",
    "map_items",
    "prefetch_items",
    "reordered_then_grouped",
    "shuffle_items",
    "stateful_then_reordered",
]

_M64 = (1 << 64) - 1


def describe(item: Any) -> str:
    """A short description of an item for error notes: its shard/key when it has one."""
    if isinstance(item, dict):
        url, key = item.get("__url__"), item.get("__key__")
        if url is not None or key is not None:
            return f"sample {key!r} of shard {url!r}"
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def _fn_name(kind: str, fn: Callable[..., Any]) -> str:
    return f"{kind}({getattr(fn, '__name__', type(fn).__name__)})"


@dataclass
class Env:
    """What the stages of one iteration share: the ledger (and its lock), the seeds of
    this (epoch, rank, worker, pass), each stage's byte grant, the restored flatten
    partials, the snapshot functions of the stages that hold samples, and their probes of
    what they hold now (``held[k]() -> (items, bytes)``, read by the stage meter)."""

    ledger: Ledger = field(default_factory=Ledger)
    base_seed: int = 0
    seed_parts: tuple[int, int, int, int] | None = None  # epoch, rank, worker, pass
    stage_bytes: int | None = None
    partial: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    # the partly delivered groups a resume gives the stage again: first position -> the
    # positions of the group's samples (``Ledger.groups``); ``Flatten`` checks each
    groups: dict[tuple[int, ...], list[list[int]]] = field(default_factory=dict)
    snapshots: dict[int, Callable[[], Any]] = field(default_factory=dict)
    held: dict[int, Callable[[], tuple[int, int]]] = field(default_factory=dict)  # probes
    meter: Any = None  # the pipeline's StageMeter (streambuf._meter), or None
    worker: int = 0  # this worker's row in the meter
    # the pipeline's equalize: batch counts come from the samples per shard, so every
    # sample reaching .batch() must stand for one sample read (``count_changed``)
    equalize: str | None = None
    grouping: str = "a stage before .batch()"  # the last user stage opened (its name)

    def seed_for(self, k: int, own: int | None) -> int:
        """Stage ``k``'s seed: hash of (its own seed or the pipeline's, epoch, rank,
        worker, k, pass); outside a pipeline, the seed given."""
        base = self.base_seed if own is None else own
        if self.seed_parts is None:
            return base
        epoch, rank, worker, pass_index = self.seed_parts
        return hash_seed(base, epoch, rank, worker, k, pass_index)


class Stage:
    """Base of the stages: ``open`` runs one iteration (see the module docstring)."""

    name = "stage"
    buffers = False  # holds samples ahead (gets a share of the Loader's stage budget)

    @property
    def reorders(self) -> bool:
        """Delivers its outputs in another order than it takes its inputs (a shuffle, an
        unordered threaded map): a stage owning state before it cannot resume exactly
        (``stateful_then_reordered``)."""
        return False

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        raise NotImplementedError

    def fixed_bytes(self) -> int:
        """Bytes the stage holds in each worker whatever the budget (a block being
        filled); a ``Loader`` takes them out of ``max_bytes`` before sharing the rest."""
        return 0

    def replay(self, value: Any, pos: tuple[int, ...]) -> Any:
        """The output of this stage for one sample delivered before, made again from its
        input (a mixed pipeline refetches samples by position); identity by default."""
        return value

    def set_epoch(self, epoch: int) -> None:
        fn = getattr(self, "fn", None)
        set_epoch = getattr(fn, "set_epoch", None)
        if callable(set_epoch):  # stage functions with per-epoch randomness
            set_epoch(epoch)


def _raised_in(name: str, rec: Rec) -> str:
    """The note on an error a stage's function raised on ``rec``."""
    return f"streambuf: raised in stage {name!r} on {describe(rec.value)}"


def _call(fn: Callable[[Any], Any], name: str) -> Callable[[Rec], Rec]:
    def call(rec: Rec) -> Rec:
        try:
            return rec.with_value(fn(rec.value))
        except StopIteration as stop:  # not the end of the stream (the built-in map's)
            raise stop_as_error(stop, "fn", _raised_in(name, rec)) from stop
        except Exception as exc:
            add_note(exc, _raised_in(name, rec))
            raise

    return call


@dataclass(frozen=True)
class Map(Stage):
    fn: Callable[[Any], Any]
    threads: int | str = 1
    ordered: bool = True
    max_items: int | None = None
    max_bytes: int | None = None
    adaptive: bool = True
    max_threads: int | None = None
    # threads="auto": the count in use per worker, in shared memory (``stats()``)
    counters: SharedCounters | None = field(default=None, compare=False, repr=False)

    @property
    def reorders(self) -> bool:
        return not self.ordered and self.threads != 1

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"map(fn): fn={self.fn!r} is not callable")
        _, auto = parse_threads(self.threads, self.max_threads)
        if auto and self.counters is None:
            object.__setattr__(self, "counters", SharedCounters(THREAD_COUNTS))
        check_bool(self.ordered, name="ordered")
        check_bool(self.adaptive, name="adaptive")
        if self.max_items is not None:
            parse_count(self.max_items, name="max_items")
        object.__setattr__(
            self, "max_bytes", parse_optional_bytes(self.max_bytes, name="max_bytes")
        )

    @property
    def name(self) -> str:  # type: ignore[override]
        return _fn_name("map", self.fn)

    @property
    def buffers(self) -> bool:  # type: ignore[override]
        return self.threaded

    @property
    def threaded(self) -> bool:
        """Runs on threads: ``threads > 1`` or ``"auto"``."""
        lanes, auto = parse_threads(self.threads, self.max_threads)
        return auto or lanes > 1

    def replay(self, value: Any, pos: tuple[int, ...]) -> Any:
        return self.fn(value)

    def thread_stats(self) -> ThreadStats | None:
        """``threads="auto"``: the count in use over every worker (else None)."""
        if self.counters is None:
            return None
        return thread_stats(
            self.name, self.counters, parse_threads(self.threads, self.max_threads)[0]
        )

    def workers_ended(self) -> None:
        """The workers are gone (shut down or killed): none runs a thread now, whether
        or not its stage closed (a killed worker's gauge never went back to 0)."""
        if self.counters is not None:
            self.counters.zero(("threads", "running", "inline"))

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        lanes, auto = parse_threads(self.threads, self.max_threads)
        if lanes == 1 and not auto:
            return map(_call(self.fn, self.name), up)
        fn = self.fn  # on threads: timed there (its chain time is the wait for results)
        if env.meter is not None:
            fn = env.meter.timed(fn, k, env.worker)
        call = _call(fn, self.name)
        depth = self.max_items if self.max_items is not None else ITEMS_PER_THREAD * lanes
        mb = self.max_bytes or env.stage_bytes or (256 << 20)
        return _probed(
            env,
            k,
            ThreadPrefetcher(
                up,
                max_items=max(depth, 1 if auto else lanes),
                max_bytes=mb,
                threads=self.threads,
                max_threads=self.max_threads,
                fn=call,
                ordered=self.ordered,
                sizeof=lambda rec: nbytes(rec.value),
                name=self.name,
                adaptive=self.adaptive,
                close_source=True,
                on_threads=(
                    thread_gauge(self.counters, current_worker()[0])
                    if auto and self.counters is not None
                    else None
                ),
                lead=_thread_lead(self.counters) if auto else None,
            ),
        )


def _probed(env: Env, k: int, pf: ThreadPrefetcher[Rec]) -> Iterator[Rec]:
    """``pf``'s items, its window registered as what stage ``k`` holds."""
    env.held[k] = pf.held
    return iter(pf)


class _WorkerZeroLead:
    """The ``Lead`` of a map stage in a Loader: worker 0 leads; a follower reads worker
    0's row of the stage's shared thread gauges (its count, whether it runs, whether it
    runs inline: count 0)."""

    def __init__(self, counters: SharedCounters, worker: int) -> None:
        self.leader = worker == 0
        self._raw, (self._threads, self._running, self._inline) = counters.slots(
            0, ("threads", "running", "inline")
        )

    def count(self) -> int | None:
        raw = self._raw
        running, threads, inline = raw[self._running], raw[self._threads], raw[self._inline]
        if running <= 0:
            return None
        return int(threads) if threads > 0 else (0 if inline > 0 else None)


def _thread_lead(counters: SharedCounters | None) -> _WorkerZeroLead | None:
    """One thread count for the stage in every worker (``streambuf._tuner.Lead``), or
    None (no shared gauges; or more workers than gauge rows, where rows are shared)."""
    worker, workers = current_worker()
    if counters is None or workers > counters.rows:
        return None
    return _WorkerZeroLead(counters, worker)


@dataclass(frozen=True)
class Prefetch(Stage):
    max_items: int
    max_bytes: int | str
    name = "prefetch"
    buffers = True

    def __post_init__(self) -> None:
        parse_count(self.max_items, name="max_items")
        object.__setattr__(self, "max_bytes", parse_bytes(self.max_bytes))

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        return _probed(
            env,
            k,
            ThreadPrefetcher(
                up,
                max_items=self.max_items,
                max_bytes=self.max_bytes,
                sizeof=lambda rec: nbytes(rec.value),
                name="prefetch",
                close_source=True,
            ),
        )


@dataclass(frozen=True)
class Filter(Stage):
    fn: Callable[[Any], bool]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"filter(fn): fn={self.fn!r} is not callable")

    @property
    def name(self) -> str:  # type: ignore[override]
        return _fn_name("filter", self.fn)

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        name, fn, ledger = self.name, self.fn, env.ledger
        for rec in up:
            try:
                keep = fn(rec.value)
            except StopIteration as stop:  # (a generator would say only that it raised it)
                raise stop_as_error(stop, "fn", _raised_in(name, rec)) from stop
            except Exception as exc:
                add_note(exc, _raised_in(name, rec))
                raise
            if keep:
                yield rec
            else:
                ledger.settle_all(rec)


@dataclass(frozen=True)
class Flatten(Stage):
    name = "flatten"

    def replay(self, value: Any, pos: tuple[int, ...]) -> Any:
        return list(value)[pos[2]]

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        ledger = env.ledger
        # each sample of a partly delivered group given again -> the group's first
        member = {tuple(p): first for first, g in env.groups.items() for p in g}
        for rec in up:
            with ledger.lock:  # a snapshot sees the group in env.groups or in the ledger
                skip = env.partial.pop(rec.pos, None) or ()
                if member and env.groups:
                    _same_group(rec, env.groups, member, skip)
                values = list(rec.value)
                if env.equalize is not None and len(values) != len(leaves(rec)):
                    raise count_changed(self.name, len(values), len(leaves(rec)), rec, env.equalize)
                children = [
                    Rec(x, (*rec.pos, j), rec.seq) for j, x in enumerate(values) if j not in skip
                ]
                ledger.expanded(rec, len(children))
            yield from children


def count_changed(stage: str, made: int, given: int, rec: Rec, mode: str) -> ValueError:
    """The error for a stage that changed the number of samples under ``equalize``:
    its batch counts come from the samples per shard, so the slot would stop with samples
    left (more made: lost) or run out and start its stream again (fewer: repeated)."""
    where = list(leaves(rec)[0].pos)
    more = made > given
    return ValueError(
        f"equalize={mode!r} counts batches from the samples per shard, one sample out for "
        f"each sample read, and stage {stage!r} made {made} of {given} (the sample at "
        f"{where}): {'more' if more else 'fewer'} samples than counted would "
        f"{'be lost at the end of the count' if more else 'be repeated to fill it'}. "
        "Drop equalize (and end ranks together another way: drop_last, or a step count), "
        "or keep one output per sample before .batch() (a group flattened back into its "
        "samples does)"
    )


def _same_group(
    rec: Rec,
    groups: dict[tuple[int, ...], list[list[int]]],
    member: dict[tuple[int, ...], tuple[int, ...]],
    skip: Any,
) -> None:
    """A resume skips the children of a partly delivered output by their index, which
    names the same outputs only if the stage made that output of the same samples again.
    An output made of any sample of such a group must be that group (then it is checked
    off), else refuse: skipping by index would drop some outputs and repeat others, and
    a group's sample put in another output would be delivered twice, silently."""
    now = [list(leaf.pos) for leaf in leaves(rec)]
    firsts = {member[p] for leaf in now if (p := tuple(leaf)) in member and member[p] in groups}
    if not firsts:
        return
    saved = [groups[f] for f in sorted(firsts)]
    if saved == [now]:
        del groups[next(iter(firsts))]
        return
    raise ValueError(
        f"resume: an output had children delivered before the state was saved "
        f"({' and '.join(map(str, saved))}: the samples it was made of); resumed, the "
        f"stage before flatten() made an output of the samples {now}, so the children "
        "delivered cannot be told apart from the new ones (skipping them would drop some "
        "samples and repeat others). A resume hands the stage a partly delivered group's "
        "samples first and together; the stage makes the same output only if nothing "
        "before it reorders them (a shuffle, an unordered map, a resume at another layout "
        "after one) and its grouping depends on those samples alone (a group cut short by "
        "the end of a worker's stream is followed by other samples at another layout). "
        "Resume at the save's world size and num_workers, save at an epoch's end, or make "
        "the maps before the stage ordered"
    )


def _draw(seed: int, counter: int, n: int) -> int:
    """Uniform-enough index in [0, n): splitmix64 of (seed, counter)."""
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) % n


def stateful_then_reordered(stages: tuple[Stage, ...]) -> str | None:
    """Why a pipeline with these stages cannot save a state that resumes exactly, or
    None: a stage that owns state (``owns_state``) followed by one that reorders. A saved
    state holds the stage's value before its first output not yet delivered, and a resume
    gives it again the samples of the outputs not delivered; outputs delivered out of
    order after that one are not given again, so the value they made is lost (a running
    sum resumed without them; a stage keeping the first N samples kept more)."""
    for i, stage in enumerate(stages):
        if not getattr(stage, "owns_state", False):
            continue
        for later in stages[i + 1 :]:
            if later.reorders:
                return (
                    f"stage {stage.name!r} owns state and {later.name}() after it delivers "
                    "its outputs out of the order it made them, so a saved state cannot "
                    "resume it exactly (the value saved is the one before the first output "
                    "not yet delivered; outputs delivered after it would not be given "
                    f"again); move {later.name}() before {stage.name!r}"
                    + (" or make the map ordered" if isinstance(later, Map) else "")
                )
    return None


def reordered_then_grouped(stages: tuple[Stage, ...]) -> str | None:
    """Why a state holding partly delivered groups (outputs of a user stage, flattened,
    some children delivered) cannot resume with these stages, or None: a stage that
    reorders before the user stage. A resume gives the stage a group's samples first and
    together, and skips the children delivered by index; reordered before it, the stage
    makes other groups of them, and the children cannot be told apart
    (``Flatten``'s check, at the first batch: refused when the state is loaded instead)."""
    flat = next((i for i, s in enumerate(stages) if isinstance(s, Flatten)), None)
    if flat is None:
        return None
    for g in range(flat):
        if not hasattr(stages[g], "iterate"):
            continue
        for earlier in stages[:g]:
            if earlier.reorders:
                return (
                    f"{earlier.name}() before stage {stages[g].name!r} delivers its samples "
                    "in another order than they were read, so a group that was partly "
                    f"delivered (the outputs of {stages[g].name!r} are flattened) cannot be "
                    "made again of the same samples on resume; move "
                    f"{earlier.name}() after .flatten()"
                    + (" or make the map ordered" if isinstance(earlier, Map) else "")
                )
    return None


@dataclass(frozen=True)
class Shuffle(Stage):
    buffer_items: int
    max_bytes: int | None = None
    seed: int | None = None
    sizeof: Callable[[Any], int] = nbytes
    name = "shuffle"

    @property
    def reorders(self) -> bool:
        return True

    def __post_init__(self) -> None:
        parse_count(self.buffer_items, name="buffer_items")
        object.__setattr__(
            self, "max_bytes", parse_optional_bytes(self.max_bytes, name="max_bytes")
        )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise TypeError(f"shuffle(seed={self.seed!r}) must be an int or None")

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        run = _ShuffleRun(self, env, env.seed_for(k, self.seed), state)
        env.snapshots[k] = run.snapshot
        env.held[k] = run.holding
        return run.run(up)


class _ShuffleRun:
    def __init__(self, cfg: Shuffle, env: Env, seed: int, state: Any) -> None:
        self.n, self.limit, self.sizeof = cfg.buffer_items, cfg.max_bytes, cfg.sizeof
        self.seed = seed
        self.ledger = env.ledger
        self.pool: list[Rec] = []
        self.sizes: list[int] = []
        self.held = 0
        self.counter = 0
        self.emitted: deque[Rec] = deque()  # emitted, maybe not settled yet
        self.expect: list[tuple[int, ...]] = []
        self.replay: list[tuple[int, ...]] = []
        if state:
            self.counter = int(state["counter"])
            self.expect = [tuple(p) for p in state["pool"]]
            self.replay = [tuple(p) for p in state["emitted"]]

    def snapshot(self) -> dict[str, Any]:
        ledger = self.ledger
        while self.emitted and not ledger.is_open(self.emitted[0]):
            self.emitted.popleft()
        return {
            "counter": self.counter,
            "pool": [list(r.pos) for r in self.pool],
            "emitted": [list(r.pos) for r in self.emitted if ledger.is_open(r)],
        }

    def holding(self) -> tuple[int, int]:
        """(items, bytes) in the pool; without ``max_bytes`` the bytes are estimated
        from one item (sizes are not measured then)."""
        pool = self.pool
        if not pool:
            return 0, 0
        if self.limit is not None:
            return len(pool), self.held
        try:
            return len(pool), len(pool) * nbytes(pool[-1].value)
        except (IndexError, TypeError, ValueError):  # (taken meanwhile; or unmeasurable)
            return len(pool), 0

    def _restore(self, up: Iterator[Rec]) -> Iterator[Rec]:
        """Take back the pool and the emitted-not-settled samples from the replay."""
        wanted = set(self.expect) | set(self.replay)
        got: dict[tuple[int, ...], Rec] = {}
        extra: list[Rec] = []  # only a nondeterministic upstream sends others first
        while len(got) < len(wanted):
            rec = next(up, None)
            if rec is None:
                break
            if rec.pos in wanted:
                got[rec.pos] = rec
            else:
                extra.append(rec)
        with self.ledger.lock:
            self.pool = [got[p] for p in self.expect if p in got] + extra
            self.sizes = [self._size(r) for r in self.pool]
            self.held = sum(self.sizes)
        for p in self.replay:
            if p in got:
                rec = got[p]
                with self.ledger.lock:
                    self.emitted.append(rec)
                yield rec

    def _size(self, rec: Rec) -> int:
        return check_size(self.sizeof(rec.value)) if self.limit is not None else 0

    def _take(self) -> Rec:
        with self.ledger.lock:
            i = _draw(self.seed, self.counter, len(self.pool))
            self.counter += 1
            pool, sizes = self.pool, self.sizes
            pool[i], pool[-1] = pool[-1], pool[i]
            sizes[i], sizes[-1] = sizes[-1], sizes[i]
            self.held -= sizes.pop()
            rec = pool.pop()
            self.emitted.append(rec)
            if len(self.emitted) > 4 * self.n + 64:  # prune what was settled long ago
                while self.emitted and not self.ledger.is_open(self.emitted[0]):
                    self.emitted.popleft()
            return rec

    def run(self, up: Iterator[Rec]) -> Iterator[Rec]:
        if self.expect or self.replay:
            yield from self._restore(up)
        limit = self.limit
        for rec in up:
            size = self._size(rec)
            with self.ledger.lock:
                self.pool.append(rec)
                self.sizes.append(size)
                self.held += size
            while self.pool and (
                len(self.pool) >= self.n or (limit is not None and self.held > limit)
            ):
                yield self._take()
        while self.pool:
            yield self._take()


@dataclass(frozen=True)
class Batch(Stage):
    n: int
    collate: Callable[[list[Any]], Any] | None = None
    drop_last: bool = False
    name = "batch"

    def __post_init__(self) -> None:
        parse_count(self.n, name="batch_size")
        check_bool(self.drop_last, name="drop_last")
        if self.collate is not None and not callable(self.collate):
            raise TypeError(f"batch(collate={self.collate!r}) must be callable or None")

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        """Batches as ``Rec`` objects whose ``members`` are their samples (settled by the
        pipeline when the batch is delivered) and whose ``last`` is set on the stream's
        last batch (one sample of lookahead tells)."""
        nxt = next(up, None)
        while nxt is not None:
            col = Collator(self.n, self.collate)
            recs: list[Rec] = []
            while nxt is not None and col.count < self.n:
                if env.equalize is not None and nxt.members is not None:
                    given = len(leaves(nxt))
                    if given != 1:  # a group (n -> 1) reached the batch unflattened
                        raise count_changed(env.grouping, 1, given, nxt, env.equalize)
                col.add(nxt.value)
                nxt.value = None  # the batch holds it now
                recs.append(nxt)
                nxt = next(up, None)
            if col.count < self.n and self.drop_last:
                env.ledger.settle_all(Rec(None, (), -1, recs))
                return
            yield Rec(col.result(), (), -1, recs, nxt is None)


# -- the same stages over plain items ----------------------------------------------------
def _recs(it: Iterable[Any]) -> Iterator[Rec]:
    return (Rec(x, (i,), i) for i, x in enumerate(it))


def _values(recs: Iterator[Rec]) -> Iterator[Any]:
    return (r.value for r in recs)


def map_items(
    it: Iterable[Any],
    fn: Callable[[Any], Any],
    /,
    *,
    threads: int | str = 1,
    ordered: bool = True,
    max_items: int | None = None,
    max_bytes: int | str = "256MiB",
    max_threads: int | None = None,
) -> Iterator[Any]:
    """Yield ``fn(x)`` for each ``x``; with ``threads > 1`` (or ``"auto"``: a count
    chosen by measurement, at most ``max_threads``) on a bounded thread pool (results
    held ahead, made or being made, at most ``max_items`` (default two a thread:
    ``2 * threads``, with ``"auto"`` ``2 * max_threads``) and ``max_bytes``). Whatever ``fn`` raises gets a note naming the stage and item."""
    stage = Map(
        fn,
        threads=threads,
        ordered=ordered,
        max_items=max_items,
        max_bytes=max_bytes,  # type: ignore[arg-type]
        max_threads=max_threads,
    )
    yield from _values(stage.open(_recs(it), Env(), 0, None))


def filter_items(it: Iterable[Any], fn: Callable[[Any], bool], /) -> Iterator[Any]:
    """Yield the items for which ``fn(item)`` is true."""
    yield from _values(Filter(fn).open(_recs(it), Env(), 0, None))


def flatten_items(it: Iterable[Iterable[Any]], /) -> Iterator[Any]:
    """Yield the elements of each item, in order."""
    for x in it:
        yield from x


def shuffle_items(
    it: Iterable[Any],
    buffer_items: int,
    /,
    *,
    max_bytes: int | str | None = None,
    seed: int = 0,
    sizeof: Callable[[Any], int] = nbytes,
) -> Iterator[Any]:
    """Bounded shuffle: hold up to ``buffer_items`` items (and ``max_bytes``), emit randomly.
    Deterministic for a given input order and ``seed``."""
    stage = Shuffle(buffer_items, max_bytes=max_bytes, sizeof=sizeof)  # type: ignore[arg-type]
    yield from _values(stage.open(_recs(it), Env(base_seed=seed), 0, None))


def batch_items(
    it: Iterable[Any],
    n: int,
    /,
    *,
    collate: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
) -> Iterator[Any]:
    """Group items into batches of ``n`` (``default_collate``, built in place, unless
    ``collate`` is given); the last short batch is kept unless ``drop_last``."""
    yield from _values(Batch(n, collate, drop_last).open(_recs(it), Env(), 0, None))


def prefetch_items(
    it: Iterable[Any], /, *, max_items: int, max_bytes: int | str, threads: int = 1
) -> Iterator[Any]:
    """Run the upstream stages ahead on a background thread, bounded by items and bytes."""
    pf: ThreadPrefetcher[Any]
    with ThreadPrefetcher(it, max_items=max_items, max_bytes=max_bytes, threads=threads) as pf:
        yield from pf
