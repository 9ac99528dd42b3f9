"""The one counters mechanism: ``Counters`` (one process, any thread), ``SharedCounters``
(one pipeline, every process that runs it) and ``PipelineStats``, what
``Pipeline.stats()`` returns.

Counts are named ints, added to by deltas and read as a snapshot. ``SharedCounters``
lives in shared memory created with the pipeline, one row per DataLoader worker id
(``worker % 64``), each row written by one process only, summed when read. Shared
memory can only be handed to a process while it is created (DataLoader workers by fork
or spawn); pickled at any other time, the copy gets private counts.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Generic, TypeVar

__all__ = [
    "INLINE",
    "Counters",
    "PipelineStats",
    "SharedCounters",
    "ThreadStats",
    "thread_gauge",
]

T = TypeVar("T")
_SLOTS = 64


class Counters(Generic[T]):
    """Counts named by the fields of the dataclass ``kind``, added to from any thread
    (``add(**deltas)``), read as a ``kind`` (``snapshot()``)."""

    def __init__(self, kind: type[T]) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._c = dict.fromkeys((f.name for f in fields(kind)), 0)  # type: ignore[arg-type]

    def add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                self._c[k] += v

    def snapshot(self) -> T:
        with self._lock:
            return self.kind(**self._c)


class SharedCounters:
    """Counts of one pipeline summed over every process that runs it (module
    docstring): ``add(worker, deltas)`` in a worker, ``totals()`` anywhere."""

    rows = _SLOTS  # worker w writes row w % rows

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._raw: Any = multiprocessing.RawArray("q", _SLOTS * len(self.names))
        self._index = {n: i for i, n in enumerate(self.names)}

    def add(self, worker: int, deltas: Mapping[str, int]) -> None:
        """Add ``deltas`` (name -> int) to ``worker``'s row (one writer process per row)."""
        base = (worker % _SLOTS) * len(self.names)
        for name, d in deltas.items():
            if d:
                self._raw[base + self._index[name]] += d

    def add_one(self, worker: int, name: str) -> None:
        """Add 1 to ``name`` in ``worker``'s row (the per-sample path: no dict)."""
        self._raw[(worker % _SLOTS) * len(self.names) + self._index[name]] += 1

    def slots(self, worker: int, names: Sequence[str]) -> tuple[Any, list[int]]:
        """(the raw array, the positions of ``names`` in ``worker``'s row): for a hot
        path that adds to the same counts each time (one writer per row, as ``add``)."""
        base = (worker % _SLOTS) * len(self.names)
        return self._raw, [base + self._index[n] for n in names]

    def zero(self, names: Sequence[str]) -> None:
        """Set ``names`` to 0 in every row: gauges of workers that are gone (call only
        when no process writes them any more: after the workers were shut down)."""
        n = len(self.names)
        for name in names:
            k = self._index[name]
            for slot in range(_SLOTS):
                self._raw[slot * n + k] = 0

    def totals(self) -> dict[str, int]:
        n = len(self.names)
        return {
            name: sum(self._raw[s * n + k] for s in range(_SLOTS))
            for k, name in enumerate(self.names)
        }

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing import context

        raw = self._raw if context.get_spawning_popen() is not None else list(self._raw)
        return {"names": self.names, "raw": raw}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.names, self._raw = state["names"], state["raw"]
        self._index = {n: i for i, n in enumerate(self.names)}


@dataclass(frozen=True)
class ThreadStats:
    """The thread count of a stage that chooses it at run time (``PipelineStats.threads``):
    a ``map(threads="auto")``, the lanes of ``shards(lanes="auto")`` (stage ``"shards"``),
    of ``video.clips(threads="auto")`` (``"video"``) and ``audio.clips`` (``"audio"``).

    Attributes:
        stage: the stage's name (``map(fn)``).
        threads: threads in use now, summed over the workers running it.
        running: workers running the stage now.
        changes: count changes so far (every worker, every epoch).
        max_threads: the ceiling per worker.
        mean: threads per worker, averaged over the time workers ran the stage so far
            (0.0 before any ran it; a worker running it inline counts 0).
        inline: workers running the stage inline now (a ``map(threads="auto")`` whose
            tuner found no thread pays: the consumer's thread runs the function; they
            count in ``running``, with 0 threads).
    """

    stage: str
    threads: int
    running: int
    changes: int
    max_threads: int
    mean: float = 0.0
    inline: int = 0


# threads now, workers running, changes; thread-ns and running-ns: the mean count
# (report); workers running the stage inline now
THREAD_COUNTS = ("threads", "running", "changes", "thread_ns", "run_ns", "inline")
INLINE = -1  # a gauge's count while the stage runs inline: running, no thread


def thread_gauge(counters: SharedCounters, worker: int) -> Callable[[int], None]:
    """``worker``'s row of a stage's ``THREAD_COUNTS``, kept equal to the count it is
    called with (0: the stage stopped running in this worker; ``INLINE``: it runs with
    no thread). A reader of the row (``streambuf.stages``' lead) sees, between two
    fields' writes, the increases before the decreases: a change from threads to inline
    or back never reads as a stage that stopped."""
    shown = [0]
    since = [time.perf_counter_ns()]

    def show(count: int) -> None:
        now = time.perf_counter_ns()
        was, threads_was = shown[0] != 0, max(shown[0], 0)
        dt = now - since[0] if was else 0
        deltas = {
            "threads": max(count, 0) - threads_was,
            "running": (count != 0) - was,
            "inline": (count == INLINE) - (shown[0] == INLINE),
            "changes": int(was and count != 0 and count != shown[0]),
            "thread_ns": threads_was * dt,  # the count held since the last change
            "run_ns": dt,
        }
        counters.add(worker, dict(sorted(deltas.items(), key=lambda kv: kv[1] < 0)))
        shown[0], since[0] = count, now

    return show


def thread_stats(stage: str, counters: SharedCounters, max_threads: int) -> ThreadStats:
    """A stage's ``ThreadStats`` from its ``THREAD_COUNTS`` rows."""
    c = counters.totals()
    mean = c["thread_ns"] / c["run_ns"] if c["run_ns"] else 0.0
    return ThreadStats(
        stage, c["threads"], c["running"], c["changes"], max_threads, mean, c["inline"]
    )


@dataclass(frozen=True)
class PipelineStats:
    """Everything a pipeline counts (``Pipeline.stats()``), summed over every worker that
    ran it or a fluent descendant since it was built; None where it counts nothing of
    the kind. ``as_dict(flat=True)`` for loggers.

    Attributes:
        shards: ``streambuf.sources.ShardTotals`` (``shards()``): shard reads, samples,
            I/O, cache.
        videos: ``streambuf.video.DecodeStats`` (``video.clips()``): videos, clips,
            frames decoded and converted, seeks, failures.
        audio: ``streambuf.audio.AudioDecodeStats`` (``audio.clips()``): files, clips,
            samples, seeks, failures.
        mix: ``streambuf.MixStats`` (``mix()``): samples taken from each source, restarts.
        sources: a mix's sources' own ``PipelineStats``, in order.
        threads: ``ThreadStats`` of each ``map(threads="auto")`` stage, in order.
    """

    shards: Any = None
    videos: Any = None
    audio: Any = None
    mix: Any = None
    sources: tuple[PipelineStats, ...] = ()
    threads: tuple[ThreadStats, ...] = ()

    def as_dict(self, *, flat: bool = False) -> dict[str, Any]:
        """A dict; with ``flat=True`` scalar values only, nested keys joined by "/"
        (``shards/io/retries``, ``mix/taken/0``, ``sources/1/shards/samples``,
        ``threads/map(load)/threads``)."""
        d = asdict(self)
        if not flat:
            return d
        out: dict[str, Any] = {}

        def walk(prefix: str, v: Any) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    if k == "threads" and isinstance(x, list | tuple):
                        # threads/<stage>/<field>: numbers only (no stage-name strings)
                        x = {t["stage"]: {f: n for f, n in t.items() if f != "stage"} for t in x}
                    walk(f"{prefix}{k}/", x)
            elif isinstance(v, list | tuple):
                for i, x in enumerate(v):
                    walk(f"{prefix}{i}/", x)
            elif v is not None:
                out[prefix[:-1]] = v

        walk("", d)
        return out
