"""A checkpoint taken after the Loader's own code raised between taking a batch and
handing it over (the log sink, a sizer of the batch, a device copy ahead of the loop)
describes exactly the batches the loop received: resumed, every sample comes exactly
once, in the order of an uninterrupted run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import streambuf as sb
from streambuf.sizing import nbytes
from tests.resume_harness import counted_once, ids_of

pytestmark = pytest.mark.timeout(120)

N = 48
FAIL_AT = 3  # the hook raises on its third call


class HookDown(RuntimeError):
    pass


def _raising_on(n: int) -> Callable[..., None]:
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1
        if calls[0] == n:
            raise HookDown(f"call {n}")

    return hook


class Box:
    """A batch of a type the user sizes (``nbytes.register``)."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[int]:
        return iter(self.items)


class _RaisingHandler(logging.Handler):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.hook = _raising_on(n)

    def emit(self, record: logging.LogRecord) -> None:
        self.hook(record)


class LookAhead:
    """Stands in for ``DevicePrefetcher`` on a machine without an accelerator: copies
    (``copy``, a hook) ``depth`` batches ahead of the loop, the way the CUDA path does."""

    copy: Callable[..., None] = staticmethod(lambda batch: None)

    def __init__(self, batches: Iterator[Any], *, device: Any, depth: int) -> None:
        self.batches, self.depth = batches, depth

    def __iter__(self) -> Iterator[Any]:
        ahead: list[Any] = []
        for batch in self.batches:
            type(self).copy(batch)
            ahead.append(batch)
            if len(ahead) > self.depth:
                yield ahead.pop(0)
        yield from ahead


def _pipe(collate: Any = None) -> sb.Pipeline:
    return sb.Pipeline(list(range(N))).batch(2, collate=collate)


def _loader(workers: int, **kw: Any) -> sb.Loader:
    collate = kw.pop("collate", None)
    return sb.Loader(
        _pipe(collate),
        num_workers=workers,
        max_batches=4,
        max_bytes="1MiB",
        timeout_s=60,
        **kw,
    )


def _reference(workers: int) -> list[int]:
    with _loader(workers) as loader:
        return [x for b in loader for x in ids_of(b)]


def _resume(workers: int, state: dict[str, Any], **kw: Any) -> list[int]:
    with _loader(workers, **kw) as fresh:
        fresh.load_state_dict(state)
        return [x for b in fresh for x in ids_of(b)]


# (the sizer runs in the loop's process without workers only: in a worker its error is a
# stage's, raised before the batch leaves the worker)
CASES = [
    (hook, workers)
    for hook in ("sink", "logger", "sizer", "device copy")
    for workers in (0, 2)
    if not (hook == "sizer" and workers)
]


@pytest.fixture
def hooked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Loader options whose hook raises on its third call (and the resuming Loader's)."""
    hook = request.param
    if hook == "sink":
        return {"log": sb.log_every(0.0, _raising_on(FAIL_AT))}, {}
    if hook == "logger":
        logger = logging.getLogger("tests.loader_log_sink")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        handler = _RaisingHandler(FAIL_AT)
        logger.addHandler(handler)
        request.addfinalizer(lambda: logger.removeHandler(handler))
        return {"log": sb.log_every(0.0, logger)}, {}
    if hook == "sizer":
        size_hook = _raising_on(FAIL_AT)
        nbytes.register(Box)(lambda b: size_hook(b) or 16 * len(b.items))

        def unregister() -> None:
            nbytes._registry.pop(Box, None)
            nbytes._cache.clear()
            nbytes._reset_exact()

        request.addfinalizer(unregister)
        return {"collate": Box}, {"collate": Box}
    assert hook == "device copy"
    monkeypatch.setattr(sb.loader, "DevicePrefetcher", LookAhead)
    monkeypatch.setattr(LookAhead, "copy", staticmethod(_raising_on(FAIL_AT + 2)))
    return {"device": "meta", "device_depth": 2}, {}


@pytest.mark.parametrize(("hooked", "workers"), CASES, indirect=["hooked"])
def test_a_checkpoint_after_a_hook_raised_in_the_hand_over_resumes_exactly(
    hooked: Any, workers: int, request: pytest.FixtureRequest
) -> None:
    opts, resume_opts = hooked
    received: list[int] = []
    loader = _loader(workers, **opts)
    try:
        for b in loader:  # the user's loop catches the hook's error and saves
            received += ids_of(b)
    except HookDown:
        state = loader.state_dict()
    else:
        pytest.fail("the hook never raised")
    finally:
        loader.close()
    rest = _resume(workers, state, **resume_opts)
    counted_once(received + rest, range(N))
    assert received + rest == _reference(workers)
    if request.node.callspec.params["hooked"] == "sink":
        # the sink runs once a batch is counted: its error comes in place of that batch
        assert len(received) == 2 * (FAIL_AT - 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_while_batches_are_copied_ahead_holds_only_the_received(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sb.loader, "DevicePrefetcher", LookAhead)
    _check_a_state_taken_after_five(workers, "meta", ids_of)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_with_device_prefetch_holds_only_the_received(workers: int) -> None:
    def on_device(b: Any) -> list[int]:
        assert b.is_cuda
        return ids_of(b.cpu())

    _check_a_state_taken_after_five(workers, "cuda", on_device)


def _check_a_state_taken_after_five(workers: int, device: str, ids: Any) -> None:
    """Batches copied 3 ahead to ``device``: a state taken after the 5th received holds
    those 5 only; the resume delivers the rest, as the uninterrupted run."""
    received: list[int] = []
    with _loader(workers, device=device, device_depth=3) as loader:
        for i, b in enumerate(loader):
            received += ids(b)
            if i == 4:
                state = loader.state_dict()
                break
    rest = _resume(workers, state)
    counted_once(received + rest, range(N))
    assert received + rest == _reference(workers)
