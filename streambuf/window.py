"""``Window``: the one bounded hand-over between a runner's lanes and its consumer.

Every concurrent stage runs ``LaneRunner`` (``streambuf._lanes``) into a window (the
``LaneWindow`` protocol below): threaded maps (``ThreadPrefetcher``), the
``torchdata.nodes`` nodes, the shard lanes of ``shards()`` and the video lanes of
``video.clips()``, each into a ``Window`` (one pool). Lane ``t`` (one thread) repeats::

    window.reserve(t, estimate)   # room for the next item, before it is made
    item = make()                 # on failure: window.release(t)
    window.commit(t, item, size, seq=...)
    ...
    window.finish(t)              # no more items from lane t

and one consumer calls ``get()``. Orders:

* ``"sequence"``: items leave by ``seq`` (0, 1, 2, ...), given at ``commit``. The
  producers share one source and take sequence numbers *after* they reserve, in the
  order they pull (``ThreadPrefetcher``, ``ParallelMapper``).
* ``"round_robin"``: lane ``start_lane``, then the next, ..., skipping lanes that are
  finished and drained; each lane's items in the order it made them. Deterministic
  whatever the timing (shard and video lanes).
* ``"first_ready"``: the order items were admitted (no head-of-line blocking).

Bounds (docs/design.md invariants 1, 2, 4), one pool for every order: what the window
*counts* -- reservations (items being made) plus admitted results -- is at most
``max_items`` items and ``max_bytes`` bytes, except that one reservation or result
larger than ``max_bytes`` is admitted alone into an empty window (counted in
``oversize``). What the count cannot see, each at most one per lane and each in its own
thread: a result larger than its reservation waiting for room at its real size, and, in
round robin only, the reservation of the lane the consumer is waiting on when the window
is full of other lanes' items (``stats().outside``).

Deadlock freedom with one pool: producers waiting for room are served first come, first
served; a waiting result that is the next to deliver is taken by ``get`` straight from
its thread (the hand-off); in sequence order the head is always reserved first (its
number is taken after its reservation). In round robin a lane runs ahead only as far as
it leaves room (one item of its size each) for the items delivered before its next one
that are not reserved yet, and the lane delivered soonest goes before other waiters, so
the next item normally finds room inside the count; when it cannot (sizes grew since
room was left), a lane the consumer waits on reserves outside the count. So the next
item to deliver is always admitted, being made, or handed over.

**Chunks** (``LaneRunner(chunk=)``; not in sequence order): ``reserve(t, estimate,
count)`` takes room for up to ``count`` items at once (as many as fit beside the room
owed to the items delivered before the last of them: the rule above, for its last item),
``commit_many`` turns them into the items made (each counted at its own size, what was
not used given back; only the last may be larger than its room and wait as ``commit``
does) and ``get_many`` takes the head and whatever follows it ready, lending the ones
after the first (still counted until the consumer's next get). One lock acquisition and
at most one wake-up per run of items instead of per item; the bounds, the order and the
deadlock rules are the ones above, item by item.

Ownership: an item belongs to the window from ``commit`` until ``get`` returns it (or,
lent by ``get_many``, until the consumer's next get). Each lane has at most one
reservation at a time (one thread per lane), of one item or a chunk.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, Literal, Protocol, TypeVar

from ._units import MAX_BYTES, check_int, parse_bytes, parse_count
from .errors import BufferClosed
from .stats import BufferStats

__all__ = ["LaneWindow", "Window", "WindowOrder"]

T = TypeVar("T")
WindowOrder = Literal["sequence", "round_robin", "first_ready"]
_ORDERS = ("sequence", "round_robin", "first_ready")
_ENDED = object()
# A consumer that waited this long on a lane holding a chunk (``hold``) takes what the
# lane made of it, and looks again this often (the lane appends without the lock: nothing
# wakes the consumer for it). A lane's own flush (``FLUSH_S`` after its chunk began, or a
# full chunk) comes first where its reads do not stall: no extra hand-off then.
HOLD_POLL_S = 0.01


class LaneWindow(Protocol[T]):
    """What a runner fills and a consumer drains: ``Window`` (one pool; every stage), or
    ``streambuf.buffer.ShardedBuffer`` (a slice of the bounds per lane; for users)."""

    @property
    def order(self) -> WindowOrder: ...

    def share(self, lane: int) -> int: ...
    def reserve(self, lane: int, nbytes: int) -> object: ...  # (Window: how many)
    def commit(self, lane: int, item: T, size: int, *, seq: int | None = None) -> None: ...
    def release(self, lane: int) -> None: ...
    def finish(self, lane: int) -> None: ...
    def get(self) -> T: ...
    def __iter__(self) -> Iterator[T]: ...
    def abort(self, exc: BaseException) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> BufferStats: ...


class _Slot:
    __slots__ = ("admitted", "item", "size", "taken", "token")

    def __init__(self, item: Any, size: int) -> None:
        self.item, self.size = item, size
        self.admitted = False  # counted in the window (else: waiting in its thread)
        self.taken = False  # handed over by get() before it was admitted
        self.token: threading.Condition | None = None  # its thread waits on this


class Window(Generic[T]):
    """See the module docstring.

    Args:
        lanes: producer lanes (one thread each).
        max_items, max_bytes: the pool's bounds (reservations + admitted results).
        order: ``"sequence"``, ``"round_robin"`` or ``"first_ready"``.
        start_lane: round robin only: the lane delivered first (a resumed stream).
    """

    def __init__(
        self,
        *,
        lanes: int,
        max_items: int,
        max_bytes: int | str,
        order: WindowOrder,
        start_lane: int = 0,
    ) -> None:
        if order not in _ORDERS:
            raise ValueError(f"order={order!r} must be one of {', '.join(map(repr, _ORDERS))}")
        self.order: WindowOrder = order
        self.lanes = parse_count(lanes, name="lanes")
        self.max_items = parse_count(max_items, name="max_items")
        self.max_bytes = parse_bytes(max_bytes)
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # the consumer waits here
        self._waiters: deque[threading.Condition] = deque()  # for room, first come first
        self._held = 0  # counted reservations + admitted results
        self._reserved = 0  # counted reservations
        self._bytes = 0  # their bytes
        self._res: dict[int, tuple[int, bool, int]] = {}  # lane -> (bytes each, counted, n)
        # lane -> [items, sizes, taken]: what its thread is making in a chunk (appended
        # without the lock, sizes first) and how many get() committed already (``hold``)
        self._holds: dict[int, list[Any]] = {}
        self._res_waiting: dict[int, threading.Condition] = {}  # lane -> its reserve wait
        self._need: dict[threading.Condition, tuple[int, int]] = {}  # waiter -> bytes, lane
        self._results: dict[Any, _Slot] = {}
        self._running = self.lanes  # lanes not finished
        self._done = [False] * self.lanes
        # sequence: the number delivered next; round robin: per lane, made and taken
        self._next = 0
        self._made = [0] * self.lanes
        self._taken = [0] * self.lanes
        self._rotation = list(range(self.lanes))
        self._cursor = start_lane % self.lanes
        self._start = self._cursor
        self._awaited: tuple[int, int] | None = None  # round robin: the key get() waits on
        self._get_waiting = False  # get() is blocked
        self._arrivals: deque[int] = deque()  # first ready: admitted keys, in order
        self._arrival_keys = 0
        self._lent_items = self._lent_bytes = 0  # taken by get_many, counted till the next
        self._closed = False
        self._error: BaseException | None = None
        self._peak_items = self._peak_bytes = self._oversize = self._outside = 0
        self._puts = self._gets = self._empty_gets = 0
        self._put_wait_s = self._get_wait_s = 0.0
        self._observer: Callable[[Window[Any]], None] | None = None  # tests only

    # -- producers ----------------------------------------------------------------------
    def share(self, lane: int) -> int:
        """A lane's even share of the byte bound: its first estimate, before any item."""
        return max(1, self.max_bytes // self.lanes)

    def _fits(self, nbytes: int) -> bool:
        return self._held == 0 or (
            self._held < self.max_items and self._bytes + nbytes <= self.max_bytes
        )

    def _count(self, nbytes: int, n: int = 1) -> None:
        self._held += n
        self._bytes += nbytes * n
        if self._bytes > self._peak_bytes:
            self._peak_bytes = self._bytes
        if nbytes > self.max_bytes:
            self._oversize += 1
        if self._observer is not None:
            self._observer(self)

    def _wake_first(self) -> None:
        """Room changed: wake the first waiter, and in round robin the waiting lane
        delivered soonest (it goes before the others)."""
        if self._waiters:  # only a waiter that may go on is woken (no futile wake-ups)
            token = self._waiters[0]
            if self._may_go(token, True):
                token.notify()
            if self._res_waiting:
                soonest = self._res_waiting[min(self._res_waiting, key=self._next_key)]
                if soonest is not token and self._may_go(soonest, False):
                    soonest.notify()

    def _may_go(self, token: threading.Condition, first: bool) -> bool:
        nbytes, lane = self._need[token]
        return self._admits(lane, nbytes, first) if lane >= 0 else first and self._fits(nbytes)

    def _next_key(self, lane: int) -> tuple[int, int]:
        """Round robin: where lane ``lane``'s next item stands in the delivery order."""
        return self._made[lane], (lane - self._start) % self.lanes

    def _ahead(self, lane: int, n: int = 1) -> int:
        """Round robin: the items delivered before ``lane``'s ``n``-th next one that no
        lane has reserved room for yet (``lane`` must leave them room)."""
        k, r = self._next_key(lane)
        k += n - 1
        owed = 0
        for m in range(self.lanes):
            if m == lane or self._done[m]:
                continue
            got = self._res.get(m)
            start = self._made[m] + (got[2] if got is not None else 0)  # m's first unreserved
            last = k if (m - self._start) % self.lanes < r else k - 1  # m's last before
            if last >= start:
                owed += last - start + 1
        return owed

    def _more(self, lane: int, nbytes: int, count: int) -> int:
        """How many items (1 to ``count``) ``lane`` may reserve at once, its first one
        admitted: as many as fit with the room the others are owed (round robin: the
        items delivered before its last one), so a chunk never takes the room of an item
        delivered sooner."""
        lo, hi = 1, count  # n = lo fits; the most that fit, by bisection (it is monotone)
        while lo < hi:
            n = (lo + hi + 1) // 2
            extra = self._ahead(lane, n) if self.order == "round_robin" else 0
            if (
                self._held + n + extra <= self.max_items
                and self._bytes + nbytes * (n + extra) <= self.max_bytes
            ):
                lo = n
            else:
                hi = n - 1
        return lo

    def _admits(self, lane: int, nbytes: int, first: bool) -> bool:
        """May ``lane`` reserve ``nbytes`` now (``first``: no waiter is ahead of it)?
        In round robin, waiting lanes go in delivery order (not first come), and a lane
        leaves room for one item of its size for each item delivered before its next one
        that is not reserved yet: the next item to deliver always finds room, unless
        sizes grew since (then the consumer's wait lets it reserve outside)."""
        if self.order != "round_robin":
            return first and self._fits(nbytes)
        mine = self._next_key(lane)
        if any(self._next_key(m) < mine for m in self._res_waiting if m != lane):
            return False  # a lane delivered sooner waits: it goes first
        extra = self._ahead(lane)
        return self._held == 0 or (
            self._held + 1 + extra <= self.max_items
            and self._bytes + nbytes * (1 + extra) <= self.max_bytes
        )

    def _wait_for_room(self, nbytes: int, *, slot: _Slot | None = None, lane: int = -1) -> bool:
        """Until ``nbytes`` fits and this waiter is first: True. False: ``slot`` was
        taken by ``get`` (hand-off), or the awaited ``lane`` may reserve outside."""
        token = threading.Condition(self._lock)
        if slot is not None:
            slot.token = token
        elif lane >= 0:
            self._res_waiting[lane] = token
        self._waiters.append(token)
        self._need[token] = (nbytes, lane if slot is None else -1)
        t0 = time.monotonic()
        try:
            while True:
                if self._closed:
                    raise BufferClosed("window closed while waiting for room")
                if slot is not None and slot.taken:
                    return False
                first = self._waiters[0] is token
                if (
                    self._admits(lane, nbytes, first)
                    if slot is None
                    else first and self._fits(nbytes)
                ):
                    return True
                if lane >= 0 and self._awaited == (lane, self._made[lane]):
                    return False  # no room, and the consumer waits for this very item
                token.wait()
        finally:
            self._waiters.remove(token)
            del self._need[token]
            if slot is None and lane >= 0:
                self._res_waiting.pop(lane, None)
            self._wake_first()
            self._put_wait_s += time.monotonic() - t0

    def _check_lane(self, lane: int) -> None:
        if not 0 <= lane < self.lanes:
            raise IndexError(f"lane={lane} out of range for lanes={self.lanes}")

    def reserve(self, lane: int, nbytes: int, count: int = 1) -> int:
        """Take room for lane ``lane``'s next item (about ``nbytes``) before making it;
        with ``count > 1``, for up to ``count`` items of ``nbytes`` each (a chunk: see
        ``commit_many``), as many as fit now with the room owed to others (at least one:
        only room for one is waited for). Returns how many were reserved.

        Raises:
            BufferClosed: the window is (or gets) closed.
            TypeError, ValueError: ``nbytes`` is not an int >= 0.
        """
        self._check_lane(lane)
        if type(nbytes) is not int or nbytes < 0:  # (a negative size would free room)
            check_int(nbytes, name="nbytes", maximum=MAX_BYTES)
        with self._lock:
            if self._closed:
                raise BufferClosed("reserve() on a closed window")
            if lane in self._res:
                raise RuntimeError(f"lane {lane} reserved twice without commit or release")
            counted = True
            n = 1
            if not self._admits(lane, nbytes, not self._waiters):
                rr = self.order == "round_robin"
                counted = self._wait_for_room(nbytes, lane=lane if rr else -1)
            if counted and count > 1:
                n = self._more(lane, nbytes, count)
            self._res[lane] = (nbytes, counted, n)
            if counted:
                self._reserved += n
                self._count(nbytes, n)
            else:
                self._outside += 1
            if self._waiters:
                self._wake_first()  # the others need no room kept for this lane now
            return n

    def hold(self, lane: int, items: list[Any], sizes: list[int]) -> None:
        """Lane ``lane`` makes the items of its chunk (its current ``reserve``) into
        ``items`` (each size appended to ``sizes`` before its item, by the lane's thread,
        without the lock). A consumer that waited ``HOLD_POLL_S`` for the first of them
        does not wait for the lane's ``commit_many``: it commits the ones made so far
        itself (``_take_held``), so a lane whose next read stalls holds nothing back for
        longer than that; ``commit_many`` then commits the rest. Ownership: the lists
        are the lane's; the window only reads them, until ``commit_many``/``release``."""
        with self._lock:
            if lane in self._res:
                self._holds[lane] = [items, sizes, 0]
                if self._get_waiting:  # a consumer asleep with no timeout: poll from now
                    self._arrived.notify()

    def _take_held(self, lane: int) -> bool:
        """Commit what lane ``lane`` made of its chunk and nobody committed yet, up to
        the first item larger than its room (lock held). True when any was committed."""
        held = self._holds.get(lane)
        got = self._res.get(lane)
        if held is None or got is None or not got[1]:
            return False  # (reserved outside the count: its items wait for room: the lane's)
        items, sizes, done = held
        nbytes = got[0]
        start = done
        made = len(items)  # (each item's size was appended before it; made <= units)
        while done < made and sizes[done] <= nbytes:
            self._commit(lane, items[done], sizes[done], None)  # (fits: never waits)
            done += 1
        held[2] = done
        return done > start

    def _take_any_held(self) -> bool:
        return any([self._take_held(lane) for lane in list(self._holds)])

    def release(self, lane: int) -> None:
        """Give back what is left of lane ``lane``'s reservation: it made no more items."""
        with self._lock:
            self._release(lane)

    def _release(self, lane: int) -> None:
        self._holds.pop(lane, None)
        got = self._res.pop(lane, None)
        if got is None or self._closed:
            return  # close()/abort() forgot every reservation
        self._give_back(*got)

    def _give_back(self, nbytes: int, counted: bool, k: int) -> None:
        """``k`` unused units of a reservation (``nbytes`` each) given back (lock held)."""
        if counted:
            self._held -= k
            self._reserved -= k
            self._bytes -= nbytes * k
            self._wake_first()

    def _key(self, lane: int, seq: int | None) -> Any:
        if self.order == "sequence":
            if seq is None or seq < self._next or seq in self._results:
                raise RuntimeError(
                    f"lane {lane} committed seq={seq!r}, which is not a new number "
                    f"(delivered up to {self._next}): the producers' numbering is broken"
                )
            return seq
        if self.order == "round_robin":
            key = (lane, self._made[lane])
            self._made[lane] += 1
            return key
        self._arrival_keys += 1
        return self._arrival_keys

    def commit(self, lane: int, item: T, size: int, *, seq: int | None = None) -> None:
        """Lane ``lane``'s item (``size`` bytes) replaces its reservation; if it is larger
        (or was reserved outside the count), it waits for room at its real size, or for
        ``get`` to take it straight from this thread when it is the next to deliver.

        Raises:
            BufferClosed: the window is (or gets) closed.
        """
        with self._lock:
            if self._closed:
                raise BufferClosed("commit() on a closed window")
            self._commit(lane, item, size, seq)

    def commit_many(self, lane: int, items: list[T], sizes: list[int]) -> None:
        """A chunk: lane ``lane``'s next ``len(items)`` items (``sizes`` bytes each), made
        under one ``reserve(lane, nbytes, count)``, committed under one lock acquisition;
        what is left of the reservation is given back (before the last item, which alone
        may be larger than ``nbytes`` and then waits for room as ``commit`` does: at most
        one item per lane outside the count). Not in sequence order (numbered items are
        committed one by one).

        Raises:
            BufferClosed: the window is (or gets) closed.
        """
        with self._lock:
            if self._closed:
                raise BufferClosed("commit_many() on a closed window")
            held = self._holds.pop(lane, None)
            if held is not None:
                early = held[2]
                if early:  # committed by a waiting consumer (``hold``): the rest only
                    items, sizes = items[early:], sizes[early:]
                    if not items:
                        self._release(lane)
                        return
            got = self._res.get(lane)
            m = len(items)
            if got is None or not 0 < m <= got[2] or len(sizes) != m:
                raise RuntimeError(
                    f"lane {lane} committed {m} items, {len(sizes)} sizes, on a reservation "
                    f"of {got[2] if got else 0}"
                )
            if self.order == "sequence":
                raise RuntimeError("a sequence window takes numbered items one by one: commit()")
            nbytes, counted, n = got
            if any(size > nbytes for size in sizes[:-1]):
                raise RuntimeError(
                    f"lane {lane}: only the last item of a chunk may be larger than its "
                    f"reservation ({nbytes} B): end a chunk at an item that outgrew it"
                )
            for i in range(m - 1):
                self._commit(lane, items[i], sizes[i], None)
            if n > m:  # what the chunk did not use, given back before the last item
                self._res[lane] = (nbytes, counted, 1)
                self._give_back(nbytes, counted, n - m)
            self._commit(lane, items[-1], sizes[-1], None)

    def _commit(self, lane: int, item: T, size: int, seq: int | None) -> None:
        """``commit`` under the lock: the item takes one unit of the lane's reservation."""
        got = self._res.get(lane)
        if got is None:
            raise RuntimeError(f"lane {lane} committed without a reservation")
        nbytes, counted, n = got
        if n > 1:
            self._res[lane] = (nbytes, counted, n - 1)
        else:
            del self._res[lane]
        if counted:
            self._held -= 1
            self._reserved -= 1
            self._bytes -= nbytes
        key = self._key(lane, seq)
        slot = _Slot(item, size)
        self._puts += 1
        if (size > nbytes or not counted) and (self._waiters or not self._fits(size)):
            if self.order != "first_ready":
                self._results[key] = slot  # visible to get(): the hand-off
                self._wake_consumer(key)
            if counted:
                self._wake_first()  # its room may be what the first waiter needs
            if not self._wait_for_room(size, slot=slot):
                return  # taken by get()
        slot.admitted = True
        self._results[key] = slot
        if self.order == "first_ready":
            self._arrivals.append(key)
        self._count(size)
        items = self._held - self._reserved
        if items > self._peak_items:
            self._peak_items = items
        if self._waiters and (size < nbytes or not counted):
            self._wake_first()  # a smaller result left room
        self._wake_consumer(key)

    def _wake_consumer(self, key: Any) -> None:
        """Wake ``get`` if it waits for this item (any item, in first-ready order)."""
        if self._get_waiting and (
            self.order == "first_ready"
            or key == (self._next if self.order == "sequence" else self._awaited)
        ):
            self._arrived.notify()

    def finish(self, lane: int) -> None:
        """Lane ``lane`` is done: no more items from it. Idempotent."""
        with self._lock:
            if not self._done[lane]:
                self._done[lane] = True
                self._running -= 1
            self._arrived.notify()
            self._wake_first()  # the others need no room kept for this lane now

    # -- consumer -----------------------------------------------------------------------
    def _head(self) -> Any:
        """The key delivered next, None (not known yet) or ``_ENDED``. Holds the lock."""
        if self.order == "sequence":
            if self._next in self._results or self._running:
                return self._next
            return _ENDED
        if self.order == "first_ready":
            if self._arrivals:
                return self._arrivals[0]
            return None if self._running else _ENDED
        rot = self._rotation
        while rot:
            if self._cursor >= len(rot):
                self._cursor = 0
            lane = rot[self._cursor]
            key = (lane, self._taken[lane])
            if key in self._results or not self._done[lane]:
                return key
            del rot[self._cursor]  # finished and drained: skip it from now on
        return _ENDED

    def get(self) -> T:
        """The next item in this window's order.

        Raises:
            BufferClosed: every lane finished and everything was delivered, or closed.
            the error given to ``abort``.
        """
        return self._next_items(1)[0]

    def get_many(self, most: int) -> list[T]:
        """The next item in this window's order (waiting for it as ``get`` does), then
        the ones after it that are ready now, up to ``most`` in all, under one lock
        acquisition. The items after the first are *lent*: still counted (items and
        bytes) until the next ``get``/``get_many``, when the consumer has passed them on,
        so the bound holds for what the consumer holds too.

        Raises: as ``get``; ``ValueError`` where ``most`` is not an int >= 1.
        """
        if type(most) is not int or most < 1:
            raise ValueError(f"get_many(most={most!r}): most must be an int >= 1")
        return self._next_items(most)

    def _next_items(self, most: int) -> list[T]:
        """``get_many``'s work (``most`` checked)."""
        with self._lock:
            if self._lent_items:
                self._held -= self._lent_items
                self._bytes -= self._lent_bytes
                self._lent_items = self._lent_bytes = 0
                if self._observer is not None:
                    self._observer(self)
                self._wake_first()
            t0 = None
            try:
                while True:
                    if self._error is not None:
                        raise self._error
                    if self._closed:
                        raise BufferClosed("window closed")
                    key = self._head()
                    if key is _ENDED:
                        raise BufferClosed("window drained")
                    slot = self._results.get(key)  # (None: none, or not made yet)
                    # admitted, or waiting outside the count in its thread: hand it over
                    if slot is not None and (slot.admitted or slot.token is not None):
                        break
                    if t0 is None:
                        t0 = time.monotonic()
                        self._empty_gets += 1
                    if self.order == "round_robin":
                        self._awaited = key
                        token = self._res_waiting.get(key[0])
                        if token is not None:
                            token.notify()  # it may reserve outside the count now
                    if self._holds:  # a lane holds a chunk: after HOLD_POLL_S, take
                        # what it made of it (it may be stalled in its next read)
                        if time.monotonic() - t0 >= HOLD_POLL_S:
                            rr = self.order == "round_robin"
                            if self._take_held(key[0]) if rr else self._take_any_held():
                                continue
                        self._get_waiting = True
                        self._arrived.wait(HOLD_POLL_S)  # (it appends without the lock)
                        continue
                    self._get_waiting = True
                    self._arrived.wait()
            finally:
                self._awaited = None
                self._get_waiting = False
                if t0 is not None:
                    self._get_wait_s += time.monotonic() - t0
            out = [self._take(key, slot, False)]
            while len(out) < most:
                key = self._head()
                slot = self._results.get(key)  # (None for None and _ENDED too)
                if slot is None or not (slot.admitted or slot.token is not None):
                    break
                out.append(self._take(key, slot, True))
            return out

    def _take(self, key: Any, slot: _Slot, lend: bool) -> T:
        """Remove the head ``key`` (its ``slot``) for the consumer (under the lock)."""
        del self._results[key]
        if self.order == "sequence":
            self._next += 1
        elif self.order == "round_robin":
            self._taken[key[0]] += 1
            self._cursor += 1
        else:
            self._arrivals.popleft()
        self._gets += 1
        if slot.admitted:
            if lend:  # counted until the consumer's next get
                self._lent_items += 1
                self._lent_bytes += slot.size
                return slot.item
            self._held -= 1
            self._bytes -= slot.size
            if self._observer is not None:
                self._observer(self)
            self._wake_first()
        else:  # waiting outside the count: handed over, its thread goes on
            slot.taken = True
            assert slot.token is not None
            slot.token.notify()
            self._wake_first()  # the head moved on
        return slot.item

    def __iter__(self) -> Iterator[T]:
        """Items until every lane finished and all was delivered (or closed)."""
        while True:
            try:
                yield self.get()
            except BufferClosed:
                return

    # -- lifecycle ----------------------------------------------------------------------
    def abort(self, exc: BaseException) -> None:
        """Drop everything held, wake everyone; ``get`` raises ``exc`` from now on (the
        first error wins)."""
        with self._lock:
            if self._error is None:
                self._error = exc
            self._drop()

    def close(self) -> None:
        """Drop everything held, wake everyone; ``get`` ends. Idempotent."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        self._closed = True
        self._results.clear()
        self._arrivals.clear()
        self._res.clear()
        self._holds.clear()
        self._held = self._reserved = self._bytes = 0
        self._lent_items = self._lent_bytes = 0
        for token in self._waiters:
            token.notify()
        self._arrived.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def held(self) -> tuple[int, int]:
        """(items, bytes) held: made and being made (reservations), cheaply (a stage
        meter reads it often)."""
        with self._lock:
            return self._held, self._bytes

    def stats(self) -> BufferStats:
        """``items``: admitted results (lent ones included, see ``get_many``); ``bytes``:
        theirs plus counted reservations;
        ``outside``: reservations granted outside the count (round robin's awaited lane)."""
        with self._lock:
            return BufferStats(
                items=self._held - self._reserved,
                bytes=self._bytes,
                max_items=self.max_items,
                max_bytes=self.max_bytes,
                peak_items=self._peak_items,
                peak_bytes=self._peak_bytes,
                oversize=self._oversize,
                puts=self._puts,
                gets=self._gets,
                put_wait_s=self._put_wait_s,
                get_wait_s=self._get_wait_s,
                empty_gets=self._empty_gets,
                outside=self._outside,
            )
