"""Background producers feeding a bounded buffer: ``prefetch`` and ``Prefetcher``.

``threads`` producer threads pull from one source iterator (under a lock: iterators are
sequential), apply ``fn`` outside the lock (this is where the concurrency is: I/O and
GIL-releasing decode), and put results into a ``ShardedBuffer`` with one lane per
thread, through the package's one lane runner (``streambuf._lanes``): each thread
reserves room for its next result *before* making it, so results being made count
against ``max_items``/``max_bytes`` too.

* ``ordered=True``: item ``i`` goes to lane ``i % threads`` and the buffer delivers
  round-robin, so the output order is the source order whatever the timing; the budget is
  sharded per lane, so in-order delivery cannot deadlock (docs/design.md invariant 4).
* ``ordered=False``: lanes share one pool and items come out as soon as they are ready.
* ``adaptive=True`` (with ``fn``): the function runs inline in the consumer's thread
  instead while that measures faster (a cheap function that holds the GIL: threads only
  add hand-offs; ``streambuf._inline`` decides). Switching pauses the producers at their
  next pull, delivers every item they already took (in order), then pulls from the
  source in the consumer; switching back restarts the round robin at the next item's
  lane. Order, bounds and errors are the same in both modes.

Errors: an exception in the source or in ``fn`` is re-raised in the consumer, the same
object with its original traceback and a note naming the stage, thread and item index;
held items are dropped at that point (fail fast). Shutdown: leaving the loop (``break``,
an exception, ``close()``, the ``with`` block) closes the buffer, which wakes every
producer blocked in ``put``; threads are joined within ``join_timeout_s``. A thread stuck
inside ``fn`` cannot be interrupted from outside: it is a daemon, logged, and exits at its
next ``put``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ._inline import InlineChooser
from ._lanes import LaneRunner
from ._units import parse_count
from .buffer import BufferStats
from .errors import add_note
from .sizing import nbytes

__all__ = ["Prefetcher", "prefetch"]

T = TypeVar("T")
_END = object()


class Prefetcher(Generic[T]):
    """Iterate ``iterable`` (optionally mapped by ``fn``) through a bounded buffer filled
    by background threads. See the module docstring for ordering and error rules.

    Args:
        iterable: the source; iterated once, on the producer threads.
        max_items: items held at most, including those being made (>= threads when ordered).
        max_bytes: bytes held at most (int or "1GiB"), oversize rule as in BoundedBuffer.
        threads: producer threads (>= 1).
        fn: applied to each item on a producer thread; identity if None.
        ordered: deliver in source order (True) or as soon as ready (False).
        sizeof: bytes of one output item; ``streambuf.nbytes`` by default.
        name: the stage name used in error notes and thread names.
        join_timeout_s: how long ``close()`` waits for the threads, in total.
        adaptive: with ``fn`` and ``threads > 1``, run ``fn`` inline while that measures
            faster (module docstring).
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        /,
        *,
        max_items: int,
        max_bytes: int | str,
        threads: int = 1,
        fn: Callable[[Any], T] | None = None,
        ordered: bool = True,
        sizeof: Callable[[Any], int] = nbytes,
        name: str | None = None,
        join_timeout_s: float = 1.0,
        adaptive: bool = False,
    ) -> None:
        self._threads_n = parse_count(threads, name="threads")
        parse_count(max_items, name="max_items")
        if ordered and max_items < self._threads_n:
            raise ValueError(
                f"max_items={max_items} must be >= threads={threads} when ordered=True "
                "(each thread owns at least one slot); raise max_items or lower threads"
            )
        self._source = iterable
        self._fn = fn
        self._ordered = ordered
        self.name = name or (f"map({getattr(fn, '__name__', 'fn')})" if fn else "prefetch")
        self._src_lock = threading.Lock()
        self._it: Iterator[Any] | None = None
        self._next_index = 0
        self._exhausted = False
        self._stash: list[deque[tuple[int, Any]]] = [deque() for _ in range(self._threads_n)]
        self._adaptive = bool(adaptive) and fn is not None and self._threads_n > 1
        self._pause = threading.Condition()  # producers wait here while paused
        self._paused = False
        self._stopped = False
        self._delivered = 0  # items the consumer has yielded (adaptive mode)
        self.inline_items = 0  # items made inline, in the consumer's thread
        self._runner: LaneRunner[T] = LaneRunner(
            [self._make_work(t) for t in range(self._threads_n)],
            order="round_robin" if ordered else "first_ready",
            max_items=max_items,
            max_bytes=max_bytes,
            sizeof=sizeof,
            name=self.name,
            join_timeout_s=join_timeout_s,
            on_close=self._stop_producers,
        )
        self.chooser = InlineChooser(max(4 * self._threads_n, 32)) if self._adaptive else None

    # -- producers --------------------------------------------------------------------
    def _pull(self, t: int) -> tuple[int, Any] | object:
        """Next (index, item) for thread ``t``; ``_END`` when the source is exhausted
        (or the stage closed). While paused, a thread serves its stash, then waits."""
        while True:
            with self._src_lock:
                stash = self._stash[t]
                if stash:
                    return stash.popleft()
                if self._exhausted or self._stopped:
                    return _END
                if not self._paused:
                    got = self._next_locked(t)
                    if got is None:
                        continue  # stashed for its owner: pull again
                    return got
            with self._pause:
                while self._paused and not self._stopped:
                    self._pause.wait()

    def _next_locked(self, t: int | None) -> tuple[int, Any] | object | None:
        """Take the source's next item (caller holds ``_src_lock``): ``(idx, item)`` if
        thread ``t`` owns it (``t=None``: the consumer, inline), None if it was stashed
        for its owner, ``_END`` at the end."""
        if self._it is None:
            self._it = iter(self._source)
        try:
            item = next(self._it)
        except StopIteration:
            self._exhausted = True
            return _END
        except BaseException as exc:
            self._exhausted = True
            add_note(exc, f"streambuf: raised in stage {self.name!r} by the source iterator")
            raise
        idx = self._next_index
        self._next_index += 1
        if t is None or not self._ordered or idx % self._threads_n == t:
            return idx, item
        self._stash[idx % self._threads_n].append((idx, item))
        return None

    def _stop_producers(self) -> None:
        with self._pause:
            self._stopped = True
            self._pause.notify_all()

    def _set_paused(self, paused: bool) -> None:
        with self._pause:
            if not paused and self._ordered:  # the next item's lane is the next delivered
                with self._src_lock:
                    self._runner._buf._restart_at(self._next_index % self._threads_n)
            self._paused = paused
            self._pause.notify_all()

    def _make_work(self, t: int) -> Callable[[], Iterator[T]]:
        def work() -> Iterator[T]:
            fn = self._fn
            while True:
                got = self._pull(t)
                if got is _END:
                    return
                assert isinstance(got, tuple)
                idx, item = got
                if fn is None:
                    yield item
                    continue
                try:
                    out = fn(item)
                except BaseException as exc:
                    add_note(
                        exc,
                        f"streambuf: raised in stage {self.name!r} on thread "
                        f"{threading.current_thread().name!r} while processing item #{idx}",
                    )
                    raise
                yield out

        return work

    # -- consumer ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        if self.chooser is None:
            yield from self._runner
            return
        yield from self._adaptive_iter(self.chooser)

    def _all_delivered(self) -> bool:
        with self._src_lock:
            return self._delivered == self._next_index

    def _adaptive_iter(self, chooser: InlineChooser) -> Iterator[T]:
        """Deliver from the threads or inline, as ``chooser`` decides (module docstring)."""
        fn = self._fn
        assert fn is not None
        runner = self._runner.__iter__()  # a generator: closed in ``finally``
        try:
            while True:
                if chooser.state == "drain" and self._all_delivered():
                    chooser.drained()
                if chooser.inline:
                    with self._src_lock:
                        got = _END if self._exhausted else self._next_locked(None)
                    if got is _END:  # the producers end too, the runner drains
                        chooser.inline = False
                        self._set_paused(False)
                        continue
                    assert isinstance(got, tuple)
                    idx, item = got
                    try:
                        out = fn(item)
                    except BaseException as exc:
                        add_note(
                            exc,
                            f"streambuf: raised in stage {self.name!r} (inline, in the "
                            f"consumer) while processing item #{idx}",
                        )
                        raise
                    self.inline_items += 1
                else:
                    try:
                        out = next(runner)
                    except StopIteration:
                        return
                self._delivered += 1
                action = chooser.tick()
                if action == "pause":
                    self._set_paused(True)
                elif action == "resume":
                    self._set_paused(False)
                yield out
        finally:
            self._runner.close()  # the generator too: it ends with the buffer

    def close(self) -> None:
        """Stop the producers and join them (bounded by ``join_timeout_s``). Idempotent."""
        self._runner.close()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> BufferStats:
        """Snapshot of the underlying buffer (one lane per thread)."""
        return self._runner.stats()


def prefetch(
    iterable: Iterable[Any],
    /,
    *,
    max_items: int,
    max_bytes: int | str,
    threads: int = 1,
    fn: Callable[[Any], Any] | None = None,
    ordered: bool = True,
    sizeof: Callable[[Any], int] = nbytes,
    name: str | None = None,
) -> Prefetcher[Any]:
    """Prefetch ``iterable`` on background threads into a byte- and count-bounded buffer.

    ``for x in prefetch(items, max_items=8, max_bytes="1GiB", threads=4, fn=load): ...``
    See ``Prefetcher`` for the arguments. Use it in a ``with`` block (or just break out
    of the loop) and every producer thread is stopped.
    """
    return Prefetcher(
        iterable,
        max_items=max_items,
        max_bytes=max_bytes,
        threads=threads,
        fn=fn,
        ordered=ordered,
        sizeof=sizeof,
        name=name,
    )
