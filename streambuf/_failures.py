"""The ``on_error`` policy shared by every stage that reads untrusted input.

``on_error="raise"`` (default): the failure propagates as the given error type, naming
the stage and the source. ``on_error="skip"``: the input is skipped, counted and logged
(one WARNING line each), until more than ``max_failures`` were skipped, which raises
``TooManyFailures``. Counters are per policy object (one per stage per worker): a
pickled copy starts from zero.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

from ._units import check_choice, check_int
from .errors import StageError, TooManyFailures

__all__ = ["FailurePolicy", "OnError"]

log = logging.getLogger("streambuf")

OnError = Literal["raise", "skip"]


class FailurePolicy:
    """Decide what a failure on one input does; thread-safe.

    Args:
        on_error: "raise" or "skip".
        max_failures: with "skip", raise ``TooManyFailures`` once more than this many
            inputs were skipped (None: no limit).
        stage: the stage name used in messages.
    """

    def __init__(
        self, on_error: OnError = "raise", max_failures: int | None = None, *, stage: str
    ) -> None:
        check_choice(on_error, name="on_error", choices=("raise", "skip"))
        if max_failures is not None:
            check_int(max_failures, name="max_failures")
        self.on_error: OnError = on_error
        self.max_failures = max_failures
        self.stage = stage
        self.skipped = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # a copy (a DataLoader worker) counts its own failures from zero; no lock crosses
        return {"on_error": self.on_error, "max_failures": self.max_failures, "stage": self.stage}

    def __setstate__(self, state: dict[str, Any]) -> None:
        FailurePolicy.__init__(self, state["on_error"], state["max_failures"], stage=state["stage"])

    def handle(
        self,
        exc: BaseException,
        *,
        source: str | None,
        error_type: type[StageError] = StageError,
        what: str = "failed",
    ) -> None:
        """Raise (as ``error_type`` from ``exc``) or count and log a skip.

        ``source`` must already be free of credentials (see ``redact`` helpers).
        """
        message = f"{what}: {type(exc).__name__}: {exc}"
        if self.on_error == "raise":
            if isinstance(exc, StageError):
                raise exc
            raise error_type(message, stage=self.stage, source=source) from exc
        with self._lock:
            self.skipped += 1
            n = self.skipped
        log.warning(
            "streambuf: skipped (%d so far) in stage %r, source %r: %s",
            n,
            self.stage,
            source,
            message,
        )
        if self.max_failures is not None and n > self.max_failures:
            raise TooManyFailures(
                f"stage {self.stage!r}: {n} inputs failed, more than max_failures="
                f"{self.max_failures}; last: {source!r}: {message}"
            ) from exc
