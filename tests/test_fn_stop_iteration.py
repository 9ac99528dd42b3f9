"""A ``StopIteration`` raised by a user function is an error, never the end of the stream.

Every stage that calls a function per item (``map`` on one thread, which is the built-in
``map``; on threads; ``"auto"``; ``filter``; a bare
``ThreadPrefetcher``; the torchdata.nodes mapper: tests/test_nodes.py) must raise it as a ``RuntimeError`` naming the stage and the item:
let through, the built-in ``map`` takes it as the end, and an epoch ends early with no
error (a Loader with 2 workers delivered 56 of 100 samples).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

import streambuf as sb
from streambuf.prefetch import ThreadPrefetcher

BAD = 13


def _fn(x: int) -> int:
    if x == BAD:
        raise StopIteration("from fn")
    return x


def _keep(x: int) -> bool:
    return _fn(x) >= 0


STAGES: dict[str, Any] = {
    "map, one thread": lambda p: p.map(_fn),
    "map, two threads": lambda p: p.map(_fn, threads=2),
    "map, auto": lambda p: p.map(_fn, threads="auto"),
    "filter": lambda p: p.filter(_keep),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", list(STAGES))
def test_in_a_pipeline_it_raises_naming_the_stage(stage: str) -> None:
    pipe = STAGES[stage](sb.Pipeline(list(range(100))))
    with pytest.raises(RuntimeError, match="raised StopIteration") as got:
        list(pipe)
    notes = "\n".join(getattr(got.value, "__notes__", ()))
    assert "_fn" in notes or "_keep" in notes, notes
    assert str(BAD) in notes, notes
    assert isinstance(got.value.__cause__, StopIteration)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, "auto"])
def test_in_loader_workers_it_raises_instead_of_ending_the_epoch(threads: Any) -> None:
    pipe = sb.Pipeline(list(range(100))).map(_fn, threads=threads).batch(4)
    loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="4MiB", timeout_s=60)
    got: list[int] = []
    try:
        with pytest.raises(RuntimeError, match="raised StopIteration"):
            for batch in loader:
                assert isinstance(batch, torch.Tensor)
                got.extend(batch.tolist())
    finally:
        loader.close()
    assert BAD not in got


@pytest.mark.timeout(60)
def test_a_bare_thread_prefetcher_raises_it_too() -> None:
    pf = ThreadPrefetcher(iter(range(50)), max_items=4, max_bytes="1MiB", threads=2, fn=_fn)
    got: list[BaseException] = []

    def drain() -> None:
        try:
            list(pf)
        except BaseException as exc:  # (what the consumer saw, whatever it is)
            got.append(exc)

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    th.join(10)  # let through, the lane's StopIteration left the consumer waiting
    assert not th.is_alive(), "the consumer still waits 10 s after fn raised StopIteration"
    pf.close()
    assert len(got) == 1 and isinstance(got[0], RuntimeError), got
    assert "raised StopIteration" in str(got[0])


@pytest.mark.timeout(60)
def test_a_thread_prefetcher_running_inline_raises_it_too() -> None:
    """Inline (``adaptive``: the consumer runs ``fn``), the same error and note, not
    PEP 479's bare "generator raised StopIteration"."""
    from streambuf._inline import InlineChooser

    pf = ThreadPrefetcher(
        iter(range(50)), max_items=4, max_bytes="1MiB", threads=2, fn=_fn, adaptive=True
    )
    pf.chooser = InlineChooser(32, start_inline=True)
    with pytest.raises(RuntimeError, match="fn raised StopIteration") as got:
        list(pf)
    assert pf.inline_items == BAD  # it ran inline, up to the bad item
    assert "inline, in the consumer" in "\n".join(getattr(got.value, "__notes__", ()))
