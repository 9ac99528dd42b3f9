"""Background producers feeding a bounded buffer: ``prefetch`` and ``Prefetcher``.

``threads`` producer threads pull from one source iterator (under a lock: iterators are
sequential), apply ``fn`` outside the lock (this is where the concurrency is: I/O and
GIL-releasing decode), and put results into a ``ShardedBuffer`` with one lane per thread.

* ``ordered=True``: item ``i`` goes to lane ``i % threads`` and the buffer delivers
  round-robin, so the output order is the source order whatever the timing; the budget is
  sharded per lane, so in-order delivery cannot deadlock (DESIGN.md invariant 4).
* ``ordered=False``: lanes share one pool and items come out as soon as they are ready.

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
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from ._threads import join_all
from ._units import parse_count
from .buffer import BufferStats, ShardedBuffer
from .errors import BufferClosed, add_note
from .sizing import nbytes

__all__ = ["Prefetcher", "prefetch"]

log = logging.getLogger("streambuf")

T = TypeVar("T")
_END = object()


class Prefetcher(Generic[T]):
    """Iterate ``iterable`` (optionally mapped by ``fn``) through a bounded buffer filled
    by background threads. See the module docstring for ordering and error rules.

    Args:
        iterable: the source; iterated once, on the producer threads.
        max_items: items held at most (>= threads when ordered).
        max_bytes: bytes held at most (int or "1GiB"), oversize rule as in BoundedBuffer.
        threads: producer threads (>= 1).
        fn: applied to each item on a producer thread; identity if None.
        ordered: deliver in source order (True) or as soon as ready (False).
        sizeof: bytes of one output item; ``streambuf.nbytes`` by default.
        name: the stage name used in error notes and thread names.
        join_timeout_s: how long ``close()`` waits for the threads, in total.
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
    ) -> None:
        self._threads_n = parse_count(threads, name="threads")
        if ordered and max_items < self._threads_n:
            raise ValueError(
                f"max_items={max_items} must be >= threads={threads} when ordered=True "
                "(each thread owns at least one slot); raise max_items or lower threads"
            )
        self._buf: ShardedBuffer[T] = ShardedBuffer(
            lanes=self._threads_n,
            max_items=max_items,
            max_bytes=max_bytes,
            order="round_robin" if ordered else "first_ready",
            sizeof=sizeof,
        )
        self._source = iterable
        self._fn = fn
        self._ordered = ordered
        self.name = name or (f"map({getattr(fn, '__name__', 'fn')})" if fn else "prefetch")
        self._join_timeout_s = join_timeout_s
        self._src_lock = threading.Lock()
        self._it: Iterator[Any] | None = None
        self._next_index = 0
        self._exhausted = False
        self._stash: list[deque[tuple[int, Any]]] = [deque() for _ in range(self._threads_n)]
        self._threads: list[threading.Thread] = []
        self._started = False
        self._stop = threading.Event()

    # -- producers --------------------------------------------------------------------
    def _pull(self, t: int) -> tuple[int, Any] | object:
        """Next (index, item) for thread ``t``; ``_END`` when the source is exhausted."""
        with self._src_lock:
            stash = self._stash[t]
            while True:
                if stash:
                    return stash.popleft()
                if self._exhausted or self._stop.is_set():
                    return _END
                assert self._it is not None
                try:
                    item = next(self._it)
                except StopIteration:
                    self._exhausted = True
                    return _END
                idx = self._next_index
                self._next_index += 1
                owner = idx % self._threads_n if self._ordered else t
                if owner == t:
                    return idx, item
                self._stash[owner].append((idx, item))

    def _produce(self, t: int) -> None:
        idx = -1
        try:
            while True:
                got = self._pull(t)
                if got is _END:
                    break
                assert isinstance(got, tuple)
                idx, item = got
                if self._fn is not None:
                    # wait for a slot before making the item: what is being made counts
                    self._buf._await_slot(t)
                out = self._fn(item) if self._fn is not None else item
                self._buf.put(t, out)
        except BufferClosed:
            pass  # the consumer closed us: a normal stop
        except BaseException as exc:
            where = f"item #{idx}" if idx >= 0 else "the source iterator"
            add_note(
                exc,
                f"streambuf: raised in stage {self.name!r} on thread "
                f"{threading.current_thread().name!r} while processing {where}",
            )
            self._buf.abort(exc)
        finally:
            self._buf.finish(t)

    def _start(self) -> None:
        if self._started:
            raise RuntimeError(f"{self.name}: a Prefetcher can be iterated only once")
        self._started = True
        self._it = iter(self._source)
        for t in range(self._threads_n):
            th = threading.Thread(
                target=self._produce, args=(t,), name=f"streambuf-{self.name}-{t}", daemon=True
            )
            self._threads.append(th)
            th.start()

    # -- consumer ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[T]:
        self._start()
        try:
            yield from self._buf
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producers and join them (bounded by ``join_timeout_s``). Idempotent."""
        self._stop.set()
        self._buf.close()
        join_all(self._threads, timeout_s=self._join_timeout_s, stops_when="at its next put")

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> BufferStats:
        """Snapshot of the underlying buffer (one lane per thread)."""
        return self._buf.stats()


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
    parse_count(max_items, name="max_items")
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
