"""The main process's watch over a DataLoader's workers: ``Supervisor``.

``WorkerError`` means exactly one thing: a worker died, or stopped answering for
``timeout_s``. It is decided from the workers' state (process alive? exit code? did its
end of stream arrive? how long the loop has waited?), never from the text of an
exception, so an error raised by the user's own code (which travels as a
``streambuf._transport.Failure``) is never mistaken for it. How:

* **One supervised wait.** Every wait of the DataLoader iterator for its workers (the
  next batch, and a persistent iterator's reset at the start of an epoch) goes through
  ``Supervisor._get``, installed in place of the iterator's ``_get_data``: it waits in
  slices of ``poll_s`` and after each slice looks at the processes. The DataLoader runs
  with no timeout of its own, so no wait "times out" inside torch (a reset that timed out
  there left the iterator unusable: ``KeyError: _ResumeIteration``).
* **Dead, finished, stuck.** A worker is *finished* once the DataLoader received its end
  of stream (``_workers_status`` false); a non-persistent one then exits with code 0,
  which is not a death however long the other workers take. A worker is *dead* when it
  exited before its end of stream arrived (code 0 included: ``sys.exit`` in a stage) or
  with a non-zero code or a signal -> ``WorkerError`` naming it, its pid and how it ended
  (within ``poll_s``). ``timeout_s`` exceeded -> ``WorkerError`` naming the workers the
  loop waits for.
* **On a clock, batches flowing or not.** The processes are looked at after each empty
  slice and, every ``CHECK_S`` of wall time, as messages arrive and batches are handed
  out: as ready (``in_order=False``) the other workers' batches keep every slice full, so
  a check made only when a slice comes back empty saw a death only once the survivors'
  shares were done (seconds to minutes later). The check costs a clock read per message;
  the processes' exit codes are read at most every ``CHECK_S``.
* **Polling, not signals.** torch raises a worker's death from its SIGCHLD handler,
  i.e. in the main thread *wherever it happens to be*, user code included, as a plain
  ``RuntimeError``. The supervisor takes its workers off that watch.
* **Stopped worker.** A batch already queued by a worker that then stopped (SIGSTOP, a
  frozen cgroup) is unpickled by fetching its shared-memory descriptor *from that
  worker*: a wait no slice bounds. While the loop waits, a watch thread checks the clock
  and, ``grace_s`` past ``timeout_s``, kills the workers, which ends that wait; the loop
  raises ``WorkerError``.
* After a ``WorkerError`` the Loader kills the remaining workers before shutting the
  DataLoader down, so the error reaches the loop at once instead of after torch's
  per-worker shutdown waits (5 s each).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import WorkerError

__all__ = ["POLL_S", "Supervisor", "kill_workers"]

log = logging.getLogger("streambuf")

POLL_S = 1.0
CHECK_S = 0.5  # the most wall time between two looks at the processes while batches flow


def _ended(w: Any, active: bool) -> str:
    code = w.exitcode
    if code is None:
        return "is alive"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 0 and active:
        return "exited with code 0 before its end of stream (sys.exit in a stage?)"
    return f"exited with code {code}"


def _unwatch(dl_iter: Any) -> None:
    """Take a DataLoader iterator's workers off torch's SIGCHLD watch."""
    if getattr(dl_iter, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(dl_iter))
        dl_iter._worker_pids_set = False


def kill_workers(dl_iter: Any) -> None:
    """SIGKILL every live worker of a DataLoader iterator (a stopped one included) and
    reap it."""
    _unwatch(dl_iter)
    workers = list(getattr(dl_iter, "_workers", []))
    for w in workers:
        if w.is_alive():
            try:
                os.kill(w.pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
    for w in workers:
        w.join(5.0)


class Supervisor:
    """Supervises one DataLoader iterator's waits (see the module docstring).

    Built on the iterator (a persistent one: before ``iter(loader)`` resets it), it
    replaces the iterator's ``_get_data``; ``stop()`` puts it back. Wrap every call that
    waits for workers in ``waiting()`` (``next`` does).
    """

    def __init__(
        self,
        dl_iter: Any,
        *,
        timeout_s: float | None,
        poll_s: float = POLL_S,
        grace_s: float = 0.5,
        check_s: float = CHECK_S,
    ) -> None:
        self.dl_iter = dl_iter
        self.workers = list(getattr(dl_iter, "_workers", []))
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.check_s = min(check_s, poll_s)
        self._next_check = time.monotonic() + self.check_s
        self.silenced = False  # the watch killed the workers for not answering
        _unwatch(dl_iter)
        self._since: float | None = None
        self._done = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if hasattr(dl_iter, "_try_get_data"):
            dl_iter._get_data = self._get  # an instance attribute: shadows the method
        if timeout_s is not None:
            self._thread = threading.Thread(
                target=self._watch, name="streambuf-loader-watch", daemon=True
            )
            self._thread.start()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The loop waits for the workers inside this block (the clock of ``timeout_s``)."""
        with self._cond:
            self._since = time.monotonic()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._since = None

    def next(self, it: Iterator[Any]) -> Any:
        """The next item of ``it`` (the DataLoader iterator); StopIteration at its end.

        Raises:
            WorkerError: a worker died, or nothing arrived within ``timeout_s``.
        """
        t0 = time.monotonic()
        with self.waiting():
            try:
                item = next(it)
            except (StopIteration, WorkerError):
                raise
            except Exception as exc:  # e.g. unpickling a batch from a worker just killed
                active = list(getattr(self.dl_iter, "_workers_status", []))
                cause = self._cause_of(exc, t0=t0, active=active)
                if cause is exc:
                    raise
                raise cause from exc
        self._on_clock()  # (a batch torch had stored is handed out with no wait at all)
        return item

    def _on_clock(self, active: list[bool] | None = None) -> None:
        """Look at the processes when ``check_s`` has passed since the last look, and
        raise the death found. ``active`` as for ``_failure`` (None: the workers whose end
        of stream has not arrived by now)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.check_s
        if active is None:
            active = list(getattr(self.dl_iter, "_workers_status", []))
        err = self._failure(waited_s=0.0, active=active)
        if err is not None:
            raise err

    def _get(self) -> Any:
        """The iterator's ``_get_data``: one message from the workers, supervised."""
        it = self.dl_iter
        t0 = self._since if self._since is not None else time.monotonic()
        while True:
            active = list(it._workers_status)  # before torch may mark a death itself
            try:
                ok, data = it._try_get_data(self.poll_s)
            except Exception as exc:  # torch saw a worker gone; a reset connection ...
                cause = self._cause_of(exc, t0=t0, active=active)
                if cause is exc:
                    raise
                raise cause from exc
            if ok:  # batches flowing (from the other workers, maybe): on the clock
                self._on_clock(active)
                return data
            if it._pin_memory and not it._pin_memory_thread.is_alive():
                raise RuntimeError("the DataLoader's pin-memory thread exited unexpectedly")
            self._next_check = time.monotonic() + self.check_s
            err = self._failure(waited_s=time.monotonic() - t0, active=active)
            if err is not None:
                raise err

    def _cause_of(self, exc: BaseException, *, t0: float, active: list[bool]) -> BaseException:
        """What to raise for an error of the wait itself: a worker's death when one shows
        within ``poll_s`` (a batch's shared memory is fetched from its worker: one dying
        meanwhile resets that connection before it is seen to exit), else ``exc``."""
        deadline = time.monotonic() + self.poll_s
        while True:
            err = self._failure(waited_s=time.monotonic() - t0, active=active)
            if err is not None or time.monotonic() >= deadline:
                return err if err is not None else exc
            time.sleep(0.02)

    def _failure(self, *, waited_s: float, active: list[bool]) -> WorkerError | None:
        """The error the loop should raise now, or None to keep waiting. ``active[i]``:
        worker ``i``'s end of stream had not arrived when the wait began."""
        dead = [
            (i, w)
            for i, w in enumerate(self.workers)
            if w.exitcode is not None and (active[i] or w.exitcode != 0)
        ]
        if dead and not self.silenced:  # a death is the cause, whatever the clock says
            what = "; ".join(f"worker {i} (pid {w.pid}) {_ended(w, active[i])}" for i, w in dead)
            hint = ""
            if any(w.exitcode == -signal.SIGKILL for _, w in dead):
                hint = " (SIGKILL: often the out-of-memory killer; lower max_bytes)"
            return WorkerError(f"DataLoader worker died: {what}{hint}")
        if self.silenced or (self.timeout_s is not None and waited_s >= self.timeout_s):
            return WorkerError(
                f"no batch arrived within timeout_s={self.timeout_s} (waited {waited_s:.1f} "
                f"s) from {self._awaited(active)}: stuck (hung in a stage, stopped, or "
                "starved); the workers were stopped. Raise timeout_s if a batch can take "
                "that long"
            )
        return None

    def _awaited(self, active: list[bool]) -> str:
        """The workers the loop is waiting for, by index and pid."""
        it = self.dl_iter
        ids: list[int] = []
        info = getattr(it, "_task_info", {}).get(getattr(it, "_rcvd_idx", -1))
        if getattr(it, "_in_order", True) and info is not None and len(info) == 1:
            ids = [info[0]]  # in order: the worker owing the next batch
        if not ids:
            counts = getattr(it, "_workers_num_tasks", [1] * len(self.workers))
            ids = [i for i, a in enumerate(active) if a and counts[i] > 0] or [
                i for i, a in enumerate(active) if a
            ]
        names = ", ".join(f"worker {i} (pid {self.workers[i].pid})" for i in ids)
        return names or "the workers"

    def _watch(self) -> None:
        assert self.timeout_s is not None
        limit = self.timeout_s + self.grace_s
        with self._cond:
            while not self._done:
                if self._since is None:
                    self._cond.wait()
                    continue
                left = self._since + limit - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.silenced = True
                self._since = None
                log.warning(
                    "streambuf: no batch within timeout_s=%s; killing the DataLoader workers",
                    self.timeout_s,
                )
                kill_workers(self.dl_iter)

    def stop(self) -> None:
        """End the watch and give the iterator its own ``_get_data`` back."""
        with self._cond:
            self._done = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5.0)
        if self.dl_iter.__dict__.get("_get_data") == self._get:
            del self.dl_iter._get_data
