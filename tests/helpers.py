"""Small helpers shared by tests (import as tests.helpers)."""

from __future__ import annotations

import threading
import time


def wait_for_threads(prefix: str = "streambuf", timeout_s: float = 5.0) -> list[str]:
    """Names of threads starting with ``prefix`` still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)
