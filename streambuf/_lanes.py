"""``LaneRunner``: the one thread-lane runner behind every concurrent stage.

A threaded map (``Prefetcher``), the shard readers of ``shards()`` and the video lanes of
``video.clips()`` all run the same loop: ``K`` threads, lane ``t`` draining its own work
iterator into lane ``t`` of one ``ShardedBuffer`` that the consumer iterates.

* **Reserve before build.** Before asking its iterator for the next item, a lane reserves
  room for it in the buffer (its estimate: the largest item any lane has made, or the
  lane's whole share of the byte bound before the first one), so the item being built
  counts against ``max_bytes``/``max_items`` like a queued one; ``put`` then turns the
  reservation into the item. An item larger than its reservation gives the room back
  and waits for enough (its lane's earlier items are ahead of it, so this cannot
  deadlock; alone in an empty lane it is admitted whatever its size, counted in
  ``oversize``), and raises the estimate. Bytes held never pass the bound: only that
  one finished item, waiting in its thread, is outside the count.
* **Order.** ``"round_robin"``: the consumer takes lane 0, 1, ... (deterministic;
  budgets sharded per lane, deadlock-free); ``"first_ready"``: arrival order (pooled).
  ``start_lane`` is where round robin begins (a resumed stream).
* **Errors.** An exception in a work iterator aborts the buffer: the consumer gets the
  same object, with a note naming the stage, lane and thread; held items are dropped.
* **Shutdown.** Leaving the loop (end, ``break``, an exception) or ``close()`` closes
  the buffer (every blocked reserve/put wakes with ``BufferClosed``), calls
  ``on_close`` (e.g. to abort in-flight reads), and joins the threads within
  ``join_timeout_s``; each lane closes its work iterator (files, containers) on exit. A
  thread stuck in user or I/O code is a daemon: logged, it ends at its next reserve.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from ._threads import join_all
from ._units import check_size
from .buffer import BufferStats, Order, ShardedBuffer
from .errors import BufferClosed, add_note
from .sizing import nbytes

__all__ = ["LaneRunner"]

log = logging.getLogger("streambuf")

T = TypeVar("T")


class LaneRunner(Generic[T]):
    """Run ``works[t]()`` on lane thread ``t`` into one bounded buffer; iterate once.

    Args:
        works: one callable per lane returning that lane's iterator (called on the lane's
            thread, so generators open their files there).
        order, max_items, max_bytes, sizeof, start_lane: the buffer (``ShardedBuffer``).
        name: the stage name in thread names and error notes.
        join_timeout_s: how long ``close()`` waits for the threads, in total.
        on_close: called by ``close()`` after the buffer is closed (abort blocked I/O).
        stops_when: how a stuck thread ends, for the log line.
        describe: what lane ``t`` is working on, for error notes (e.g. "reading shard X").
    """

    def __init__(
        self,
        works: Sequence[Callable[[], Iterator[T]]],
        /,
        *,
        order: Order,
        max_items: int,
        max_bytes: int | str,
        sizeof: Callable[[Any], int] = nbytes,
        name: str,
        join_timeout_s: float = 1.0,
        start_lane: int = 0,
        on_close: Callable[[], None] | None = None,
        stops_when: str = "at its next put",
        describe: Callable[[int], str | None] | None = None,
    ) -> None:
        if not works:
            raise ValueError(f"{name}: a LaneRunner needs at least one lane")
        self._works = list(works)
        self._buf: ShardedBuffer[T] = ShardedBuffer(
            lanes=len(self._works),
            max_items=max_items,
            max_bytes=max_bytes,
            order=order,
            sizeof=sizeof,
            start_lane=start_lane,
        )
        self._sizeof = sizeof
        self.name = name
        self._join_timeout_s = join_timeout_s
        self._on_close = on_close
        self._stops_when = stops_when
        self._describe = describe
        self._threads: list[threading.Thread] = []
        self._started = False
        self._closed = False
        self._largest = -1  # bytes of the largest item made so far (all lanes)

    @property
    def lanes(self) -> int:
        return len(self._works)

    def _run(self, lane: int) -> None:
        buf = self._buf
        it: Iterator[T] | None = None
        try:
            it = self._works[lane]()
            while True:
                # the largest item any lane has made; before the first: the lane's share
                estimate = self._largest if self._largest >= 0 else buf._lane_limit(lane)
                buf.reserve(lane, estimate)
                try:
                    item = next(it)
                except BaseException:  # StopIteration included: give the room back
                    buf.cancel(lane, estimate)
                    raise
                size = check_size(self._sizeof(item))
                if size <= estimate:
                    buf._put(lane, item, None, estimate, size)
                else:  # larger than its room: give the room back, wait for enough
                    buf.cancel(lane, estimate)
                    buf._put(lane, item, None, None, size)
                if size > self._largest:
                    self._largest = size
        except (StopIteration, BufferClosed):
            pass  # the lane's work is done, or the consumer closed us
        except BaseException as exc:
            what = self._describe(lane) if self._describe is not None else None
            add_note(
                exc,
                f"streambuf: raised in stage {self.name!r} on lane {lane} (thread "
                f"{threading.current_thread().name!r})" + (f" {what}" if what else ""),
            )
            buf.abort(exc)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # closing must not hide the real outcome
                    log.warning(
                        "streambuf: %s lane %d: error while closing: %r", self.name, lane, exc
                    )
            buf.finish(lane)

    def start(self) -> None:
        """Start the lane threads (at the latest when iteration begins). Idempotent."""
        if self._threads or self._closed:
            return
        for lane in range(self.lanes):
            th = threading.Thread(
                target=self._run, args=(lane,), name=f"streambuf-{self.name}-{lane}", daemon=True
            )
            self._threads.append(th)
            th.start()

    def __iter__(self) -> Iterator[T]:
        if self._started:
            raise RuntimeError(f"{self.name}: can be iterated only once")
        self._started = True
        self.start()
        try:
            yield from self._buf
        finally:
            self.close()

    def close(self) -> None:
        """Stop every lane and join the threads (bounded by ``join_timeout_s``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._buf.close()
        if self._on_close is not None:
            self._on_close()
        join_all(self._threads, timeout_s=self._join_timeout_s, stops_when=self._stops_when)

    def __enter__(self) -> LaneRunner[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> BufferStats:
        return self._buf.stats()
