"""Byte and batch credits shared between the main process and DataLoader workers.

The accounting lives in shared memory (``multiprocessing`` raw arrays): per worker, the
bytes and batches it has produced that the main process has not yet handed to the user.

* A worker **reserves** before it builds a batch (an estimate: the largest of its last
  few batches, or its whole slice for the first one), so the batch under construction
  is inside the budget too; once built, the reservation is adjusted to the true size.
* The main process **releases** a batch's credits when it hands the batch to the user.
* **Sharded** (``pooled=False``, for in-order delivery): worker ``w`` may hold at most its
  slice, ``max_bytes // num_workers`` and ``max_batches // num_workers`` (remainders to
  the first workers). In-order delivery waits for one particular worker; its credits
  cannot be held by batches queued behind it, so it cannot deadlock (docs/design.md 4).
* **Pooled** (``pooled=True``, only for as-ready delivery): one pool for all workers.
* A batch larger than the (slice of the) budget is admitted alone, when its worker holds
  nothing else (pooled: when nothing else is held at all), and counted in ``oversize``.
* A batch that turns out larger than its reservation gives the reservation back and
  **reserves again at its real size** (the rule above: it fits, or it is alone), and is
  counted in ``overshoot``: credits in flight never pass ``max_bytes`` (each worker's
  slice, when sharded) but for a batch held alone. Not counted: the one batch a worker
  has built while it waits there. Waiting with the smaller reservation still held
  deadlocks two pooled workers that both outgrew theirs; given back, it cannot. (Until
  2026-12-05 it was added on top of the worker's held batches: 10 MiB over seven
  others in a 1 MiB slice.)
* ``generation``: bumped by the main process when an iteration is abandoned; a worker
  waiting for credits of an older generation stops waiting (its batches are discarded).
* **A lock held by a dead process.** The accounting lock is a process-shared semaphore:
  a worker killed (SIGKILL, the OOM killer) or stopped while holding it never releases
  it. The main process therefore waits for it at most ``lock_timeout_s`` and then raises
  ``WorkerError``; such a budget is abandoned with its iteration (the Loader builds a new
  one). Workers wait for it without a limit: if the main process died holding it, the
  worker's parent watch ends the worker (``streambuf._worker``).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing.context import BaseContext
from typing import Any

from ._units import check_seconds, parse_bytes, parse_count
from .errors import WorkerError

__all__ = ["BudgetStats", "CreditBudget"]

# indices into the per-worker int64 array
_USED_B, _USED_N, _LIM_B, _LIM_N, _PEAK_B, _WAIT_US, _OVERSIZE, _OVERSHOOT, _PEAK_N = range(9)
_F = 9
# indices into the global array: generation, peak of reserved+held bytes, reserved+held
# bytes, limits, the bytes of finished batches not yet handed over (and their peak), and
# reserved+held batches (and their peak)
(
    _G_GEN,
    _G_PEAK_B,
    _G_USED_B,
    _G_MAX_B,
    _G_MAX_N,
    _G_HELD_B,
    _G_PEAK_HELD_B,
    _G_USED_N,
    _G_PEAK_N,
    _G_FIRST,
) = range(10)
_G = 10


@dataclass(frozen=True)
class BudgetStats:
    """Snapshot of the credits.

    Attributes:
        in_flight_bytes / in_flight_batches: credits taken now: batches produced and not
            yet handed to the user, plus reservations for batches under construction.
        peak_in_flight_bytes: the most credit bytes ever taken at once (all workers);
            this is what ``max_bytes`` bounds.
        peak_in_flight_batches: the most batches (reserved or finished) in flight at once;
            this is what ``max_batches`` bounds.
        peak_batch_bytes_held: the most bytes of *finished* batches waiting at once.
        max_bytes / max_batches: the budget now.
        per_worker_bytes / per_worker_peak_bytes / per_worker_limit_bytes: per worker.
        per_worker_batches / per_worker_peak_batches / per_worker_limit_batches: the same
            in batches (the slices of ``max_batches`` when sharded).
        worker_wait_s: seconds workers spent waiting for credits, total.
        oversize: batches admitted alone because they exceeded the (slice of the) budget.
        overshoot: batches larger than their reservation.
    """

    in_flight_bytes: int
    in_flight_batches: int
    peak_in_flight_bytes: int
    peak_in_flight_batches: int
    peak_batch_bytes_held: int
    max_bytes: int
    max_batches: int
    per_worker_bytes: tuple[int, ...]
    per_worker_peak_bytes: tuple[int, ...]
    per_worker_limit_bytes: tuple[int, ...]
    per_worker_batches: tuple[int, ...]
    per_worker_peak_batches: tuple[int, ...]
    per_worker_limit_batches: tuple[int, ...]
    worker_wait_s: float
    oversize: int
    overshoot: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class CreditBudget:
    """Shared byte/batch credits for ``num_workers`` producer processes.

    Create it in the main process before the workers start; it pickles into workers
    created by fork or spawn (shared memory is handed over at process creation).
    """

    def __init__(
        self,
        *,
        num_workers: int,
        max_bytes: int | str,
        max_batches: int,
        pooled: bool,
        ctx: BaseContext | None = None,
        lock_timeout_s: float = 10.0,
    ) -> None:
        self.num_workers = parse_count(num_workers, name="num_workers")
        self.pooled = pooled
        self.lock_timeout_s = check_seconds(lock_timeout_s, name="lock_timeout_s")
        ctx = ctx or multiprocessing.get_context()
        # A lock for the arrays and one "doorbell" semaphore per worker. Not a
        # multiprocessing.Condition: its notify() waits for every sleeper to wake, and
        # hangs forever when a sleeper has died (a killed worker, or interpreter exit).
        self._lock = ctx.Lock()
        self._bells = [ctx.Semaphore(0) for _ in range(self.num_workers)]
        self._w = ctx.RawArray("q", self.num_workers * _F)
        self._g = ctx.RawArray("q", _G)
        self.set_limits(max_bytes=max_bytes, max_batches=max_batches)

    @contextmanager
    def _main_lock(self) -> Iterator[None]:
        """The lock, for the main process: bounded wait (see the module docstring)."""
        if not self._lock.acquire(timeout=self.lock_timeout_s):
            raise WorkerError(
                f"the credit lock was not released within {self.lock_timeout_s} s: a "
                "DataLoader worker died or was stopped while holding it"
            )
        try:
            yield
        finally:
            self._lock.release()

    # -- limits -----------------------------------------------------------------------
    def set_limits(
        self, *, max_bytes: int | str | None = None, max_batches: int | None = None
    ) -> None:
        """Change the budget at run time (safe point: slices are recomputed under the lock;
        a shrink holds further reservations, it never takes back what is held)."""
        with self._main_lock():
            if max_bytes is not None:
                self._g[_G_MAX_B] = parse_bytes(max_bytes)
            if max_batches is not None:
                mb = parse_count(max_batches, name="max_batches")
                if not self.pooled and mb < self.num_workers:
                    raise ValueError(
                        f"max_batches={mb} must be >= num_workers={self.num_workers} with "
                        "in_order=True (each worker owns at least one batch of credit)"
                    )
                self._g[_G_MAX_N] = mb
            lb = _split(self._g[_G_MAX_B], self.num_workers)
            ln = _split(self._g[_G_MAX_N], self.num_workers)
            for w in range(self.num_workers):
                self._w[w * _F + _LIM_B] = max(1, lb[w])
                self._w[w * _F + _LIM_N] = max(1, ln[w])
            self._ring()

    @property
    def max_bytes(self) -> int:
        return int(self._g[_G_MAX_B])

    @property
    def max_batches(self) -> int:
        return int(self._g[_G_MAX_N])

    def slice_bytes(self, worker: int) -> int:
        """The bytes of ``worker``'s slice (when pooled: its fair share, a first estimate)."""
        return int(self._w[worker * _F + _LIM_B])

    # -- worker side ------------------------------------------------------------------
    @property
    def generation(self) -> int:
        return int(self._g[_G_GEN])

    def _fits(self, w: int, nbytes: int) -> bool:
        o = w * _F
        if self.pooled:
            used_b = self._g[_G_USED_B]
            used_n = self._g[_G_USED_N]
            if used_n == 0:
                return True
            return used_n < self._g[_G_MAX_N] and used_b + nbytes <= self._g[_G_MAX_B]
        if self._w[o + _USED_N] == 0:
            return True
        return (
            self._w[o + _USED_N] < self._w[o + _LIM_N]
            and self._w[o + _USED_B] + nbytes <= self._w[o + _LIM_B]
        )

    def reserve(
        self,
        worker: int,
        nbytes: int,
        *,
        generation: int,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
        first: bool = False,
    ) -> bool:
        """Block until ``worker`` may hold one more batch of ``nbytes``; take the credits.

        Returns False (nothing taken) if the main process moved to a newer generation, or
        when ``timeout_s`` passed without room (0: do not wait). ``poll_s`` only bounds
        how long a wait lasts between re-checks; wake-ups come from ``release`` through
        the worker's doorbell semaphore. ``first`` (a batch already built, reserved again
        at its real size): when pooled, no other worker reserves while it waits (one
        such waiter at a time), so the room it needs gathers as batches are released;
        else the others, reserving at their smaller estimates as each batch is released,
        could keep it waiting until their shares ended.
        """
        t0 = time.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        me = worker + 1
        try:
            while True:
                with self._lock:
                    if self._g[_G_GEN] != generation:
                        return False
                    if first and self.pooled and self._g[_G_FIRST] == 0:
                        self._g[_G_FIRST] = me
                    ahead = self.pooled and self._g[_G_FIRST] not in (0, me)
                    if not ahead and self._fits(worker, nbytes):
                        o = worker * _F
                        self._add(worker, nbytes, 1)
                        self._w[o + _WAIT_US] += int((time.monotonic() - t0) * 1e6)
                        return True
                wait = poll_s
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return False
                self._bells[worker].acquire(timeout=wait)
        finally:
            if first and self.pooled:
                with self._lock:
                    if self._g[_G_FIRST] == me:
                        self._g[_G_FIRST] = 0
                        self._ring()  # the others may reserve again

    def adjust(
        self,
        worker: int,
        delta_bytes: int,
        *,
        batch_bytes: int = 0,
        overshoot: bool = False,
        generation: int | None = None,
    ) -> None:
        """Correct a reservation by ``delta_bytes`` once the batch (``batch_bytes``) is built.

        A reservation of an older ``generation`` was already forgotten by
        ``new_generation``: correcting it would corrupt the new iteration's counts, so
        that is a no-op (a worker still building an abandoned batch)."""
        with self._lock:
            if generation is not None and self._g[_G_GEN] != generation:
                return
            self._add(worker, delta_bytes, 0)
            o = worker * _F
            if batch_bytes > (self._g[_G_MAX_B] if self.pooled else self._w[o + _LIM_B]):
                self._w[o + _OVERSIZE] += 1  # a batch larger than its slice: held alone
            self._g[_G_HELD_B] += batch_bytes
            if self._g[_G_HELD_B] > self._g[_G_PEAK_HELD_B]:
                self._g[_G_PEAK_HELD_B] = self._g[_G_HELD_B]
            if overshoot:
                self._w[worker * _F + _OVERSHOOT] += 1
            if delta_bytes < 0:
                self._ring(worker)

    def cancel(self, worker: int, nbytes: int, *, generation: int | None = None) -> None:
        """Give back a reservation that produced no batch (no-op for an older
        ``generation``, as in ``adjust``)."""
        with self._lock:
            if generation is not None and self._g[_G_GEN] != generation:
                return
            self._add(worker, -nbytes, -1)
            self._ring(worker)

    def _ring(self, worker: int | None = None) -> None:
        """Wake ``worker`` (pooled, or None: every worker) to re-check its credits."""
        if worker is None or self.pooled:
            for bell in self._bells:
                bell.release()
        else:
            self._bells[worker].release()

    def _add(self, worker: int, nbytes: int, nbatches: int) -> None:
        o = worker * _F
        self._w[o + _USED_B] += nbytes
        self._w[o + _USED_N] += nbatches
        self._g[_G_USED_B] += nbytes
        self._g[_G_USED_N] += nbatches
        if self._w[o + _USED_B] > self._w[o + _PEAK_B]:
            self._w[o + _PEAK_B] = self._w[o + _USED_B]
        if self._w[o + _USED_N] > self._w[o + _PEAK_N]:
            self._w[o + _PEAK_N] = self._w[o + _USED_N]
        if self._g[_G_USED_B] > self._g[_G_PEAK_B]:
            self._g[_G_PEAK_B] = self._g[_G_USED_B]
        if self._g[_G_USED_N] > self._g[_G_PEAK_N]:
            self._g[_G_PEAK_N] = self._g[_G_USED_N]

    # -- main side --------------------------------------------------------------------
    def release(self, worker: int, nbytes: int) -> None:
        """The main process handed a batch of ``nbytes`` from ``worker`` to the user."""
        with self._main_lock():
            self._add(worker, -nbytes, -1)
            self._g[_G_HELD_B] -= nbytes
            self._ring(worker)

    def held_bytes(self) -> int:
        """Bytes of finished batches waiting to be handed over (a lock-free read: a
        consumer that finds 0 here found the buffer empty, the tuner's signal)."""
        return int(self._g[_G_HELD_B])

    def new_generation(self) -> int:
        """Forget everything in flight (an iteration was abandoned) and wake all waiters."""
        with self._main_lock():
            self._g[_G_GEN] += 1
            for w in range(self.num_workers):
                self._w[w * _F + _USED_B] = 0
                self._w[w * _F + _USED_N] = 0
            self._g[_G_USED_B] = 0
            self._g[_G_USED_N] = 0
            self._g[_G_HELD_B] = 0
            self._g[_G_FIRST] = 0
            self._ring()
            return int(self._g[_G_GEN])

    def stats(self) -> BudgetStats:
        with self._main_lock():
            rows = [list(self._w[w * _F : (w + 1) * _F]) for w in range(self.num_workers)]
            return BudgetStats(
                in_flight_bytes=int(self._g[_G_USED_B]),
                in_flight_batches=int(self._g[_G_USED_N]),
                peak_in_flight_bytes=int(self._g[_G_PEAK_B]),
                peak_in_flight_batches=int(self._g[_G_PEAK_N]),
                peak_batch_bytes_held=int(self._g[_G_PEAK_HELD_B]),
                max_bytes=int(self._g[_G_MAX_B]),
                max_batches=int(self._g[_G_MAX_N]),
                per_worker_bytes=tuple(r[_USED_B] for r in rows),
                per_worker_peak_bytes=tuple(r[_PEAK_B] for r in rows),
                per_worker_limit_bytes=tuple(r[_LIM_B] for r in rows),
                per_worker_batches=tuple(r[_USED_N] for r in rows),
                per_worker_peak_batches=tuple(r[_PEAK_N] for r in rows),
                per_worker_limit_batches=tuple(r[_LIM_N] for r in rows),
                worker_wait_s=sum(r[_WAIT_US] for r in rows) / 1e6,
                oversize=sum(r[_OVERSIZE] for r in rows),
                overshoot=sum(r[_OVERSHOOT] for r in rows),
            )
