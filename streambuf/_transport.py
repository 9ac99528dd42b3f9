"""What crosses from a DataLoader worker to the main process: batches and failures.

torch's DataLoader moves a worker's exception as ``ExceptionWrapper``, which rebuilds it
as ``cls(message)``: an exception whose constructor needs more (``StageError(stage=)``,
most user exceptions with keyword arguments) comes back as a different type, its
attributes and notes gone. And a batch that cannot be pickled fails inside the worker's
queue thread, which prints the error and sends nothing: the main process waits forever.
So a worker never lets either reach torch's machinery:

* ``Tagged`` carries a batch with its worker id, size and pipeline state. It pickles the
  batch itself, with torch's ``ForkingPickler`` (tensors still travel through shared
  memory, as with the DataLoader), inside its own ``__reduce__``: when that fails, what
  arrives in the main process is a ``Failure`` naming the type that could not be pickled,
  the stage and the fix, instead of nothing.
* ``Failure`` carries an exception raised in the worker: the exception object pickled
  whole (type, attributes, notes, its ``__cause__`` and ``__context__`` chain packed the
  same way), plus its
  type name, message and the worker's formatted traceback. ``Failure.exception()``
  rebuilds it in the main process; when it cannot be rebuilt there, a ``StageError``
  naming the original type and message takes its place. Either way a note gives the
  worker, its pid and the worker traceback.

Ownership: a ``Tagged`` owns its batch until the main process unpacks it; the credits it
holds are released by the main process when the batch (or the failure) is handed over.
"""

from __future__ import annotations

import io
import os
import pickle
import traceback
from dataclasses import dataclass
from typing import Any

from .errors import StageError, add_note

__all__ = ["Failure", "Tagged", "pack_exception"]


def _dumps(obj: Any) -> bytes:
    """Pickle as the DataLoader's queues do (torch's reductions: tensors via shared
    memory), except tensors in this worker's batch arena: those go as their place in it
    (``streambuf._arena``)."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing

    from . import _arena

    act = _arena.active()
    buf = io.BytesIO()
    pickler = ForkingPickler(buf, pickle.HIGHEST_PROTOCOL)
    if act is not None:
        arena = act[0]

        def persistent_id(x: Any) -> Any:
            if type(x) is not torch.Tensor:
                return None
            storage = x.untyped_storage()
            at = arena.contains(storage.data_ptr())
            if at is None:
                return None
            slot, offset = divmod(at, arena.slot_bytes)
            return (
                "streambuf-arena",
                arena.token,
                slot,
                offset,
                storage.nbytes(),
                str(x.dtype).removeprefix("torch."),
                tuple(x.shape),
                x.stride(),
                x.storage_offset(),
            )

        pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    pickler.dump(obj)
    return buf.getvalue()


class _Unpickler(pickle.Unpickler):
    """Rebuilds arena tensors as views of this process's mapping (slot freed when the
    last view dies)."""

    def persistent_load(self, pid: Any) -> Any:
        import torch

        from . import _arena

        tag, token, slot, offset, nbytes, dtype, shape, stride, storage_offset = pid
        if tag != "streambuf-arena":
            raise pickle.UnpicklingError(f"unknown persistent id {tag!r}")
        dt = getattr(torch, dtype)
        if not nbytes:
            return torch.empty(0, dtype=dt).as_strided(shape, stride, storage_offset)
        # the tensor must hold the slot's view itself (the slot is freed when it dies):
        # frombuffer on it, then slice in torch (a numpy slice would hold the whole arena)
        whole = torch.frombuffer(_arena.registered(token).adopt(slot), dtype=torch.uint8)
        flat = whole[offset : offset + nbytes].view(dt)
        # as_strided's offset is absolute in the storage (the whole slot): the leaf's
        # place in the slot plus its own offset in its storage
        return flat.as_strided(shape, stride, flat.storage_offset() + storage_offset)


def _loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


@dataclass
class Tagged:
    """A batch on its way from ``worker`` to the main process (see module docstring).

    ``state`` is the worker's pipeline position just after this batch (plain data);
    ``end`` marks a worker's share that ended without any batch (``batch`` None): it
    carries that share's final state, so a checkpoint knows the share is done.
    """

    worker: int
    nbytes: int
    batch: Any
    state: Any = None
    end: bool = False

    def __reduce__(self) -> tuple[Any, ...]:
        try:
            payload = _dumps(self.batch)
        except Exception as exc:
            failure = Failure.of(
                StageError(
                    f"a batch of type {type(self.batch).__name__} cannot be sent to the main "
                    f"process: {type(exc).__name__}: {exc}. Every batch must pickle: return "
                    "tensors, numpy arrays, numbers, strings and containers of them from your "
                    "stages and collate function (convert or drop objects such as open files, "
                    "locks, generators or lambdas before .batch())",
                    stage="transport",
                ),
                worker=self.worker,
                nbytes=self.nbytes,
            )
            return (_rebuild_failure, (failure.__dict__,))
        return (_rebuild_tagged, (self.worker, self.nbytes, payload, self.state, self.end))


def _rebuild_tagged(worker: int, nbytes: int, payload: bytes, state: Any, end: bool) -> Tagged:
    return Tagged(worker, nbytes, _loads(payload), state, end)


def _rebuild_failure(fields: dict[str, Any]) -> Failure:
    f = Failure.__new__(Failure)
    f.__dict__.update(fields)
    return f


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


_CHAIN_DEPTH = 8  # causes/contexts kept per exception (a chain is rarely longer)


def _pack_linked(exc: BaseException | None, depth: int) -> dict[str, Any] | None:
    """``exc`` and, recursively, its ``__cause__``/``__context__`` as plain data."""
    if exc is None or depth <= 0:
        return None
    try:
        pickled: bytes | None = _dumps(exc)
    except Exception:
        pickled = None
    return {
        "pickled": pickled,
        "type": _qualname(exc),
        "message": str(exc),
        "notes": list(getattr(exc, "__notes__", ())),
        "cause": _pack_linked(exc.__cause__, depth - 1),
        "context": _pack_linked(exc.__context__, depth - 1)
        if exc.__context__ is not exc.__cause__
        else None,
        "suppress_context": exc.__suppress_context__,
    }


def _keep_notes(exc: BaseException, notes: list[str]) -> None:
    """Give ``exc`` the notes it had in the worker that its pickling lost (a user
    ``__reduce__`` that drops ``__dict__``)."""
    have = list(getattr(exc, "__notes__", ()))
    for note in notes:
        if note not in have:
            add_note(exc, note)


def _unpack_linked(info: dict[str, Any] | None) -> BaseException | None:
    """The exception of ``_pack_linked``'s data, its chain re-attached; one that cannot be
    rebuilt here becomes a ``StageError`` naming its type and message."""
    if info is None:
        return None
    exc: Any = None
    if info["pickled"] is not None:
        try:
            exc = _loads(info["pickled"])
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = StageError(f"{info['type']}: {info['message']}", stage="worker")
    _keep_notes(exc, info["notes"])
    _attach_chain(exc, info)
    return exc


def _attach_chain(exc: BaseException, info: dict[str, Any]) -> None:
    """Re-attach the packed ``__cause__``/``__context__`` of ``info`` to ``exc``."""
    cause = _unpack_linked(info["cause"])
    if cause is not None:
        exc.__cause__ = cause
    context = _unpack_linked(info["context"])
    exc.__context__ = context if context is not None else exc.__cause__
    exc.__suppress_context__ = info["suppress_context"]


def pack_exception(exc: BaseException) -> dict[str, Any]:
    """An exception as plain data: pickled whole where possible, described always, its
    ``__cause__`` and ``__context__`` chain packed the same way (``raise X from Y``)."""
    linked = _pack_linked(exc, _CHAIN_DEPTH)
    assert linked is not None
    return {
        **linked,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "stage": getattr(exc, "stage", None),
        "source": getattr(exc, "source", None),
    }


class Failure:
    """An exception raised in a worker, as data (see module docstring)."""

    worker: int
    nbytes: int | None  # the credits of the batch it replaces, to release; None: none held
    pid: int
    info: dict[str, Any]

    @classmethod
    def of(
        cls,
        exc: BaseException,
        *,
        worker: int,
        nbytes: int | None = None,
        stage: str | None = None,
    ) -> Failure:
        f = cls()
        f.worker, f.nbytes, f.pid = worker, nbytes, os.getpid()
        f.info = pack_exception(exc)
        if stage is not None and f.info["stage"] is None:
            f.info["stage"] = stage
        return f

    def exception(self) -> BaseException:
        """The worker's exception, rebuilt (same type, attributes and notes), or a
        ``StageError`` naming its type when it cannot be rebuilt here."""
        info = self.info
        exc: BaseException | None = None
        why = "it could not be pickled in the worker"
        if info["pickled"] is not None:
            try:
                exc = _loads(info["pickled"])
            except Exception as err:
                why = f"rebuilding it here failed: {type(err).__name__}: {err}"
        if not isinstance(exc, BaseException):
            exc = StageError(
                f"{info['type']}: {info['message']} (the original exception could not be "
                f"raised in the main process: {why})",
                stage=info["stage"] or "worker",
                source=info["source"],
            )
        _keep_notes(exc, info["notes"])
        _attach_chain(exc, info)
        add_note(
            exc,
            f"streambuf: raised in DataLoader worker {self.worker} (pid {self.pid}); "
            f"worker traceback:\n{info['traceback'].rstrip()}",
        )
        return exc
