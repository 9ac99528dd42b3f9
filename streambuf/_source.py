"""``SourceRun``: one slot's shards read by lanes, with positions, cursors and replay.

Every source of a ``Pipeline`` (plain items, ``expand``-ed shards, tar shards, videos) is
an ``Access``: ``read(lane, shard, index=, hint=)`` streams one shard from a sample on,
yielding ``(index, start_hint, next_hint, value)``, and ``fetch(shard, wanted)`` gets
particular samples back by ``(index, hint)`` (a hint is how to get there cheaply: a tar
member's byte offset, a video's clip count; None means "count from the start").

``SourceRun`` reads a slot's shard list (its ``Assignment``) with ``lanes`` threads
through the one ``LaneRunner`` into a ``Window`` (one pool; or inline, see below), keeps
the slot's sample share
(``stride``/``offset``), and hands out ``Rec`` objects, recording each in the ``Ledger``.

An access with ``threaded = False`` (plain items, ``expand``) is read inline, in the
consumer's thread, as one lane.

**Lanes or inline** (``adaptive=True``: ``shards()``'s default): each lane's reader is a
generator kept across modes, driven by its lane thread or by the consumer, whichever an
``InlineChooser`` measures faster (a local file's samples cost microseconds: the
hand-off costs more than the overlap gains; a remote one waits). The order is the same
either way: a threaded phase ends with every lane at the same count of items made since
it began (a lane inside a read counts), so the buffer drains whole rounds; the inline
reader continues round robin from the lane due next. Local files start inline.

**Threads** (``threads=``): a threaded phase runs ``threads`` threads over the lanes
not yet exhausted (dealt out in delivery order: ``LaneRunner``); the order, the cursors
and a resume follow from ``lanes`` alone, so the thread count may change at run time.
``threads="auto"`` (``shards(lanes="auto")``): a ``ThreadTuner`` (``streambuf._tuner``)
picks it from the rate the consumer sees, starting at one thread per lane (the first
requests all go out at once) and going down where fewer deliver as much, within the
byte room (one sample in flight per thread); a change ends the phase as a pause does
(every lane at a round's end, the window drained) and the next phase runs the new
count. So does a lane running out while threads share lanes (its thread would idle
while another has two): the next phase deals the lanes left. ``phases`` records the
thread count of each phase.

**Cursor** (``cursor()``, under the ledger's lock): per lane, where the consumer side is:
``[slot_index, next_index, next_hint]`` (``slot_index`` in the slot's shard list) or
None before its first sample; plus the round-robin lane due next, or, for
``first_ready``, the shards the consumer has seen samples of (``[n, [extra...]]``: the
first ``n`` of the list and these others; a lane claims shards in list order, so a shard
claimed but not seen yet is simply read again). Everything a lane read past its
cursor is re-read after a resume; everything before it is behind the consumer except the
ledger's pending samples.

**Resume** (``cursor=``, ``pending=``): the pending samples are fetched
(concurrently, grouped by shard) and handed out first, in their original order, while
the lanes reopen their shards at their cursors; then the lanes continue. **Elastic**
(``progress=``): shards and samples that a ``streambuf._elastic.Progress`` marks done are
skipped (a shard is entered at the furthest known point), its pending samples fetched.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from ._cost import CallCost
from ._inline import InlineChooser
from ._lanes import AGAIN, LaneRunner
from ._ledger import Ledger, Rec
from ._tuner import ThreadTuner, room_for
from ._units import check_count_or_auto
from .buffer import Order
from .errors import add_note
from .sizing import nbytes
from .window import Window

__all__ = ["Access", "SourceRun"]

# Samples a shard lane hands over at most at a time (``LaneRunner``'s chunks: one
# reservation, one commit and one get for a run of samples read within ``FLUSH_S``). 16
# was the best of 4/16/64 on the bare hand-off (``python -m streambuf.bench._chunk_probe``).
CHUNK = 16


class Access(Protocol):
    """How one kind of source reads its shards (see the module docstring)."""

    def read(
        self, lane: int, shard: int, /, *, index: int, hint: Any
    ) -> Iterator[tuple[int, Any, Any, Any]]: ...

    def fetch(self, shard: int, wanted: list[tuple[int, Any]], /) -> Iterator[tuple[int, Any]]: ...

    def close(self) -> None: ...


class SourceRun:
    """Read ``shard_ids`` (a slot's list) as ``Rec`` objects; see the module docstring."""

    def __init__(
        self,
        access: Access,
        shard_ids: Sequence[int],
        /,
        *,
        ledger: Ledger,
        lanes: int,
        order: Order = "round_robin",
        stride: int = 1,
        offset: int = 0,
        max_items: int = 64,
        max_bytes: int = 256 << 20,
        sizeof: Callable[[Any], int] = nbytes,
        name: str = "source",
        cursor: dict[str, Any] | None = None,
        pending: list[list[Any]] | None = None,
        progress: Any = None,
        join_timeout_s: float = 1.0,
        adaptive: bool = False,
        threads: int | str | None = None,
        on_threads: Callable[[int], None] | None = None,
    ) -> None:
        self.access = access
        self.shard_ids = list(shard_ids)
        self.ledger = ledger
        self.order: Order = order
        self.lanes = min(lanes, len(self.shard_ids))
        self.stride, self.offset = stride, offset
        self.max_items, self.max_bytes = max_items, max_bytes
        self.sizeof = sizeof
        self.name = name
        self.progress = progress
        self.join_timeout_s = join_timeout_s
        k = max(1, self.lanes)
        resumed = cursor is not None or pending is not None
        cursor = cursor or {}
        self._cur: list[list[Any] | None] = list(cursor.get("lanes") or [None] * k)
        if len(self._cur) != k:
            raise ValueError(f"resume state has {len(self._cur)} lanes, this run has {k}")
        self._next_lane = int(cursor.get("next_lane", 0))
        seen = cursor.get("seen") or [0, []]
        self._seen: set[int] = set(range(int(seen[0]))) | {int(i) for i in seen[1]}
        self._claimed = 0
        self._claim_lock = threading.Lock()
        pending = list(pending or [])
        # the partly delivered groups this slot finishes (an elastic resume's)
        self.groups: list[list[list[int]]] = []
        if progress is not None and not resumed:  # an exact resume owes its own list
            pending += progress.pending_for(self.shard_ids, stride, offset)
            self.groups = progress.groups_for(self.shard_ids, stride, offset)
        self._pending = pending
        self._replayed_n = 0  # how many of them were handed out again
        self.partial: dict[tuple[int, ...], list[int]] = {
            (int(p[0]), int(p[1])): list(p[3]) for p in pending if len(p) > 3
        }
        self._seq = 0
        self._reading: list[int | None] = [None] * k  # the shard each lane is on
        # lanes or inline, by measurement (streambuf._inline); local files start inline
        self.chooser: InlineChooser | None = None
        if adaptive and getattr(access, "threaded", True):
            is_local = getattr(access, "is_local", None)
            local = bool(self.shard_ids and is_local is not None and is_local(self.shard_ids[0]))
            self.chooser = InlineChooser(max(4 * k, 32), start_inline=local)
        self.inline_items = 0  # samples read in the consumer's thread
        self._runner: LaneRunner[Any] | None = None  # the current threaded phase's
        self._gate = threading.Lock()  # lanes' counts and the stop point of a phase
        self._gens: list[Generator[Any, None, None]] = []
        self._done: list[bool] = []
        self._made: list[int] = []
        self._driving: list[bool] = []
        self._stop_at: int | None = None
        self._closing = False
        # threads over the lanes in a threaded phase: fixed, or tuned (``threads="auto"``)
        if threads is not None:
            check_count_or_auto(threads, name="threads")
        self._auto = threads == "auto" and k > 1 and getattr(access, "threaded", True)
        self.threads = k if threads is None or threads == "auto" else min(int(threads), k)
        self.tuner: ThreadTuner | None = None  # built when iteration starts
        self._cost: CallCost | None = None  # with the tuner: what the lanes' reads cost
        self._on_threads = on_threads
        self._largest = -1  # bytes of the largest sample read so far (any phase)
        self.phases: list[int] = []  # threads of each threaded phase, in order
        self._regroup = False  # a lane ran out while threads share lanes: deal again

    # -- the slot's share and what is already done ----------------------------------------
    def _keep(self, shard: int, index: int) -> bool:
        if index < self.offset or (index - self.offset) % self.stride:
            return False  # another slot's sample (a shard split by sample)
        # claimed by an older layout: delivered, or pending and replayed on its own
        return self.progress is None or not self.progress.claimed(shard, index)

    def _entry(self, shard: int, index: int, hint: Any) -> tuple[int, Any]:
        if self.progress is not None and index == 0 and hint is None:
            return self.progress.entry(shard)
        return index, hint

    # -- lanes --------------------------------------------------------------------------
    def _lane_shards(self, lane: int) -> Iterator[tuple[int, int, Any]]:
        """(slot_index, start index, hint) for each shard lane ``lane`` reads, in order."""
        cur = self._cur[lane]
        if self.order == "first_ready":
            if cur is not None:
                yield int(cur[0]), int(cur[1]), cur[2]
            while True:
                with self._claim_lock:  # the next shard nobody has delivered from
                    while self._claimed in self._seen:
                        self._claimed += 1
                    i = self._claimed
                    if i >= len(self.shard_ids):
                        return
                    self._claimed += 1
                yield i, 0, None
        k = max(1, self.lanes)
        first = lane if cur is None else int(cur[0])
        for i in range(first, len(self.shard_ids), k):
            if cur is not None and i == int(cur[0]):
                yield i, int(cur[1]), cur[2]
            else:
                yield i, 0, None

    def _work(self, lane: int) -> Generator[tuple[int, int, int, Any, Any, Any], None, None]:
        todo = (
            (i, *self._entry(self.shard_ids[i], index, hint))
            for i, index, hint in self._lane_shards(lane)
            if self.progress is None or not self.progress.shard_done(self.shard_ids[i])
        )
        prepare = getattr(self.access, "prepare", None) if self.order == "round_robin" else None
        nxt = next(todo, None)
        while nxt is not None:
            (i, index, hint), nxt = nxt, next(todo, None)
            shard = self.shard_ids[i]
            self._reading[lane] = shard
            if prepare is not None:  # the shard after this one (readahead)
                prepare(
                    lane, None if nxt is None else self.shard_ids[nxt[0]], *(nxt[1:] if nxt else ())
                )
            reader = self.access.read(lane, shard, index=index, hint=hint)
            try:
                for j, h0, h1, value in reader:
                    if self._keep(shard, j):
                        yield lane, i, j, h0, h1, value
            finally:  # closed here, when the lane leaves it: not whenever it is collected
                close = getattr(reader, "close", None)
                if close is not None:
                    close()
            if nxt is not None:  # the next shard's open may wait (a request): a lane
                yield AGAIN  # hands over the chunk it holds first (nothing for inline)

    # -- replay of pending samples --------------------------------------------------------
    def _replay(self) -> Iterator[tuple[Any, Any, Any]]:
        """The pending samples, fetched by shard group, in their original order."""
        groups: dict[int, list[tuple[int, Any]]] = {}
        for p in self._pending:
            groups.setdefault(int(p[0]), []).append((int(p[1]), p[2]))
        pool = ThreadPoolExecutor(
            max_workers=max(1, min(len(groups), 8)),
            thread_name_prefix=f"streambuf-{self.name}-replay",
        )
        futures: dict[int, Future[dict[int, Any]]] = {
            shard: pool.submit(self._fetch, shard, wanted) for shard, wanted in groups.items()
        }
        try:
            for p in self._pending:
                shard, index = int(p[0]), int(p[1])
                got = futures[shard].result()
                if index not in got:
                    raise LookupError(
                        f"resume: sample {index} of shard {shard} is gone (the data changed "
                        "since the state was saved?)"
                    )
                yield (shard, index), p[2], got.pop(index)
        finally:
            # not waited for: closed by the garbage collector (an abandoned iteration),
            # this may run inside another thread's start, where joining a thread hangs
            # the process; the fetches left end on their own
            pool.shutdown(wait=False, cancel_futures=True)

    def _describe(self, lane: int) -> str | None:
        shard = self._reading[lane]
        if shard is None:
            return None
        name = getattr(self.access, "name", None)
        return f"reading shard {name(shard) if name is not None else shard}"

    def _fetch(self, shard: int, wanted: list[tuple[int, Any]]) -> dict[int, Any]:
        return dict(self.access.fetch(shard, wanted))

    def _issue(
        self, pos: tuple[int, int], hint: Any, value: Any, settled: list[int] | None = None
    ) -> Rec:
        rec = Rec(value, pos, self._seq)
        self._seq += 1
        self.ledger.issued(rec.seq, pos, hint, settled)
        return rec

    def __iter__(self) -> Iterator[Rec]:
        if not self.shard_ids:
            yield from self._replayed()
            return
        k = max(1, self.lanes)
        self._gens = [self._work(t) for t in range(k)]  # each lane's reader, kept across modes
        self._done = [False] * k  # lane's reader exhausted
        threaded = getattr(self.access, "threaded", True)
        chooser = self.chooser if threaded else None
        if self._auto:
            self._cost = CallCost()  # the lanes' reads: the tuner's contention signal
            self.tuner = ThreadTuner(
                max_threads=k,
                start=k,
                window=max(32, 4 * k),
                room=self._room,
                held=lambda: self.held()[0],
                cost=self._cost.totals,
            )
            if self._on_threads is not None:  # running from now (inline phases included)
                self._on_threads(self.tuner.count)
        inline_before = False
        try:
            yield from self._replayed()
            while not all(self._done):
                if not threaded or (chooser is not None and chooser.inline):
                    yield from self._inline(chooser)
                    inline_before = True
                else:
                    if inline_before and self.tuner is not None:
                        self.tuner.restart()  # its window spans an inline phase: void
                    inline_before = False
                    yield from self._threaded(chooser)
                    if chooser is not None and chooser.state == "drain":
                        chooser.drained()  # every lane stopped at a round's end, drained
        finally:
            runner = self._runner
            if runner is not None:
                runner.close()
            if self.tuner is not None:
                self.tuner.detach()
            if self._on_threads is not None:
                self._on_threads(0)
            for gen in self._gens:
                try:
                    gen.close()
                except ValueError:  # running on a lane stuck in a read: it closes the
                    pass  # reader itself when the read returns (``_gated``)
            self.access.close()

    def _deliver(self, item: tuple[int, int, int, Any, Any, Any]) -> Rec:
        lane, i, j, h0, h1, value = item
        with self.ledger.lock:
            rec = self._issue((self.shard_ids[i], j), h0, value)
            self._cur[lane] = [i, j + 1, h1]
            self._next_lane = (lane + 1) % len(self._gens)
            self._seen.add(i)
        return rec

    def _inline(self, chooser: InlineChooser | None) -> Iterator[Rec]:
        """Drive the lanes' readers in the consumer's thread, in the order the lanes'
        buffer would deliver (round robin from ``_next_lane``, an exhausted lane skipped),
        until ``chooser`` turns to threads."""
        k = len(self._gens)
        while not all(self._done):
            lane = self._next_lane
            while self._done[lane]:
                lane = (lane + 1) % k
            try:
                item = next(self._gens[lane])
                while item is AGAIN:
                    item = next(self._gens[lane])
            except StopIteration:
                self._done[lane] = True
                self._next_lane = (lane + 1) % k
                continue
            except BaseException as exc:
                what = self._describe(lane)
                add_note(
                    exc,
                    f"streambuf: raised in stage {self.name!r} on lane {lane} (inline, in "
                    "the consumer's thread)" + (f" {what}" if what else ""),
                )
                raise
            self.inline_items += 1
            yield self._deliver(item)
            if chooser is not None and chooser.tick() == "resume":
                return

    def _room(self) -> int:
        """Threads the byte bound has room for: each one's sample in flight is reserved
        in the window before it is read (``ThreadTuner``'s limit)."""
        runner = self._runner
        largest = max(self._largest, runner.largest if runner is not None else -1)
        return room_for(max(self.max_items, len(self._gens)), self.max_bytes, largest)

    def _want(self) -> int:
        """Threads for a phase now: a fixed count as given; the tuner's within the byte
        room and the lanes not exhausted."""
        if self.tuner is None:
            return self.threads
        return max(1, min(self.tuner.count, self._room(), sum(not d for d in self._done)))

    def _threaded(self, chooser: InlineChooser | None) -> Iterator[Rec]:
        """One phase of lane threads: until the readers end, or ``chooser`` asks for a
        pause, or the tuner for another thread count; then every lane stops at the end
        of one round (the same count of items since the phase began), so the buffer
        drains in exactly the order the inline reader (or the next phase) continues
        from."""
        k = len(self._gens)
        tuner = self.tuner
        live = [t for t in range(k) if not self._done[t]]
        threads = self._want()
        self.phases.append(threads)
        self._regroup = False
        self._made = [0] * k
        self._driving = [False] * k
        self._stop_at = None
        self._closing = False
        # one pool for every lane (items being read count; an oversize one alone)
        window: Window[Any] = Window(
            lanes=k,
            order=self.order,
            max_items=max(self.max_items, k),
            max_bytes=self.max_bytes,
            start_lane=self._next_lane,
        )
        runner = LaneRunner(
            [functools.partial(self._gated, t) for t in range(k)],
            window=window,
            name=self.name,
            join_timeout_s=self.join_timeout_s,
            on_close=self._stop_lanes,
            stops_when="when its read returns",
            sizeof=_sizeof_of(self.sizeof),
            describe=self._describe,
            threads=threads,
            first_lane=self._next_lane,
            live=live,
            largest=self._largest,
            chunk=CHUNK,
        )
        self._runner = runner
        if self._on_threads is not None:
            self._on_threads(threads)
        runner.start()
        try:
            for item in runner:
                yield self._deliver(item)
                if chooser is not None and chooser.tick() == "pause":
                    self._end_phase()
                # (no tuning while a phase drains: its rate is the drain's)
                if tuner is not None and self._stop_at is None:
                    if tuner.tick() is not None and self._want() != threads:
                        self._end_phase()
                if self._regroup:
                    self._end_phase()
        finally:
            self._largest = max(self._largest, runner.largest)
            runner.close()

    def _end_phase(self) -> None:
        """Every lane stops once it made as many items in this phase as the lane furthest
        on (counting a read in progress): the window drains whole rounds."""
        with self._gate:
            if self._stop_at is not None:
                return
            self._stop_at = (
                0  # no order to keep: each lane stops at its next step
                if self.order == "first_ready"
                else max(m + d for m, d in zip(self._made, self._driving))
            )

    def _gated(self, lane: int) -> Iterator[tuple[int, int, int, Any, Any, Any]]:
        """Lane ``lane``'s reader as driven by its thread in one threaded phase: it stops
        (ending the lane's part of the phase) when it made ``_stop_at`` items."""
        gen = self._gens[lane]
        gate = self._gate
        cost = self._cost
        while True:
            with gate:
                if self._closing or self._done[lane]:
                    return
                if self._stop_at is not None and self._made[lane] >= self._stop_at:
                    return
                self._driving[lane] = True
            try:
                item = next(gen) if cost is None else cost.call(next, gen)
            except StopIteration:
                with gate:
                    self._driving[lane] = False
                    self._done[lane] = True
                    # threads share lanes: this one's thread may now idle: deal again
                    self._regroup = self.phases[-1] < sum(not d for d in self._done)
                return
            except BaseException:
                with gate:
                    self._driving[lane] = False
                raise
            if item is AGAIN:  # (a shard's end: not an item)
                with gate:
                    self._driving[lane] = False
                yield item
                continue
            with gate:  # counted with the same lock the stop point is computed under
                self._driving[lane] = False
                self._made[lane] += 1
                closing = self._closing
            if closing:  # the consumer left while this lane read (it could not close a
                gen.close()  # running generator): close the reader here, files with it
                return
            yield item

    def _stop_lanes(self) -> None:
        """A phase's runner closes: lanes take no further step; a lane inside a read (the
        consumer left mid-phase) is aborted. A phase that ended at its stop point has no
        lane inside a read, and the access stays open for the next phase."""
        with self._gate:
            self._closing = True
            busy = any(self._driving)
        if busy:
            self.access.close()

    def _replayed(self) -> Iterator[Rec]:
        if not self._pending:
            return
        for pos, hint, value in self._replay():
            with self.ledger.lock:
                row = self._pending[self._replayed_n]
                rec = self._issue(pos, hint, value, row[3] if len(row) > 3 else None)
                self._replayed_n += 1
            yield rec

    def unissued(self) -> list[list[Any]]:
        """Pending samples of the resumed state not handed out again yet: still owed
        (call under the ledger's lock)."""
        return [list(p) for p in self._pending[self._replayed_n :]]

    def held(self) -> tuple[int, int]:
        """(items, bytes) the lanes hold now ((0, 0) when read inline)."""
        runner = self._runner
        if runner is None:
            return 0, 0
        held = getattr(runner.window, "held", None)  # (a Window: reservations included)
        if held is not None:
            return held()
        got = runner.stats()
        return got.items, got.bytes

    def buffer_stats(self) -> Any:
        """The lanes' buffer (``BufferStats``), or None when read inline."""
        runner = self._runner
        return runner.stats() if runner is not None else None

    def cursor(self) -> dict[str, Any]:
        """Where the consumer side is (call under the ledger's lock)."""
        out: dict[str, Any] = {"lanes": [list(c) if c is not None else None for c in self._cur]}
        if self.order == "first_ready":
            n = 0
            while n in self._seen:
                n += 1
            out["seen"] = [n, sorted(i for i in self._seen if i > n)]
        else:
            out["next_lane"] = self._next_lane
        return out


def _sizeof_of(sizeof: Callable[[Any], int]) -> Callable[[Any], int]:
    """A lane item is ``(lane, slot_index, index, h0, h1, value)``: size its value."""
    return lambda item: sizeof(item[5])
