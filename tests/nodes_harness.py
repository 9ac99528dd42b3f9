"""torchdata's save/load contract for a node, checked through ``torchdata.nodes.Loader``
(our own equivalent of ``run_test_save_load_state`` in torchdata's test/nodes/utils.py).

``check_save_load(node, midpoint)`` runs two epochs through a ``Loader`` saving four
states (before the first item, after ``midpoint`` items of epoch 0, at the end of epoch
0, after ``midpoint`` items of epoch 1), then checks that loading each one continues
exactly as the uninterrupted run did:

* mid-epoch 0 -> the rest of epoch 0, then the whole of epoch 1;
* mid-epoch 1 -> the rest of epoch 1;
* the initial state -> epoch 0 again, then epoch 1;
* the end of epoch 0 -> nothing with ``restart_on_stop_iteration=False``; epoch 1 with
  the default (the Loader restarts an exhausted iterator).

Every state goes through ``json.dumps``/``json.loads`` first when ``json_states`` (the
checkpoint is a file). ``ordered=False`` (as-ready delivery) compares multisets: the
items after a resume must be exactly those the saved run had not delivered yet.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from torchdata.nodes import Loader


def _take(it: Any, n: int) -> list[Any]:
    return [next(it) for _ in range(n)]


def check_save_load(
    node: Any,
    midpoint: int,
    *,
    ordered: bool = True,
    json_states: bool = True,
    key: Callable[[Any], Any] = lambda x: x,
) -> None:
    def same(got: list[Any], want: list[Any], what: str) -> None:
        got, want = [key(x) for x in got], [key(x) for x in want]
        if ordered:
            assert got == want, f"{what}: {got} != {want}"
        else:
            assert Counter(map(repr, got)) == Counter(map(repr, want)), f"{what}: {got} vs {want}"

    def saved(state: dict[str, Any]) -> dict[str, Any]:
        return json.loads(json.dumps(state)) if json_states else state

    loader = Loader(node)
    initial = saved(loader.state_dict())
    it = iter(loader)
    epoch0 = _take(it, midpoint)
    mid0 = saved(loader.state_dict())
    epoch0 += list(it)
    end0 = saved(loader.state_dict())
    assert len(epoch0) > midpoint, "the epoch must be longer than the midpoint"

    it = iter(loader)
    epoch1 = _take(it, midpoint)
    mid1 = saved(loader.state_dict())
    epoch1 += list(it)

    loader.load_state_dict(mid0)
    same(list(loader), epoch0[midpoint:], "resumed mid-epoch 0")
    same(list(loader), epoch1, "the epoch after a resume")

    loader.load_state_dict(mid1)
    same(list(loader), epoch1[midpoint:], "resumed mid-epoch 1")

    loader.load_state_dict(initial)
    same(list(loader), epoch0, "resumed from the initial state")
    same(list(loader), epoch1, "the epoch after that")

    no_restart = Loader(node, restart_on_stop_iteration=False)
    no_restart.load_state_dict(end0)
    assert list(no_restart) == [], "resumed at the end of epoch 0 without restart"

    restart = Loader(node)
    restart.load_state_dict(end0)
    same(list(restart), epoch1, "resumed at the end of epoch 0, restarted")
