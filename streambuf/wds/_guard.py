"""What a per-sample function does when a sample is bad: raise or skip, once, here.

``SampleFn`` is the base of the sample functions of ``streambuf.sources`` (``Decoder``,
``ToTuple``, ``Rename``, ``MapDict``): ``fail(sample, message, cause)`` builds one
``ShardError`` naming the stage, the sample key and its shard (credentials removed) and
hands it to the ``on_error`` policy: ``"raise"`` raises it, ``"skip"`` counts and logs it
and the function returns ``SKIPPED``, which a following ``filter(not_skipped)`` drops (a
map stage cannot drop an item; ``Pipeline`` adds that filter). Counts are per process:
a pickled policy starts from zero in each DataLoader worker (``FailurePolicy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .._failures import FailurePolicy, OnError
from ..errors import ShardError
from ..io.urls import redact

__all__ = ["SKIPPED", "SampleFn", "not_skipped"]


class _Skipped:
    def __repr__(self) -> str:
        return "SKIPPED"

    def __reduce__(self) -> str:
        return "SKIPPED"  # unpickles as this module's singleton


SKIPPED: Final = _Skipped()
"""What a sample function under ``on_error="skip"`` returns for a sample it skipped."""


def not_skipped(item: Any, /) -> bool:
    """Filter predicate: False for ``SKIPPED``, so ``filter(not_skipped)`` drops it."""
    return item is not SKIPPED


class SampleFn:
    """Base of the per-sample functions: the ``on_error`` policy and the error format."""

    stage = "sample"

    def __init__(self, *, on_error: OnError = "raise", max_failures: int | None = None) -> None:
        self.on_error: OnError = on_error
        self.max_failures = max_failures
        self._policy = FailurePolicy(on_error, max_failures, stage=self.stage)  # validates

    @property
    def skipped(self) -> int:
        """Samples skipped so far in this process (``on_error="skip"``)."""
        return self._policy.skipped

    def fail(
        self,
        sample: Mapping[str, Any],
        what: str,
        *,
        fix: str = "",
        cause: BaseException | None = None,
    ) -> _Skipped:
        """Raise the ``ShardError`` "<what> of sample <key>[: <cause>][; <fix>]" or,
        under ``"skip"``, count it and return ``SKIPPED``."""
        url = sample.get("__url__") if isinstance(sample, Mapping) else None
        key = sample.get("__key__", "?") if isinstance(sample, Mapping) else "?"
        source = redact(url) if url is not None else None
        text = f"{what} of sample {key!r}"
        if cause is not None:
            text += f": {type(cause).__name__}: {redact(cause)}"
        if fix:
            text += f"; {fix}"
        err = ShardError(text, stage=self.stage, source=source)
        err.__cause__ = cause
        self._policy.handle(err, source=source, error_type=ShardError, what="sample skipped")
        return SKIPPED
