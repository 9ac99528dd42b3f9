"""The main process's watch over a DataLoader's workers: ``Supervisor``.

``WorkerError`` means exactly one thing: a worker died, or stopped answering for
``timeout_s``. It is decided from the workers' state (process alive? exit code? how long
the loop has waited?), never from the text of an exception, so an error raised by the
user's own code (which travels as a ``streambuf._transport.Failure``) is never mistaken
for it. How:

* **Polling, not signals.** torch raises a worker's death from its SIGCHLD handler,
  i.e. in the main thread *wherever it happens to be*, user code included, as a plain
  ``RuntimeError``. The supervisor takes its workers off that watch and instead lets the
  DataLoader wait in slices of ``poll_s`` (its ``timeout``); after each slice it looks
  at the processes: one gone -> ``WorkerError`` naming it, its pid and how it ended
  (within ``poll_s``); ``timeout_s`` exceeded -> ``WorkerError``; else it waits again (a
  timed-out wait changes nothing in the DataLoader's state).
* **Stopped worker.** A batch already queued by a worker that then stopped (SIGSTOP, a
  frozen cgroup) is unpickled by fetching its shared-memory descriptor *from that
  worker*: a wait no DataLoader timeout bounds. While the loop waits, a watch thread
  checks the clock and, ``grace_s`` past ``timeout_s``, kills the workers, which ends
  that wait; the loop raises ``WorkerError``.
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
from typing import Any

from .errors import WorkerError

__all__ = ["POLL_S", "Supervisor", "kill_workers"]

log = logging.getLogger("streambuf")

POLL_S = 1.0


def _ended(w: Any) -> str:
    code = w.exitcode
    if code is None:
        return "is alive"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
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
    """Gets batches from one DataLoader iterator (see the module docstring).

    The DataLoader must have been built with ``timeout=poll_s``.
    """

    def __init__(
        self,
        dl_iter: Any,
        *,
        timeout_s: float | None,
        poll_s: float = POLL_S,
        grace_s: float = 0.5,
    ) -> None:
        self.dl_iter = dl_iter
        self.workers = list(getattr(dl_iter, "_workers", []))
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.silenced = False  # the watch killed the workers for not answering
        _unwatch(dl_iter)
        self._since: float | None = None
        self._done = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if timeout_s is not None:
            self._thread = threading.Thread(
                target=self._watch, name="streambuf-loader-watch", daemon=True
            )
            self._thread.start()

    def next(self, it: Iterator[Any]) -> Any:
        """The next item of ``it`` (the DataLoader iterator); StopIteration at its end.

        Raises:
            WorkerError: a worker died, or nothing arrived within ``timeout_s``.
        """
        t0 = time.monotonic()
        with self._cond:
            self._since = t0
            self._cond.notify()
        try:
            while True:
                t_call = time.monotonic()
                try:
                    return next(it)
                except StopIteration:
                    raise
                except Exception as exc:
                    now = time.monotonic()
                    err = self._failure(waited_s=now - t0)
                    if err is not None:
                        raise err from exc
                    if now - t_call < 0.9 * self.poll_s:
                        raise  # not a wait that ran out: the DataLoader's own error
        finally:
            with self._cond:
                self._since = None

    def _failure(self, *, waited_s: float) -> WorkerError | None:
        dead = [(i, w) for i, w in enumerate(self.workers) if w.exitcode is not None]
        if dead and not self.silenced:  # a death is the cause, whatever the clock says
            what = "; ".join(f"worker {i} (pid {w.pid}) {_ended(w)}" for i, w in dead)
            hint = ""
            if any(w.exitcode == -signal.SIGKILL for _, w in dead):
                hint = " (SIGKILL: often the out-of-memory killer; lower max_bytes)"
            return WorkerError(f"DataLoader worker died: {what}{hint}")
        if self.silenced or (self.timeout_s is not None and waited_s >= self.timeout_s):
            return WorkerError(
                f"no batch arrived within timeout_s={self.timeout_s} (waited {waited_s:.1f} "
                "s): a DataLoader worker is stuck (hung in a stage, stopped, or starved); "
                "the workers were stopped. Raise timeout_s if a batch can take that long"
            )
        return None

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
        with self._cond:
            self._done = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5.0)
