"""The save/load harness for checkpoints: prove a pipeline (your stages in it) resumes
exactly (in the spirit of torchdata's ``run_test_save_load_state``, for streambuf's
``Loader``). The project's own resume tests run on it.

For each stop: run an epoch, stop after ``k`` batches -> ``state_dict()`` (through JSON,
as a checkpoint file would be) -> a *fresh* Loader (in a fresh process when asked) ->
``load_state_dict`` -> finish. The batches before the stop plus those after the resume
must equal the uninterrupted epoch, and the next epoch the uninterrupted next epoch.
Stop ``"last"`` saves right after the epoch's last batch, ``"end"`` after the loop
ended: both states are complete, so the resumed iteration is the next epoch.

    from streambuf.testing import check_resume
    check_resume(make_pipeline, num_workers=(0, 2))   # raises AssertionError if not exact

Factories must be module-level functions (a fresh spawned process builds the same
loader from them).
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "check_resume",
    "check_save_load",
    "epoch_batches",
    "plain",
    "resume_and_finish",
    "resume_in_fresh_process",
    "roundtrip",
    "save_after",
]

Ids = Callable[[Any], Any]
Stop = int | str


def plain(batch: Any) -> Any:
    """A batch as comparable plain data: tensors and arrays as nested lists, dicts and
    sequences element by element (the default ``ids`` of ``check_resume``)."""
    tolist = getattr(batch, "tolist", None)
    if callable(tolist):
        return tolist()
    if isinstance(batch, Mapping):
        return {k: plain(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return [plain(x) for x in batch]
    return batch


def roundtrip(state: Any) -> Any:
    """``state`` through JSON, as a checkpoint file would hold it."""
    return json.loads(json.dumps(state))


def epoch_batches(loader: Any, epoch: int, ids: Ids = plain) -> list[Any]:
    loader.set_epoch(epoch)
    return [ids(b) for b in loader]


def save_after(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    stop: Stop,
    *,
    epoch: int = 0,
    ids: Ids = plain,
) -> tuple[list[Any], Any]:
    """(batches before the stop, the state) after ``stop`` batches of ``epoch``."""
    loader = factory(**kwargs)
    loader.set_epoch(epoch)
    got: list[Any] = []
    if stop == "end":
        got = [ids(b) for b in loader]
    else:
        it = iter(loader)
        for _ in range(int(stop)):
            got.append(ids(next(it)))
        state = roundtrip(loader.state_dict())
        it.close()
        loader.close()
        return got, state
    state = roundtrip(loader.state_dict())
    loader.close()
    return got, state


def resume_and_finish(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    state: Any,
    *,
    next_epoch: int | None = None,
    ids: Ids = plain,
) -> tuple[list[Any], list[Any] | None]:
    """(the resumed iteration's batches, then ``next_epoch``'s) from a fresh Loader."""
    loader = factory(**kwargs)
    loader.load_state_dict(state)
    rest = [ids(b) for b in loader]
    after = epoch_batches(loader, next_epoch, ids) if next_epoch is not None else None
    loader.close()
    return rest, after


def _child(factory: Any, kwargs: Any, state: Any, next_epoch: Any, ids: Any, out: Any) -> None:
    try:
        out.put(("ok", resume_and_finish(factory, kwargs, state, next_epoch=next_epoch, ids=ids)))
    except BaseException as exc:
        out.put(("error", repr(exc)))
        raise


def resume_in_fresh_process(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    state: Any,
    *,
    next_epoch: int | None = None,
    ids: Ids = plain,
    timeout_s: float = 180.0,
) -> tuple[list[Any], list[Any] | None]:
    """``resume_and_finish`` in a newly spawned Python process (a real restart);
    ``factory`` and ``ids`` must be module-level functions."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(factory, kwargs, state, next_epoch, ids, out))
    proc.start()
    try:
        status, value = out.get(timeout=timeout_s)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise AssertionError(f"the resume in a fresh process failed: {value}")
    return value


def check_save_load(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    stops: Sequence[Stop],
    *,
    fresh_process: bool = False,
    ids: Ids = plain,
) -> list[list[Any]]:
    """The harness over a Loader factory (``factory(**kwargs) -> Loader``) at each stop
    (see the module docstring); returns the uninterrupted epochs 0, 1 and 2."""
    ref_loader = factory(**kwargs)
    ref = [epoch_batches(ref_loader, e, ids) for e in (0, 1, 2)]
    ref_loader.close()
    n = len(ref[0])
    if n < 2:
        raise AssertionError(f"the harness needs an epoch of at least 2 batches, got {n}")
    for stop in stops:
        k = n if stop == "last" else stop
        if stop not in ("last", "end") and not 0 <= int(k) <= n:
            raise AssertionError(f"stop {stop} is not inside the epoch of {n} batches")
        first, state = save_after(factory, kwargs, k, ids=ids)
        complete = stop in ("end", "last")
        resume = resume_in_fresh_process if fresh_process else resume_and_finish
        rest, after = resume(factory, kwargs, state, next_epoch=2 if complete else 1, ids=ids)
        where = f"{kwargs}, stop {stop!r}"
        if complete:
            assert first == ref[0], f"{where}: an uninterrupted epoch changed"
            assert state["complete"] is True, f"{where}: the saved state is not complete"
            assert rest == ref[1], f"{where}: resuming at the end must give the next epoch"
            assert after == ref[2], f"{where}: the epoch after that differs"
        else:
            assert first == ref[0][: int(k)], f"{where}: the run before the stop changed"
            assert first + rest == ref[0], (
                f"{where}: the resumed epoch differs from the uninterrupted one:\n"
                f"  resumed   {_short(first + rest)}\n  reference {_short(ref[0])}"
            )
            assert after == ref[1], f"{where}: the epoch after the resume differs"
    return ref


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 400 else text[:397] + "..."


def _loader_of(
    make_pipeline: Callable[[], Any], loader_kwargs: dict[str, Any], *, workers: int
) -> Any:
    from .loader import Loader

    return Loader(make_pipeline(), num_workers=workers, **loader_kwargs)


def check_resume(
    make_pipeline: Callable[[], Any],
    *,
    num_workers: Sequence[int] = (0, 2),
    stops: Sequence[Stop] = (1, 3, "last", "end"),
    fresh_process: bool = False,
    ids: Ids = plain,
    **loader_kwargs: Any,
) -> dict[int, list[list[Any]]]:
    """Prove that ``make_pipeline()`` (a module-level function returning a
    ``streambuf.Pipeline``) resumes exactly through a ``Loader`` with each of
    ``num_workers``, at each of ``stops`` (batches into epoch 0, ``"last"``,
    ``"end"``), saved through JSON and loaded into a fresh Loader (a fresh process with
    ``fresh_process=True``): the epoch and the one after it equal the uninterrupted run.
    ``loader_kwargs`` go to the Loader (defaults ``max_batches=4``,
    ``max_bytes="64MiB"``). Raises ``AssertionError`` naming the worker count and stop;
    returns the uninterrupted epochs 0-2 for each worker count."""
    kw = {"max_batches": 4, "max_bytes": "64MiB", **loader_kwargs}
    refs = {}
    for workers in num_workers:
        factory = functools.partial(_loader_of, make_pipeline, kw)
        refs[workers] = check_save_load(
            factory, {"workers": workers}, stops, fresh_process=fresh_process, ids=ids
        )
    return refs
