"""Background producers feeding a bounded buffer: ``prefetch`` and ``ThreadPrefetcher``.

``threads`` producer threads pull from one source iterator (under a lock: iterators are
sequential), apply ``fn`` outside the lock (this is where the concurrency is: I/O and
GIL-releasing decode), and commit results into one ``Window`` (``streambuf.window``)
through the package's one lane runner (``streambuf._lanes``): each thread reserves room
for its next result *before* pulling it, so results being made count against
``max_items``/``max_bytes`` too, in one pool.

* ``ordered=True``: whichever thread is free pulls the next item and numbers it; the
  window delivers by number (``order="sequence"``), so the output order is the source
  order whatever the timing; a number is taken after its room, so in-order delivery from
  one pool cannot deadlock (docs/design.md invariant 4).
* ``ordered=False``: items come out as soon as they are ready (``"first_ready"``).
* ``adaptive=True`` (with ``fn``): the function runs inline in the consumer's thread
  instead while that measures faster (a cheap function that holds the GIL: threads only
  add hand-offs; ``streambuf._inline`` decides). Switching pauses the producers at their
  next pull, delivers every item they already took (in order), then pulls from the
  source in the consumer (inline items take no number); switching back numbers the
  threads' items on from where they stopped. Order, bounds and errors are the same in
  both modes. With a fixed count ``InlineChooser`` decides; with ``threads="auto"``
  inline is the tuner's count 0 (below one thread: one controller, its windows and
  noise margins, decides both; ``_TunedInline``).

* ``threads="auto"``: the number of producer threads is chosen by measurement
  (``streambuf._tuner``): it starts at 4 (at most ``max_threads``), grows while the
  rate the consumer sees rises and the byte bound has room for each thread's item, and
  shrinks when fewer threads deliver clearly more (a GIL-bound function; with
  ``adaptive`` down to inline, count 0). Lanes start as the count grows; a lane
  above the count parks before it reserves room for its next item, after committing the
  one it made (nothing is dropped, nothing held while parked); order, bounds and errors
  are those of a fixed count. ``tuner.history`` records every change the tuner made. In
  a Loader the stage's copies in all workers share one decision (``lead``: worker 0
  climbs, the others take its count; ``streambuf._tuner.Lead``); a follower's changes
  are the leader's, not in its own tuner's history.

Errors: an exception in the source or in ``fn`` is re-raised in the consumer, the same
object with its original traceback and a note naming the stage, thread and item index;
held items are dropped at that point (fail fast). Shutdown: leaving the loop (``break``,
an exception, ``close()``, the ``with`` block) closes the buffer, which wakes every
producer blocked in ``put``; threads are joined within ``join_timeout_s``. A thread stuck
inside ``fn`` cannot be interrupted from outside: it is a daemon, logged, and exits at its
next ``put``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ._cost import CallCost
from ._counters import INLINE
from ._inline import Action, InlineChooser
from ._lanes import AGAIN, LaneRunner
from ._tuner import START_THREADS, Lead, ThreadTuner, room_for
from ._units import (
    check_bool,
    check_callable,
    check_count_or_auto,
    check_seconds,
    check_thread_count,
    parse_count,
)
from .errors import add_note, stop_as_error
from .sizing import nbytes
from .stats import BufferStats
from .window import Window

__all__ = ["ThreadPrefetcher", "prefetch"]

T = TypeVar("T")
log = logging.getLogger("streambuf")
_END = object()
_CLOSED = iter(())  # the source's iterator once closed (``close_source``): ends at once
MAX_THREADS = 64  # threads="auto": the default ceiling per process
_FOLLOW_EVERY = 8  # a follower reads its leader's count every this many items


def parse_threads(threads: Any, max_threads: Any = None) -> tuple[int, bool]:
    """``threads`` (an int >= 1 or ``"auto"``) and ``max_threads`` (None or an int >= 1,
    only with ``"auto"``) -> (lanes to provision, auto?). The one validation of both."""
    if check_count_or_auto(threads, name="threads") == "auto":
        top = (
            MAX_THREADS
            if max_threads is None
            else check_thread_count(max_threads, name="max_threads")
        )
        return top, True
    if max_threads is not None:
        raise ValueError(
            f"max_threads={max_threads!r} bounds threads='auto' only (threads={threads!r} "
            "is fixed): pass threads='auto', or drop max_threads"
        )
    return parse_count(threads, name="threads"), False


class _Steps:
    """An iterator over ``step()`` calls (``StopIteration`` ends it)."""

    __slots__ = ("_step",)

    def __init__(self, step: Callable[[], Any]) -> None:
        self._step = step

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> Any:
        return self._step()


class _TunedInline:
    """``InlineChooser``'s part in ``ThreadPrefetcher._adaptive_iter`` for
    ``threads="auto"`` with ``adaptive``: inline is the tuner's count 0 (one controller
    decides threads and inline alike, on the same windows and noise margins), so this
    only follows the count: it ticks the tuner on inline items (the loop ticks it on
    threaded ones) and asks for a pause when the count falls to 0, a resume when it
    comes back.

    It is handed what it reads, not the prefetcher: ``tick`` (account one delivered
    item, ``ThreadPrefetcher._tick``) and ``threads`` (the count now, 0 inline)."""

    def __init__(self, tick: Callable[[], None], threads: Callable[[], int]) -> None:
        self._tick, self._threads = tick, threads
        self.inline = False  # items are made inline now
        self.state = "threads"  # threads, drain, inline
        self.switches = 0

    def drained(self) -> None:
        """The producers are paused and every item they made was delivered."""
        self.inline, self.state = True, "inline"
        self.switches += 1

    def tick(self) -> Action:
        if self.inline:
            self._tick()
        active = self._threads()
        if active == 0 and self.state == "threads":
            self.state = "drain"
            return "pause"
        if active > 0 and self.state != "threads":
            self.inline, self.state = False, "threads"
            return "resume"
        return "none"


class ThreadPrefetcher(Generic[T]):
    """Iterate ``iterable`` (optionally mapped by ``fn``) through a bounded buffer filled
    by background threads. See the module docstring for ordering and error rules.

    Args:
        iterable: the source; iterated once, on the producer threads.
        max_items: items held at most, including those being made.
        max_bytes: bytes held at most (int or "1GiB"), oversize rule as in ``Window``.
        threads: producer threads (>= 1), or ``"auto"`` (module docstring).
        max_threads: with ``threads="auto"``: the most threads (default 64).
        on_threads: with ``threads="auto"``: called with the count when iteration
            starts, at each change (``streambuf._counters.INLINE``, -1, while the stage
            runs inline: running, no thread), and with 0 when the stage closes (a gauge).
        lead: with ``threads="auto"``: one decision for the stage's copies in every
            worker (``streambuf._tuner.Lead``): a follower takes the leader's count
            while the leader runs, and climbs on its own otherwise. None: decide alone.
        fn: applied to each item on a producer thread; identity if None.
        ordered: deliver in source order (True) or as soon as ready (False).
        sizeof: bytes of one output item; ``streambuf.nbytes`` by default.
        name: the stage name used in error notes and thread names.
        join_timeout_s: how long ``close()`` waits for the threads, in total.
        adaptive: with ``fn`` and ``threads > 1``, run ``fn`` inline while that measures
            faster (module docstring).
        close_source: the iterator taken from ``iterable`` is this object's to close:
            when it stops (the end, ``break``, an error, ``close()``) it closes that
            iterator too, once no thread is inside it (a pipeline's stages: the
            upstream stage's threads and files stop with it, not at some later garbage
            collection). False (``prefetch()``): a caller's iterator is left open.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        /,
        *,
        max_items: int,
        max_bytes: int | str,
        threads: int | str = 1,
        fn: Callable[[Any], T] | None = None,
        ordered: bool = True,
        sizeof: Callable[[Any], int] = nbytes,
        name: str | None = None,
        join_timeout_s: float = 1.0,
        adaptive: bool = False,
        max_threads: int | None = None,
        on_threads: Callable[[int], None] | None = None,
        lead: Lead | None = None,
        close_source: bool = False,
    ) -> None:
        self._threads_n, auto = parse_threads(threads, max_threads)
        check_callable(fn, name="fn", optional=True)
        check_callable(sizeof, name="sizeof")
        check_callable(on_threads, name="on_threads", optional=True)
        check_bool(ordered, name="ordered")
        check_bool(adaptive, name="adaptive")
        check_bool(close_source, name="close_source")
        join_timeout_s = check_seconds(join_timeout_s, name="join_timeout_s", allow_zero=True)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name={name!r} must be a str or None")
        self._source = iterable
        self._close_source = close_source
        self._fn = fn
        self._ordered = ordered
        self.name = name or (f"map({getattr(fn, '__name__', 'fn')})" if fn else "prefetch")
        self._src_lock = threading.Lock()
        self._it: Iterator[Any] | None = None
        self._next_index = 0  # items pulled (threads and inline)
        self._next_seq = 0  # items pulled by the threads: the window's numbers
        self._exhausted = False
        self._adaptive = bool(adaptive) and fn is not None and (self._threads_n > 1 or auto)
        self._pause = threading.Condition()  # producers wait here while paused
        self._paused = False
        self._stopped = False
        self._delivered = 0  # items the consumer has yielded (adaptive mode)
        self.inline_items = 0  # items made inline, in the consumer's thread
        # threads="auto" starts at START_THREADS (within max_threads and max_items)
        start = min(START_THREADS, self._threads_n, parse_count(max_items, name="max_items"))
        self._active = start if auto else self._threads_n
        self._on_threads = on_threads
        self._lead = lead if auto and lead is not None and not lead.leader else None
        self._ticks = 0  # items delivered (a follower reads its leader's count every few)
        self._following = False  # the count is the leader's (own climb paused)
        window: Window[T] = Window(
            lanes=self._threads_n,
            order="sequence" if ordered else "first_ready",
            max_items=max_items,
            max_bytes=max_bytes,
        )
        self._window = window
        self._runner: LaneRunner[T] = LaneRunner(
            [self._make_work(t) for t in range(self._threads_n)],
            window=window,
            numbered=True,
            sizeof=sizeof,
            name=self.name,
            join_timeout_s=join_timeout_s,
            on_close=self._stop_producers,
            initial=self._active,
            gate=self._gate if (auto or self._adaptive) else None,
        )
        self.tuner: ThreadTuner | None = None
        # with "auto": what fn's calls cost on their threads, the tuner's contention signal
        self._cost = CallCost() if auto and fn is not None else None
        if auto:
            # adaptive: inline is the tuner's count 0 (one controller, ``_TunedInline``)
            self.tuner = ThreadTuner(
                max_threads=self._threads_n,
                start=start,
                room=self._room,
                held=lambda: self._window.held()[0],
                inline=self._adaptive,
                cost=self._cost.totals if self._cost is not None else None,
            )
        self.chooser = (
            InlineChooser(max(4 * self._threads_n, 32)) if self._adaptive and not auto else None
        )

    def held(self) -> tuple[int, int]:
        """(items, bytes) in its window now (made or being made)."""
        return self._window.held()

    # -- producers --------------------------------------------------------------------
    def _pull(self) -> tuple[int, int, Any] | object:
        """Next (seq, index, item) for a thread; ``_END`` when the source is exhausted
        (or the stage closed); ``AGAIN`` while paused (the lane gives its room back and
        waits in its gate, ``_gate``)."""
        with self._src_lock:
            if self._exhausted or self._stopped:
                return _END
            if self._paused:
                return AGAIN
            got = self._next_locked()
            if got is _END:
                return _END
            assert isinstance(got, tuple)
            seq = self._next_seq
            self._next_seq += 1
            return (seq, *got)

    def _next_locked(self) -> tuple[int, Any] | object:
        """Take the source's next item (caller holds ``_src_lock``): ``(idx, item)``, or
        ``_END`` at the end."""
        if self._it is None:
            self._it = iter(self._source)
        try:
            item = next(self._it)
        except StopIteration:
            self._exhausted = True
            self._no_more_lanes()
            return _END
        except BaseException as exc:
            self._exhausted = True
            self._no_more_lanes()
            add_note(exc, f"streambuf: raised in stage {self.name!r} by the source iterator")
            raise
        finally:
            if self._stopped:  # the stage stopped while this thread was inside the source
                self._close_source_locked()
        idx = self._next_index
        self._next_index += 1
        return idx, item

    # -- the thread count (threads="auto") ----------------------------------------------
    def _room(self) -> int:
        """Threads the bounds have room for: one item in flight each."""
        win = self._window
        return room_for(win.max_items, win.max_bytes, self._runner.largest)

    def _gate(self, lane: int) -> bool:
        """Before lane ``lane`` reserves room: parks while the lane is above the count or
        the producers are paused (nothing held while parked); False (the lane ends) once
        the source is exhausted or the stage stopped."""
        if lane < self._active and not self._paused:
            return True
        with self._pause:
            while (lane >= self._active or self._paused) and not (self._stopped or self._exhausted):
                self._pause.wait()
            return lane < self._active and not self._stopped

    def _set_threads(self, count: int) -> None:
        """Run ``count`` producer threads from now (0: none, the consumer runs ``fn``
        inline: ``_adaptive_iter`` pauses the producers and drains them first)."""
        with self._pause:
            self._active = count
            self._pause.notify_all()
        self._runner.start(count)
        if self._on_threads is not None:
            self._on_threads(count if count > 0 else INLINE)

    def _no_more_lanes(self) -> None:
        """The source is exhausted: parked lanes end, unstarted ones never start."""
        with self._pause:
            self._pause.notify_all()
        self._runner.seal()

    @property
    def threads(self) -> int:
        """Producer threads in use now (the tuned count with ``threads="auto"``)."""
        return self._active

    def _tick(self) -> None:
        tuner = self.tuner
        if tuner is None:
            return
        lead = self._lead
        if lead is not None:  # a follower: the leader's count while it runs
            self._ticks += 1
            if self._ticks % _FOLLOW_EVERY == 1:
                want = lead.count()
                if want is not None:
                    want = max(tuner.least, min(want, self._threads_n, self._room()))
                    if want != self._active:
                        self._set_threads(want)
                    self._following = True
                elif self._following:  # the leader is gone: climb from here alone
                    self._following = False
                    tuner.adopt(self._active)
                    if tuner.count != self._active:  # the room shrank meanwhile
                        self._set_threads(tuner.count)
            if self._following:
                return
        count = tuner.tick()
        if count is not None:
            self._set_threads(count)

    def _stop_producers(self) -> None:
        with self._pause:
            self._stopped = True
            self._pause.notify_all()

    def _stop(self) -> None:
        """The stage is done: stop and join the producers (bounded), then close the
        source's iterator where it is ours (``close_source``). A producer still inside
        the source (a read that blocks) holds ``_src_lock``: it closes the iterator
        itself when the read returns (``_next_locked``)."""
        self._runner.close()
        if self.tuner is not None:
            self.tuner.detach()
        if self._src_lock.acquire(timeout=0.05):
            try:
                self._close_source_locked()
            finally:
                self._src_lock.release()

    def _close_source_locked(self) -> None:
        """Close the source's iterator (caller holds ``_src_lock``; once; ours only)."""
        it = self._it
        if not self._close_source or it is None or it is _CLOSED:
            return
        self._it = _CLOSED
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # closing must not hide the real outcome
                log.warning("streambuf: %s: error while closing its source: %r", self.name, exc)

    def _set_paused(self, paused: bool) -> None:
        with self._pause:
            self._paused = paused
            self._pause.notify_all()

    def _next_made(self) -> tuple[int, Any]:
        """A thread's next ``(seq, result)`` (the lane runner's iterator step): a plain
        call, not a generator, so a thread blocked in ``reserve`` pins nothing it made."""
        got = self._pull()
        if got is _END:
            raise StopIteration
        if got is AGAIN:
            return AGAIN  # type: ignore[return-value]
        assert isinstance(got, tuple)
        seq, idx, item = got
        fn = self._fn
        if fn is None:
            return seq, item
        try:
            cost = self._cost
            return seq, (fn(item) if cost is None else cost.call(fn, item))
        except StopIteration as stop:  # from fn: it must not end the stream
            raise stop_as_error(stop, "fn", self._where(idx)) from stop
        except BaseException as exc:
            add_note(exc, self._where(idx))
            raise

    def _where(self, idx: int) -> str:
        return (
            f"streambuf: raised in stage {self.name!r} on thread "
            f"{threading.current_thread().name!r} while processing item #{idx}"
        )

    def _make_work(self, t: int) -> Callable[[], Iterator[tuple[int, T]]]:
        return lambda: _Steps(self._next_made)

    # -- consumer ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        gauge = self._on_threads if self.tuner is not None else None
        if gauge is not None:
            gauge(self._active)
        try:
            if self.chooser is not None:
                yield from self._adaptive_iter(self.chooser)
            elif self.tuner is None:
                yield from self._runner
            elif self.tuner.least == 0:
                yield from self._adaptive_iter(_TunedInline(self._tick, lambda: self._active))
            else:
                for item in self._runner:
                    self._tick()
                    yield item
        finally:
            try:
                self._stop()
            finally:
                if gauge is not None:
                    gauge(0)

    def _all_delivered(self) -> bool:
        with self._src_lock:
            return self._delivered == self._next_index

    def _inline_next(self) -> tuple[bool, Any]:
        """The source's next item made in the consumer's thread: (True, result), or
        (False, None) at the end."""
        fn = self._fn
        assert fn is not None
        with self._src_lock:
            got = _END if self._exhausted else self._next_locked()
        if got is _END:
            return False, None
        assert isinstance(got, tuple)
        idx, item = got
        where = (
            f"streambuf: raised in stage {self.name!r} (inline, in the consumer) "
            f"while processing item #{idx}"
        )
        try:
            cost = self._cost
            out = fn(item) if cost is None else cost.call(fn, item)
        except StopIteration as stop:  # from fn, inline: not the end of the stream either
            raise stop_as_error(stop, "fn", where) from stop
        except BaseException as exc:
            add_note(exc, where)
            raise
        self.inline_items += 1
        return True, out

    def _adaptive_iter(self, chooser: InlineChooser | _TunedInline) -> Iterator[T]:
        """Deliver from the threads or inline, as ``chooser`` decides (module docstring):
        going inline pauses the producers at their next pull and delivers every item
        they took (in order: *drain*), then pulls from the source here; back to threads
        resumes them (they number their items on from where they stopped). Drained items
        come back to back: they are not ticked (a window would count them as the new
        mode's)."""
        runner = self._runner.__iter__()  # a generator: closed in ``finally``
        try:
            while True:
                if chooser.state == "drain" and self._all_delivered():
                    chooser.drained()
                if chooser.inline:
                    made, out = self._inline_next()
                    if not made:  # the producers end too, the runner drains
                        chooser.inline = False
                        self._set_paused(False)
                        continue
                else:
                    try:
                        out = next(runner)
                    except StopIteration:
                        return
                    if chooser.state != "drain":  # drained items came back to back
                        self._tick()
                self._delivered += 1
                action = chooser.tick()
                if action == "pause":
                    self._set_paused(True)
                if action != "none" and self.tuner is not None:
                    self.tuner.restart()  # the window spans a change of mode: void
                if action == "resume":
                    self._set_paused(False)
                yield out
        finally:
            self._runner.close()  # the generator too: it ends with the buffer

    def close(self) -> None:
        """Stop the producers and join them (bounded by ``join_timeout_s``); close the
        source's iterator where it is ours (``close_source``). Idempotent."""
        self._stop()

    def __enter__(self) -> ThreadPrefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> BufferStats:
        """Snapshot of the window (``streambuf.window.Window``)."""
        return self._runner.stats()


def prefetch(
    iterable: Iterable[Any],
    /,
    *,
    max_items: int,
    max_bytes: int | str,
    threads: int | str = 1,
    fn: Callable[[Any], Any] | None = None,
    ordered: bool = True,
    sizeof: Callable[[Any], int] = nbytes,
    name: str | None = None,
    max_threads: int | None = None,
) -> ThreadPrefetcher[Any]:
    """Prefetch ``iterable`` on background threads into a byte- and count-bounded buffer.

    ``for x in prefetch(items, max_items=8, max_bytes="1GiB", threads=4, fn=load): ...``
    See ``ThreadPrefetcher`` for the arguments. Use it in a ``with`` block (or just break out
    of the loop) and every producer thread is stopped.
    """
    return ThreadPrefetcher(
        iterable,
        max_items=max_items,
        max_bytes=max_bytes,
        threads=threads,
        fn=fn,
        ordered=ordered,
        sizeof=sizeof,
        name=name,
        max_threads=max_threads,
    )
