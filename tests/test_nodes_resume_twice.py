"""streambuf.nodes saved again soon after a resume: ``state_dict()`` taken after one item
of a resumed node, before it has pulled again everything its first state said to skip,
must not lose those skips (they would be delivered twice) nor anything else. Save, load
into a fresh node, take one item, save again, load that into a fresh node: the
concatenation is exactly the uninterrupted stream (in order, or as a multiset for
as-ready delivery). A gated source holds the resumed node's threads in ``next()`` so the
second state is taken while the skips are still outstanding, deterministically."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from torchdata.nodes import BaseNode

import streambuf as sb
from tests.nodes_data import FACTORIES, ids

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_thread_leak")]


def _rt(state: Any) -> Any:
    return json.loads(json.dumps(state))


def _stop(node: Any) -> None:
    down = getattr(node, "shutdown", None)
    if down is not None:
        down()


@pytest.mark.parametrize("k", [1, 5, 13])
@pytest.mark.parametrize("graph", sorted(FACTORIES))
def test_a_second_save_right_after_a_resume(graph: str, k: int) -> None:
    factory, ordered = FACTORIES[graph]
    ref_node = factory()
    ref_node.reset()
    ref = [ids(x) for x in ref_node]
    _stop(ref_node)
    first = factory()
    first.reset()
    head = [ids(next(first)) for _ in range(k)]
    s1 = _rt(first.state_dict())
    _stop(first)
    second = factory()
    second.reset(s1)
    one = [ids(next(second))]
    s2 = _rt(second.state_dict())
    _stop(second)
    third = factory()
    third.reset(s2)
    rest = [ids(x) for x in third]
    _stop(third)
    got = head + one + rest
    if ordered:
        assert got == ref
    else:
        assert sorted(map(repr, got)) == sorted(map(repr, ref))


class Gated(BaseNode[int]):
    """``range(n)``; ``next()`` for index ``>= gate_at`` waits until ``gate`` is set."""

    def __init__(self, n: int, gate_at: int | None = None) -> None:
        super().__init__()
        self.n, self.gate_at = n, gate_at
        self.gate = threading.Event()
        self.i = 0

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self.i = 0 if initial_state is None else int(initial_state["i"])

    def next(self) -> int:
        if self.gate_at is not None and self.i >= self.gate_at:
            assert self.gate.wait(10), "gate never opened"
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}


class HoldZero:
    """Holds item 0 on its thread until released: the items after it are delivered ahead."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, x: int) -> int:
        if x == 0:
            self.release.wait(10)
        return x


def _mapper(src: BaseNode, fn: Any, *, prefetch: bool) -> BaseNode:
    node: BaseNode = sb.nodes.ParallelMapper(src, fn, threads=3, max_bytes="1MiB", in_order=False)
    if prefetch:
        node = sb.nodes.Prefetcher(node, max_items=2, max_bytes="1MiB")
    return node


@pytest.mark.parametrize("prefetch", [False, True], ids=["mapper", "mapper-prefetcher"])
def test_skips_still_outstanding_at_the_second_save_are_kept(prefetch: bool) -> None:
    n = 20
    hold = HoldZero()
    first = _mapper(Gated(n), hold, prefetch=prefetch)
    first.reset()
    head = [next(first) for _ in range(4)]  # 0 is held back: 4 items delivered ahead of it
    assert 0 not in head
    s1 = _rt(first.state_dict())
    hold.release.set()
    _stop(first)
    src = Gated(n, gate_at=1)  # the resumed node pulls 0, then waits in the source
    second = _mapper(src, lambda x: x, prefetch=prefetch)
    second.reset(s1)
    one = [next(second)]
    assert one == [0]
    s2 = _rt(second.state_dict())  # the skipped items are not pulled again yet
    src.gate.set()
    _stop(second)
    third = _mapper(Gated(n), lambda x: x, prefetch=prefetch)
    third.reset(s2)
    rest = list(third)
    _stop(third)
    assert sorted(head + one + rest) == list(range(n)), (head, one, rest, s2)
