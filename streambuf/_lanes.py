"""``LaneRunner``: the one thread-lane runner behind every concurrent stage.

A threaded map (``ThreadPrefetcher``), the torchdata nodes (``streambuf.nodes``), the shard
readers of ``shards()`` and the video lanes of ``video.clips()`` all run the same loop:
``K`` threads, lane ``t`` draining its own work iterator into one window that the
consumer iterates (``streambuf.window.LaneWindow``: a ``Window``, one pool).

* **Reserve before build.** Before asking its iterator for the next item, a lane reserves
  room for it (its estimate: the largest item any lane has made, or the lane's share of
  the byte bound before the first one), so the item being built counts against
  ``max_bytes``/``max_items`` like a queued one; ``commit`` turns the reservation into
  the item; ``release`` gives it back when the iterator made nothing. The window bounds
  what is built and what is held (oversize admitted alone, counted; a result larger
  than its room waits for room in its thread).
* **Order.** The window's: ``"round_robin"`` (lanes in turn, deterministic),
  ``"sequence"`` (numbered works yield ``(seq, item)``: producers sharing one source) or
  ``"first_ready"`` (arrival order).
* **Errors.** An exception in a work iterator aborts the window: the consumer gets the
  same object, with a note naming the stage, lane and thread; held items are dropped.
* **Pauses**: a work iterator that yields ``AGAIN`` has no item now (paused, or its
  next item may wait); its lane hands over its chunk, gives the reservation back and
  asks its gate again (where a paused lane waits).
* **Lanes on demand** (``threads="auto"``): ``start(k)`` starts lanes up to ``k`` (the
  others wait unstarted: the window counts them as running), ``gate(t)`` is asked before
  each reservation (a lane above the wanted count parks there, holding nothing; False
  ends the lane), and ``seal()`` (the source is exhausted) finishes the lanes never
  started, so the window can end.
* **Fewer threads than lanes** (``threads=m``: shard and video lanes with ``"auto"``):
  the live lanes, in the order the window delivers them (from ``first_lane``), are
  dealt out in turn; each thread makes one item of each of its lanes in turn, so it
  never makes a later item while one of its lanes owes an earlier one (the window's
  room rules stay deadlock-free), and the order (the window's, by lane) does not depend
  on ``m``.
* **Chunks** (``chunk=k``: the shard lanes of ``SourceRun``; a thread driving one lane
  only: one driving several makes one item of each in turn, as above, since a chunk
  would make later items of one lane while another owes an earlier one, and its last
  item, waiting for room, could keep the thread from the one the consumer waits on):
  a lane reserves room for
  up to ``k`` items at once and hands over, in one ``commit_many``, what it made until
  the reservation is full, ``FLUSH_S`` passed since the chunk began (a lane that waits
  on a request or a decode hands each item over as soon as it is made), an item
  outgrew the estimate, or its iterator paused or ended; the consumer takes runs with
  ``get_many``. A lane's chunk size doubles after a chunk that filled before ``FLUSH_S``
  passed and falls to what it made after one that did not (a slow lane, whose items
  each take longer, reserves room for the one it makes, as without chunks). Order, bounds and errors are as item by item (each
  item counted at its own size). The items a lane has made of its chunk are visible to
  the window (``Window.hold``): a consumer that waited ``HOLD_POLL_S`` for them commits
  them itself, so a lane whose next read stalls holds nothing back longer than that.
* **Shutdown.** Leaving the loop (end, ``break``, an exception) or ``close()`` closes
  the window (every blocked reserve/commit wakes with ``BufferClosed``), calls
  ``on_close`` (e.g. to abort in-flight reads), and joins the threads within
  ``join_timeout_s``; each lane closes its work iterator (files, containers) on exit. A
  thread stuck in user or I/O code is a daemon: logged, it ends at its next reserve.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from ._threads import join_all
from ._units import check_size
from .errors import BufferClosed, add_note
from .sizing import nbytes
from .stats import BufferStats
from .window import LaneWindow

__all__ = ["AGAIN", "ITEMS_PER_THREAD", "LaneRunner"]

# A threaded map's default depth (``max_items``) per thread: one item being made and one
# made. With one, the consumer's own work between two items it takes (a batch's collate,
# its hand-off to the main process) leaves every thread waiting for room at once: on the
# seed workload (4 workers, 10 ms a sample, 19 MiB batches) 8 threads a worker went from
# 0.88-0.92 to 0.95 of ``threads / latency`` in three side-by-side runs (docs/design.md,
# "Autotuned parallelism"; past ~10 a worker the CPUs set the rate there).
ITEMS_PER_THREAD = 2

# A chunk is handed over once this long passed since its first item began: lanes whose
# items come in microseconds (a local or buffered tar) hand over runs of them, lanes that
# wait (a request, a decode) one by one, as soon as each is made. Longer than the GIL's
# switch interval (5 ms), so a lane that lost the GIL to another one for a turn keeps
# its chunk (3 lanes of local 64 KiB samples, ``bench._chunk_probe``: 1 ms gave 1.1x
# one by one, 20 ms 1.5x); short beside a request (a chunk holds an item at most this
# long, plus the next item's read).
FLUSH_S = 0.01

# A work iterator yields AGAIN when it has no item now (its stage paused the lanes, or
# its next item may wait: a shard's end, before the next one's open): the lane hands
# over the chunk it holds, gives its reservation back and asks its gate again (it parks
# there, holding nothing: a paused lane must not keep room the consumer's drain needs).
AGAIN: Any = object()

log = logging.getLogger("streambuf")

T = TypeVar("T")


class LaneRunner(Generic[T]):
    """Run ``works[t]()`` on lane thread ``t`` into ``window``; iterate once.

    Args:
        works: one callable per lane returning that lane's iterator (called on the lane's
            thread, so generators open their files there).
        numbered: the iterators yield ``(seq, item)`` (producers sharing one source; a
            ``"sequence"`` window delivers by ``seq``, the others ignore it).
        window: where the lanes put what they make (``streambuf.window.Window``), one
            lane per work.
        sizeof: bytes of one item (measured on the lane's thread).
        name: the stage name in thread names and error notes.
        join_timeout_s: how long ``close()`` waits for the threads, in total.
        on_close: called by ``close()`` after the window is closed (abort blocked I/O).
        stops_when: how a stuck thread ends, for the log line.
        describe: what lane ``t`` is working on, for error notes (e.g. "reading shard X").
        kind: the word before the name in error notes ("stage", "node").
        initial: lanes started when iteration begins (default: all); ``start(k)`` starts
            more, ``seal()`` gives up on the rest.
        gate: asked on lane ``t``'s thread before each reservation; may block (a parked
            lane); False ends the lane.
        threads: threads driving the lanes (default: one per lane); the lanes in the
            window's delivery order from ``first_lane`` (round robin: the lane delivered
            first) are dealt out in turn: thread ``j`` drives the ``j``-th, the
            ``j+threads``-th, ... Not with ``gate``/``initial``.
        live: the lanes to run (default: all); the others are finished at once (their
            works already ended), and dealing ``threads`` out skips them.
        largest: bytes of the largest item made before (a reservation's estimate until
            this runner makes a larger one; -1: none known, a lane's share).
        chunk: at most this many items per hand-off (a ``Window``, not in sequence
            order; see "Chunks" in the module docstring). 1: one by one.
    """

    def __init__(
        self,
        works: Sequence[Callable[[], Iterator[Any]]],
        /,
        *,
        window: LaneWindow[T],
        sizeof: Callable[[Any], int] = nbytes,
        name: str,
        join_timeout_s: float = 1.0,
        on_close: Callable[[], None] | None = None,
        stops_when: str = "at its next reserve",
        describe: Callable[[int], str | None] | None = None,
        kind: str = "stage",
        numbered: bool = False,
        initial: int | None = None,
        gate: Callable[[int], bool] | None = None,
        threads: int | None = None,
        first_lane: int = 0,
        live: Sequence[int] | None = None,
        largest: int = -1,
        chunk: int = 1,
    ) -> None:
        if not works:
            raise ValueError(f"{name}: a LaneRunner needs at least one lane")
        self._works = list(works)
        self._lanes = len(self._works)
        if getattr(window, "lanes", self._lanes) != self._lanes:
            raise ValueError(f"{name}: the window's lanes are not the {self._lanes} works")
        self.window = window
        self._sizeof = sizeof
        self.name = name
        self._join_timeout_s = join_timeout_s
        self._on_close = on_close
        self._stops_when = stops_when
        self._describe = describe
        self._kind = kind
        self._numbered = numbered
        if window.order == "sequence" and not numbered:
            raise ValueError(f"{name}: a 'sequence' window needs numbered works")
        self._threads: list[threading.Thread] = []
        run = set(range(self._lanes) if live is None else live)
        self._ended = [t for t in range(self._lanes) if t not in run]  # finished at start
        if threads is None or threads >= len(run):
            self._groups = [[t] for t in sorted(run)]
        else:
            if gate is not None or initial is not None:
                raise ValueError(f"{name}: threads= drives whole lane groups: no gate, initial")
            m = max(1, int(threads))
            # any subsequence of the delivery order is in delivery order: dealt out in turn
            ahead = sorted(run, key=lambda t: (t - first_lane) % self._lanes)
            self._groups = [ahead[j::m] for j in range(m)]
        if not self._groups:
            raise ValueError(f"{name}: no live lane to run")
        groups = len(self._groups)
        self._initial = groups if initial is None else max(1, min(initial, groups))
        self._gate = gate
        self._start_lock = threading.Lock()
        self._sealed = False  # no lane starts any more (its unstarted lanes are finished)
        self._started = False
        self._closed = False
        self._largest = largest  # bytes of the largest item made so far (all lanes)
        self._chunk = max(1, int(chunk))
        if self._chunk > 1 and (numbered or not hasattr(window, "commit_many")):
            raise ValueError(f"{name}: chunks need a Window that is not in sequence order")
        self._want = [1] * self._lanes  # each lane's next chunk size (grows while it pays)

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def largest(self) -> int:
        """Bytes of the largest item any lane has made (-1 before the first)."""
        return self._largest

    def _step(self, lane: int, it: Iterator[Any]) -> bool:
        """Make lane ``lane``'s next item and commit it; False when the lane ended (its
        iterator is exhausted, or its gate said so)."""
        win = self.window
        gate = self._gate
        while True:
            if gate is not None and not gate(lane):
                return False  # parked lanes end when the source does
            # the largest item any lane has made; before the first: the lane's share
            estimate = self._largest if self._largest >= 0 else win.share(lane)
            win.reserve(lane, estimate)
            try:
                got = next(it)
                if got is AGAIN:
                    win.release(lane)
                    continue
                seq, item = got if self._numbered else (None, got)
                size = check_size(self._sizeof(item))
            except StopIteration:
                win.release(lane)
                return False
            except BaseException:  # give the room back
                win.release(lane)
                raise
            if size > self._largest:  # before commit, which may wait: others learn now
                self._largest = size
            win.commit(lane, item, size, seq=seq)
            return True

    def _step_chunk(self, lane: int, it: Iterator[Any]) -> bool:
        """``_step`` for a chunk: room for up to ``_want[lane]`` items in one reservation,
        items made until it is full, ``FLUSH_S`` passed since the chunk began, an item
        outgrew the reservation, or the iterator paused (``AGAIN``: a shard's end) or
        ended; then one ``commit_many``. The items are made into lists the window holds
        (``Window.hold``): a consumer that waited ``HOLD_POLL_S`` for them takes them
        itself, so a read that stalls after an item does not hold it back. The size
        doubles after a chunk that filled before ``FLUSH_S`` passed and falls back to what
        was made after one that did not (a slow lane hands items over one by one and
        reserves room for one, as without chunks)."""
        win: Any = self.window
        gate = self._gate
        while True:
            if gate is not None and not gate(lane):
                return False
            estimate = win.share(lane) if self._largest < 0 else self._largest
            room = win.reserve(lane, estimate, self._want[lane])
            items: list[Any] = []
            sizes: list[int] = []
            if room > 1:  # a consumer waiting for them takes them from here (a stall)
                win.hold(lane, items, sizes)
            ended = late = False
            t0 = time.perf_counter()
            try:
                while len(items) < room:
                    made = next(it)
                    if made is AGAIN:
                        break
                    size = check_size(self._sizeof(made))
                    if size > self._largest:
                        self._largest = size
                    sizes.append(size)  # (before the item: ``Window.hold``)
                    items.append(made)
                    late = time.perf_counter() - t0 > FLUSH_S
                    if size > estimate or late:
                        break
            except StopIteration:
                ended = True
            except BaseException:
                win.release(lane)
                raise
            n = len(items)
            # (room may be less than wanted: the window was full); a chunk that filled
            # only as the time ran out is a slow lane's: it does not grow
            if n == room and not late:
                self._want[lane] = min(self._chunk, max(self._want[lane], 2 * room))
            elif not ended:
                self._want[lane] = max(1, n)
            if not items:
                win.release(lane)
                if ended:
                    return False
                continue  # AGAIN before any item: ask the gate again
            win.commit_many(lane, items, sizes)
            return not ended

    def _run(self, lanes: list[int]) -> None:
        """One thread: its lanes, one item of each in turn (``lanes`` in delivery order),
        until each ended; every one of them is finished in the window when it leaves."""
        win = self.window
        its: dict[int, Iterator[Any]] = {}
        live = list(lanes)
        lane = live[0]
        try:
            if len(live) == 1:  # one lane per thread (the usual case): no turns to take
                it = its[lane] = self._works[lane]()
                step = self._step_chunk if self._chunk > 1 else self._step
                while step(lane, it):
                    pass
                live.clear()
                self._end(lane, its.pop(lane))
            while live:
                for lane in tuple(live):
                    if lane not in its:
                        its[lane] = self._works[lane]()
                    if not self._step(lane, its[lane]):
                        live.remove(lane)
                        self._end(lane, its.pop(lane))
        except BufferClosed:
            pass  # the consumer closed us
        except BaseException as exc:
            what = self._describe(lane) if self._describe is not None else None
            add_note(
                exc,
                f"streambuf: raised in {self._kind} {self.name!r} on lane {lane} (thread "
                f"{threading.current_thread().name!r})" + (f" {what}" if what else ""),
            )
            win.abort(exc)
        finally:
            for t in live:
                self._end(t, its.get(t))

    def _end(self, lane: int, it: Iterator[Any] | None) -> None:
        """Lane ``lane`` leaves: its iterator closed (files, containers), then finished."""
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # closing must not hide the real outcome
                log.warning("streambuf: %s lane %d: error while closing: %r", self.name, lane, exc)
        self.window.finish(lane)

    def start(self, lanes: int | None = None) -> None:
        """Start lane threads up to ``lanes`` (default: ``initial``; at the latest when
        iteration begins). Idempotent; nothing after ``seal()`` or ``close()``."""
        want = self._initial if lanes is None else min(lanes, len(self._groups))
        with self._start_lock:
            if self._closed or self._sealed:
                return
            for lane in self._ended:
                self.window.finish(lane)
            self._ended = []
            for j in range(len(self._threads), want):
                th = threading.Thread(
                    target=self._run,
                    args=(self._groups[j],),
                    name=f"streambuf-{self.name}-{j}",
                    daemon=True,
                )
                self._threads.append(th)
                th.start()

    @property
    def started(self) -> int:
        """Lane threads started so far."""
        return len(self._threads)

    def seal(self) -> None:
        """No more lanes will start (the source is exhausted): the unstarted ones are
        finished, so the window ends when the started ones do. Idempotent."""
        with self._start_lock:
            if self._sealed:
                return
            self._sealed = True
            for lane in self._ended:
                self.window.finish(lane)
            self._ended = []
            for group in self._groups[len(self._threads) :]:
                for lane in group:
                    self.window.finish(lane)

    def __iter__(self) -> Iterator[T]:
        if self._started:
            raise RuntimeError(f"{self.name}: can be iterated only once")
        self._started = True
        self.start()
        try:
            if self._chunk == 1:
                yield from self.window  # ends when every lane finished and was drained
                return
            win: Any = self.window  # the window's items taken in runs too
            while True:
                try:
                    got = win.get_many(self._chunk)
                except BufferClosed:
                    return
                yield from got
        finally:
            self.close()

    def close(self) -> None:
        """Stop every lane and join the threads (bounded by ``join_timeout_s``). Idempotent."""
        if self._closed:
            return
        with self._start_lock:
            self._closed = True
        self.window.close()
        if self._on_close is not None:
            self._on_close()
        join_all(self._threads, timeout_s=self._join_timeout_s, stops_when=self._stops_when)
        # the works and callbacks usually point back at the stage that owns this runner:
        # drop them, so a closed stage is freed by reference counting, not a later GC
        self._works.clear()
        self._on_close = self._describe = self._gate = None

    def __enter__(self) -> LaneRunner[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> BufferStats:
        return self.window.stats()
