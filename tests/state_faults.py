"""Corruptions of a saved state, one field at a time, for the state-validation tests.

``corruptions(state)`` walks every field of a real state and yields a ``Fault``:
each dict key deleted (but entries of
the per-shard maps ``FREE_KEYS``), each value replaced by one of another type, each int made
negative, and each *index* (a field whose range the state bounds: ranks, workers, shard
numbers, lanes) made too large. ``field_faults(state)`` adds bad values of every kind of
field, also those a real state leaves empty or null (``names`` runs, ``before``'s claims,
their keys, sets and groups, fetch and resume hints, a ``seen`` cursor), each of another
type, below its range, at its upper bound (an off-by-one) or with a key missing or
unexpected. Every one must be refused by ``load_state_dict`` with a ``ValueError`` that
names the field (``Fault.names``; never a ``KeyError``/``IndexError``/``TypeError``, nor an
error later in a worker, nor silent acceptance).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, NamedTuple

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


class Fault(NamedTuple):
    """One corrupted state: ``label`` says what was changed; ``names`` is the text the
    ``ValueError`` must contain: the bad field's path (its parent's, for a deleted key)."""

    label: str
    names: str
    state: dict[str, Any]


def _where(path: Path) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


def _run(state: dict[str, Any], **change: Any) -> list[Any]:
    """A names run ``[prefix, suffix, width, start, step, count]`` that fits the state,
    with ``change`` (by field name) applied."""
    run = {"prefix": "s", "suffix": ".tar", "width": 4, "start": 0, "step": 1}
    run["count"] = max(1, state["shards"])
    run.update(change)
    return list(run.values())


def field_faults(state: dict[str, Any]) -> Iterator[Fault]:
    """Bad values for every kind of field, also those a real state leaves empty or null
    (``names``, ``before``'s claims, sets and groups, hints, a ``seen`` cursor): of
    another type, below its range, at or above its range (the exact bound: an
    off-by-one), a key missing or unexpected. Each one is put into an otherwise valid
    state, so only the field's own check can refuse it."""
    state = {k: v for k, v in state.items() if k != "digest"}
    shards, slots = state["shards"], len(state["workers"])
    world = state["layout"]["world_size"]

    def at(path: Path, value: Any, names: Path | str | None = None) -> Fault:
        shown = names if isinstance(names, str) else _where(names if names else path)
        return Fault(f"{_where(path)} = {value!r}", shown, _set(state, path, value))

    # the top level
    yield at(("epoch",), -1)
    yield at(("version",), 2, "state version 2")
    yield at(("kind",), "streambuf.other", "kind='streambuf.state'")
    yield at(("seed",), 1 << 64)
    yield at(("seed",), -(1 << 63) - 1)
    yield at(("shards",), -1)
    yield at(("fingerprint",), None)
    yield at(("complete",), 0)
    yield at(("digest",), 5)
    yield at(("next_worker",), slots)  # one past the last worker
    yield at(("next_worker",), -1)
    yield at(("workers",), [*state["workers"], None])  # one more than num_workers
    yield Fault("state['extra'] added", "state: unexpected keys ['extra']", {**state, "extra": 1})
    # layout
    yield at(("layout", "world_size"), 0)
    yield at(("layout", "rank"), world)
    yield at(("layout", "rank"), -1)
    yield at(("layout", "num_workers"), -1)
    yield at(("layout", "in_order"), 1)
    yield at(("layout",), {**state["layout"], "extra": 1}, "state['layout']: unexpected keys")
    # names: a list of shard names, or runs [prefix, suffix, width, start, step, count]
    yield at(("names",), "s0000.tar")
    yield at(("names",), [7], ("names", 0))
    yield at(("names",), [_run(state)[:5]], ("names", 0))  # a run without its count
    yield at(("names",), [[]], ("names", 0))
    yield at(("names",), [[*_run(state), 1]], ("names", 0))
    for field, i, bad in [
        ("prefix", 0, 5),
        ("suffix", 1, None),
        ("width", 2, 0),
        ("width", 2, 65),
        ("width", 2, "4"),
        ("start", 3, -1),
        ("step", 4, 2),
        ("step", 4, 0),
        ("step", 4, True),
        ("count", 5, 0),
        ("count", 5, -3),
        ("count", 5, 1 << 31),
    ]:
        yield at(("names",), ["a.tar", _run(state, **{field: bad})], ("names", 1, i))
    # before: the progress of an earlier elastic resume (claims, sets, pending, groups)
    claim = [1, 0, None, None]  # stride, offset, upto (None: to the end), hint
    ok = {"claims": {"0": [claim]}, "sets": {"0": [0]}, "pending": [[0, 0, None]]}

    def before(field: str, value: Any, names: Path | str) -> Fault:
        return at(("before",), {**ok, field: value}, names)

    yield at(("before",), [], ("before",))
    for key in ("claims", "sets", "pending"):
        missing = {k: v for k, v in ok.items() if k != key}
        yield at(("before",), missing, f"state['before']: the key {key!r} is missing")
    yield before("extra", 1, "state['before']: unexpected keys ['extra']")
    for field, value in (("claims", [claim]), ("sets", {"0": [0]})):
        for key, says in [
            ("-1", ": key '-1'"),
            (str(shards), f" key '{shards}'"),
            (str(10**6), " key '1000000'"),
            ("x", ": key 'x'"),
            ("1.5", ": key '1.5'"),
            ("", ": key ''"),
        ]:
            yield before(field, {key: value}, f"state['before'][{field!r}]{says}")
        yield before(field, {0: value}, f"state['before'][{field!r}]: key 0")
        yield before(field, [value], ("before", field))
    yield before("sets", {"0": [-1]}, ("before", "sets", "0", 0))
    yield before("sets", {"0": ["1"]}, ("before", "sets", "0", 0))
    yield before("sets", {"0": 1}, ("before", "sets", "0"))
    claims: Path = ("before", "claims", "0")
    yield before("claims", {"0": claim}, (*claims, 0))  # an entry, not a list of them
    for bad, names in [
        ([0, 0, None, None], (*claims, 0, 0)),  # stride 0
        ([-1, 0, None, None], (*claims, 0, 0)),
        (["1", 0, None, None], (*claims, 0, 0)),
        ([1, -1, None, None], (*claims, 0, 1)),
        ([1, 0, -1, None], (*claims, 0, 2)),
        ([1, 0, "2", None], (*claims, 0, 2)),
        ([1, 0, None, -1], (*claims, 0, 3)),
        ([1, 0, None, "x"], (*claims, 0, 3)),
        ([1, 0, None, {"done": [-1]}], (*claims, 0, 3, "done", 0)),
        ([1, 0, None, {"done": 3}], (*claims, 0, 3, "done")),
        ([1, 0, None, {}], f"{_where((*claims, 0, 3))}: the key 'done' is missing"),
        ([1, 0, None], (*claims, 0)),
        ([1, 0, None, None, 0], (*claims, 0)),
    ]:
        yield before("claims", {"0": [bad]}, names)
    for row, names in _rows(shards, ("before", "pending", 0)):
        yield before("pending", [row], names)
    for bad, names in _groups(shards, ("groups",)):
        yield before("groups", bad, ("before", *names))
    # a worker's snapshot
    for w, snap in enumerate(state["workers"]):
        if snap is None:
            continue
        wp: Path = ("workers", w)
        yield at((*wp, "pass"), -1)
        yield at((*wp, "produced"), "1")
        yield at((*wp, "last"), None)
        yield at((*wp, "stages"), {**snap["stages"], "x": {"value": 1}}, (*wp, "stages"))
        yield at(wp, {**snap, "extra": 1}, f"{_where(wp)}: unexpected keys ['extra']")
        source = snap["source"]
        if "mix" in source:
            mix = (*wp, "source", "mix")
            yield at((*mix, "done"), [1] * len(source["mix"]["done"]), (*mix, "done", 0))
            yield at((*mix, "restarts"), [-1], (*mix, "restarts", 0))
            yield at((*mix, "taken_pass"), ["0"], (*mix, "taken_pass", 0))
            yield at((*wp, "pending"), [[shards, 0, 0, None]], (*wp, "pending", 0, 0))
            yield at((*wp, "pending"), [[0, -1, 0, None]], (*wp, "pending", 0, 1))
            yield at((*wp, "pending"), [[0, 0, 0, 5]], (*wp, "pending", 0, 3))
            yield at((*wp, "pending"), [[0, 0, 0, None, [-1]]], (*wp, "pending", 0, 4, 0))
            yield at((*wp, "groups"), [[[0, 0]]], (*wp, "groups", 0, 0))
            yield at((*wp, "groups"), [[[0, 0, -1]]], (*wp, "groups", 0, 0, 2))
            yield at((*wp, "groups"), [[]], (*wp, "groups", 0))
            continue
        for row, names in _rows(shards, ("pending", 0)):
            yield at((*wp, "pending"), [row], (*wp, *names))
        for bad, names in _groups(shards, ("groups",)):
            yield at((*wp, "groups"), bad, (*wp, *names))
        cur: Path = (*wp, "source")
        lanes = source["lanes"]
        yield at((*cur, "lanes"), [], (*cur, "lanes"))
        yield at((*cur, "next_lane"), len(lanes))  # one past the last lane
        yield at(cur, {"lanes": lanes}, f"{_where(cur)}: expected exactly one of")
        both = {"lanes": lanes, "next_lane": 0, "seen": [0, []]}
        yield at(cur, both, f"{_where(cur)}: expected exactly one of")
        for bad, inner in [([-1, [0]], (0,)), ([0, [-1]], (1, 0)), ([0], ()), ([0, 0], (1,))]:
            yield at(cur, {"lanes": lanes, "seen": bad}, (*cur, "seen", *inner))
        lane = (*cur, "lanes", 0)
        for bad, inner in [
            ([shards, 0, None], (0,)),  # one past the last shard
            ([0, -1, None], (1,)),
            ([0, 0, -1], (2,)),
            ([0, 0, "x"], (2,)),
            ([0, 0, {"done": [-1]}], (2, "done", 0)),
            ([0, 0, {"done": [0], "x": 1}], (2,)),
            ([0, 0], ()),
        ]:
            yield at((*cur, "lanes"), [bad], (*lane, *inner))
        for k, stage in snap["stages"].items():
            if "pool" not in stage:
                continue
            sp: Path = (*wp, "stages", k)
            for field in ("pool", "emitted"):
                yield at((*sp, field), [[shards, 0]], (*sp, field, 0, 0))
                yield at((*sp, field), [[0, -1]], (*sp, field, 0, 1))
                yield at((*sp, field), [[0]], (*sp, field, 0))
                yield at((*sp, field), [0], (*sp, field, 0))
            yield at((*sp, "counter"), None)
            yield at(sp, {**stage, "x": 1}, f"{_where(sp)}: unexpected keys ['x']")


def _rows(shards: int, path: Path) -> Iterator[tuple[list[Any], Path]]:
    """Bad pending rows ``[shard, index, fetch hint, (settled children)]`` and the path
    (below ``path``, the row's) each must be refused at."""
    yield [shards, 0, None], (*path, 0)  # one past the last shard
    yield [-1, 0, None], (*path, 0)
    yield ["0", 0, None], (*path, 0)
    yield [0, -1, None], (*path, 1)
    yield [0, 0, 5], (*path, 2)  # a fetch hint is null or a byte range
    yield [0, 0, "x"], (*path, 2)
    yield [0, 0, [5]], (*path, 2)
    yield [0, 0, [0, 5, 9]], (*path, 2)
    yield [0, 0, [-1, 5]], (*path, 2, 0)
    yield [0, 0, [0, "5"]], (*path, 2, 1)
    yield [0, 0, None, [-1]], (*path, 3, 0)
    yield [0, 0, None, 3], (*path, 3)
    yield [0, 0], path
    yield [0, 0, None, [], 1], path


def _groups(shards: int, path: Path) -> Iterator[tuple[Any, Path]]:
    """Bad ``groups`` (each a list of the positions ``[shard, index]`` of a partly
    delivered group) and the path each must be refused at."""
    yield {}, path
    yield [[]], (*path, 0)
    yield [[[shards, 0]]], (*path, 0, 0, 0)  # one past the last shard
    yield [[[0, 0], [10**6, 0]]], (*path, 0, 1, 0)
    yield [[[-1, 0]]], (*path, 0, 0, 0)
    yield [[[0, -1]]], (*path, 0, 0, 1)
    yield [[[0]]], (*path, 0, 0)
    yield [[[0, 0, 0]]], (*path, 0, 0)
    yield [[0]], (*path, 0, 0)


# fields checked before the schema, by a message of their own
_OWN_MESSAGE: dict[Path, str] = {("kind",): "kind", ("version",): "version"}


def corruptions(state: dict[str, Any]) -> Iterator[Fault]:
    """See the module docstring. The states yielded carry no ``digest`` (a state saved
    before digests): the field checks themselves must refuse each fault (the digest
    would refuse any edit; ``tests/test_dcp.py`` tests it on its own)."""
    state = {k: v for k, v in state.items() if k != "digest"}
    for path, value in _leaves(state):
        if not path:
            continue
        where = _where(path)
        if isinstance(path[-1], str) and not any(_matches(path, p) for p in FREE_KEYS):
            # named by its dict (a cursor, a stage's state, the stages map: by their rule)
            missing = _OWN_MESSAGE.get(path, f"{_where(path[:-1])}: ")
            yield Fault(f"{where}: deleted", missing, _set(state, path, None, delete=True))
        names = _OWN_MESSAGE.get(path, where)
        for bad in _other_type(value):
            yield Fault(f"{where} = {bad!r}", names, _set(state, path, bad))
        if isinstance(value, int) and not isinstance(value, bool) and path != ("seed",):
            yield Fault(f"{where} = -1", names, _set(state, path, -1))
        if any(_matches(path, p) for p in INDEX_PATHS):
            yield Fault(f"{where} = 10**6", names, _set(state, path, 10**6))
    if isinstance(state.get("workers"), list):
        short = _set(state, ("workers",), state["workers"][:-1])
        yield Fault("state['workers'] one short", "state['workers']", short)
