"""Exceptions raised by streambuf.

The tree::

    StreambufError                 base of everything streambuf raises on purpose
    ├── BufferClosed               put() on a closed buffer; get() on a closed, drained one
    ├── StageError                 a stage failed; names the stage and, where known, the
    │   │                          shard/file (``.stage``, ``.source``); ``__cause__`` is
    │   │                          the original exception, traceback intact
    │   ├── ShardError             a shard could not be opened, read or parsed
    │   ├── VideoError             a video could not be opened or decoded
    │   └── AudioError             an audio file could not be opened or decoded
    ├── TooManyFailures            on_error="skip" skipped more than max_failures items
    └── WorkerError                a DataLoader worker died or stopped answering

Exceptions raised by user code inside a stage keep their own type when they reach the
consumer: streambuf re-raises the very same object (so ``except KeyError`` still works)
and adds a note (PEP 678) that names the stage and the thread or worker it ran in.
``ValueError``/``TypeError`` are raised for bad arguments, with the fix in the message.
"""

from __future__ import annotations

__all__ = [
    "AudioError",
    "BufferClosed",
    "ShardError",
    "StageError",
    "StreambufError",
    "TooManyFailures",
    "VideoError",
    "WorkerError",
    "add_note",
]


class StreambufError(Exception):
    """Base class of the errors streambuf raises on purpose."""


class BufferClosed(StreambufError):
    """The buffer was closed: no more puts; gets end once it is drained."""


class StageError(StreambufError):
    """A stage failed on one input.

    Attributes:
        stage: the stage's name, e.g. ``"tar"`` or ``"map(decode)"``.
        source: the shard, URL or file being processed, if known (credentials removed).
    """

    def __init__(self, message: str, *, stage: str, source: str | None = None) -> None:
        where = f"[stage {stage!r}" + (f", source {source!r}]" if source else "]")
        super().__init__(f"{message} {where}")
        self.stage = stage
        self.source = source

    def __reduce__(self):  # keep stage/source across process boundaries (DataLoader workers)
        msg = self.args[0] if self.args else ""
        return (_rebuild, (type(self), msg, self.stage, self.source))


def _rebuild(cls, message, stage, source):
    obj = cls.__new__(cls)
    Exception.__init__(obj, message)
    obj.stage = stage
    obj.source = source
    return obj


class ShardError(StageError):
    """A shard could not be opened, read or parsed (missing, truncated, corrupt)."""


class VideoError(StageError):
    """A video could not be opened or decoded."""


class AudioError(StageError):
    """An audio file could not be opened or decoded, or is shorter than it says."""


class TooManyFailures(StreambufError):
    """More inputs failed than ``max_failures`` allows under ``on_error="skip"``."""


class WorkerError(StreambufError):
    """A DataLoader worker process died or did not answer within ``timeout_s``."""


def add_note(exc: BaseException, note: str) -> BaseException:
    """Attach ``note`` to ``exc`` (PEP 678; a no-op before Python 3.11). Returns ``exc``."""
    adder = getattr(exc, "add_note", None)
    if adder is not None:
        notes = getattr(exc, "__notes__", ())
        if note not in notes:
            adder(note)
    return exc


def stop_as_error(stop: StopIteration, fn: str, where: str | None = None) -> RuntimeError:
    """The error for a ``StopIteration`` raised by a user function ``fn`` that a stage
    calls (raised ``from stop``), with the note ``where`` (the stage and item). Let
    through, it would end the stream early and silently (``map()`` of one thread is the
    built-in ``map``, which takes it as the end)."""
    err = RuntimeError(
        f"{fn} raised StopIteration ({stop!r}): a function called on each item must not "
        "raise it (it would end the stream early); return a value, or drop items with "
        "filter()"
    )
    if where is not None:
        add_note(err, where)
    return err
