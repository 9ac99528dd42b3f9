"""Corruptions of a saved state, one field at a time, for the state-validation tests.

``corruptions(state)`` walks every field of a real state and yields ``(label, bad)``:
each dict key deleted (but entries of
the per-shard maps ``FREE_KEYS``), each value replaced by one of another type, each int made
negative, and each *index* (a field whose range the state bounds: ranks, workers, shard
numbers, lanes) made too large. Every one must be refused by ``load_state_dict`` with a
``ValueError`` (never a ``KeyError``/``IndexError``/``TypeError``, nor an error later
in a worker, nor silent acceptance).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

Path = tuple[Any, ...]

# paths (dict keys as str, list positions as int; "*" any) whose value is an index
INDEX_PATHS = [
    ("layout", "rank"),
    ("next_worker",),
    ("workers", "*", "source", "lanes", "*", 0),
    ("workers", "*", "source", "next_lane"),
    ("workers", "*", "pending", "*", 0),
    ("workers", "*", "stages", "*", "pool", "*", 0),
    ("workers", "*", "stages", "*", "emitted", "*", 0),
    ("before", "pending", "*", 0),
]


# maps whose entries may come and go in a valid state (one entry per shard with
# progress): deleting an entry is another valid state, not detectable without a checksum
FREE_KEYS = [("before", "claims", "*"), ("before", "sets", "*")]
# and the digest: a state without one is a state saved before digests (it loads)
FREE_KEYS.append(("digest",))


def _leaves(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))


def _matches(path: Path, pattern: Path) -> bool:
    return len(path) == len(pattern) and all(p == "*" or p == x for x, p in zip(path, pattern))


def _set(state: dict[str, Any], path: Path, value: Any, *, delete: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(state)
    node = out
    for step in path[:-1]:
        node = node[step]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def _other_type(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return [1, "true"]
    if isinstance(value, int):
        return ["7", True, 1.5]
    if isinstance(value, str):
        return [12345]
    if value is None:
        return ["x"]
    return ["x", 3]  # a list or a dict


def corruptions(state: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """See the module docstring. The states yielded carry no ``digest`` (a state saved
    before digests): the field checks themselves must refuse each fault (the digest
    would refuse any edit; ``tests/test_dcp.py`` tests it on its own)."""
    state = {k: v for k, v in state.items() if k != "digest"}
    for path, value in _leaves(state):
        if not path:
            continue
        where = "state" + "".join(f"[{p!r}]" for p in path)
        if isinstance(path[-1], str) and not any(_matches(path, p) for p in FREE_KEYS):
            yield f"{where}: deleted", _set(state, path, None, delete=True)
        for bad in _other_type(value):
            yield f"{where} = {bad!r}", _set(state, path, bad)
        if isinstance(value, int) and not isinstance(value, bool) and path != ("seed",):
            yield f"{where} = -1", _set(state, path, -1)
        if any(_matches(path, p) for p in INDEX_PATHS):
            yield f"{where} = 10**6", _set(state, path, 10**6)
    if isinstance(state.get("workers"), list):
        yield "state['workers'] one short", _set(state, ("workers",), state["workers"][:-1])
