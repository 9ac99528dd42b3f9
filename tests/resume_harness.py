"""A save/load harness for checkpoints (in the spirit of torchdata's
``run_test_save_load_state``, written for streambuf's Loader).

For each stop point: run an epoch and stop after ``k`` batches -> ``state_dict()`` (a
JSON round trip, as a checkpoint file would be) -> a *fresh* Loader (in a fresh process
when asked) -> ``load_state_dict`` -> finish. The batches before the stop plus those
after the resume must equal the uninterrupted epoch; then the next epoch must equal the
uninterrupted next epoch. Stop ``"last"`` saves right after the epoch's last batch and
``"end"`` after the loop ended: both states are complete, so the resumed iteration is
the next epoch.

Factories are module-level functions (``factory(**kwargs) -> Loader``) so that a fresh
spawned process can build the same loader.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any

Ids = Callable[[Any], list[Any]]


def ids_of(batch: Any) -> list[Any]:
    """Sample identities of a batch: ints of a tensor, keys of WebDataset samples, or
    (source, clip index) of clips."""
    if isinstance(batch, dict) and "__key__" in batch:
        return list(batch["__key__"])
    data = getattr(batch, "clip_index", None)
    if data is not None:
        return list(zip(batch.source, [int(i) for i in data]))
    return [int(x) for x in batch]


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def epoch_batches(loader: Any, epoch: int, ids: Ids = ids_of) -> list[list[Any]]:
    loader.set_epoch(epoch)
    return [ids(b) for b in loader]


def save_after(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    stop: int | str,
    *,
    epoch: int = 0,
    ids: Ids = ids_of,
):
    """(batches before the stop, the state) after ``stop`` batches of ``epoch``."""
    loader = factory(**kwargs)
    loader.set_epoch(epoch)
    got: list[list[Any]] = []
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
    state: dict[str, Any] | list[dict[str, Any]],
    *,
    next_epoch: int | None = None,
    ids: Ids = ids_of,
) -> tuple[list[list[Any]], list[list[Any]] | None]:
    """(the resumed iteration's batches, then ``next_epoch``'s) from a fresh Loader."""
    loader = factory(**kwargs)
    loader.load_state_dict(state)
    rest = [ids(b) for b in loader]
    after = epoch_batches(loader, next_epoch, ids) if next_epoch is not None else None
    loader.close()
    return rest, after


def _child(factory, kwargs, state, next_epoch, ids, out) -> None:  # pragma: no cover
    try:
        out.put(("ok", resume_and_finish(factory, kwargs, state, next_epoch=next_epoch, ids=ids)))
    except BaseException as exc:
        out.put(("error", repr(exc)))
        raise


def resume_in_fresh_process(
    factory, kwargs, state, *, next_epoch=None, ids=ids_of, timeout_s=180.0
):
    """``resume_and_finish`` in a newly spawned Python process (a real restart); ``ids``
    must be a module-level function."""
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
    assert status == "ok", value
    return value


def check_save_load(
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    stops: Sequence[int | str],
    *,
    fresh_process: bool = False,
    ids: Ids = ids_of,
) -> list[list[list[Any]]]:
    """Run the harness at each stop (see the module docstring); returns the reference."""
    ref_loader = factory(**kwargs)
    ref = [epoch_batches(ref_loader, e, ids) for e in (0, 1, 2)]
    ref_loader.close()
    n = len(ref[0])
    assert n >= 2, "the harness needs an epoch of at least 2 batches"
    for stop in stops:
        k = n if stop == "last" else stop
        first, state = save_after(factory, kwargs, k, ids=ids)
        complete = stop in ("end", "last")
        resume = resume_in_fresh_process if fresh_process else resume_and_finish
        rest, after = resume(factory, kwargs, state, next_epoch=2 if complete else 1, ids=ids)
        if complete:
            assert first == ref[0], "an uninterrupted epoch changed"
            assert state["complete"] is True
            assert rest == ref[1], "resuming at the end of an epoch must give the next epoch"
            assert after == ref[2]
        else:
            assert first == ref[0][: int(k)]
            assert first + rest == ref[0], f"stop {stop}: the resumed epoch differs"
            assert after == ref[1], f"stop {stop}: the epoch after the resume differs"
    return ref


def counted_once(delivered: Sequence[Any], expected: Sequence[Any]) -> None:
    """Every expected sample exactly once (no loss, no duplicate), with counts shown."""
    from collections import Counter

    c = Counter(delivered)
    dups = sorted((k, v) for k, v in c.items() if v > 1)
    missing = sorted(set(expected) - set(c))
    extra = sorted(set(c) - set(expected))
    assert not dups and not missing and not extra, (
        f"{len(delivered)} delivered for {len(expected)}: duplicates {dups[:10]}, "
        f"missing {missing[:10]}, unexpected {extra[:10]}"
    )
