"""Joining background threads within one shared deadline (every stage's ``close()``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

__all__ = ["join_all"]

log = logging.getLogger("streambuf")


def join_all(threads: Iterable[threading.Thread], *, timeout_s: float, stops_when: str) -> None:
    """Join ``threads`` within ``timeout_s`` in total (never the calling thread itself).

    A thread still alive then is stuck in user or I/O code that cannot be interrupted
    from outside: it is a daemon, so it is logged (``stops_when`` says when it will end)
    and left to finish on its own.
    """
    deadline = time.monotonic() + timeout_s
    for th in threads:
        if th is threading.current_thread():
            continue
        th.join(max(0.0, deadline - time.monotonic()))
        if th.is_alive():
            log.warning(
                "streambuf: thread %s still busy after %.1f s; it is a daemon and stops %s",
                th.name,
                timeout_s,
                stops_when,
            )
