"""The shape of a saved state (``streambuf._state``), checked before anything uses it.

``validate(state, ...)`` accepts a state only if every field has its type and range
(``streambuf._schema``); otherwise one ``ValueError`` names the field's path, e.g.
``state["workers"][1]["source"]["lanes"][0][0]: expected an int in [0, 6), got 9``.
It runs in the main process at ``load_state_dict`` time, so a hand-edited or mismatched
state never reaches a worker.

Bounds come from the state itself (``shards``: shard indices; ``layout``: rank, the
``workers`` list length, ``next_worker``) and from the loading pipeline (``stages``: the
stage states: exactly the shuffles'). Inside a ``mix()`` state the sub-pipelines' snapshots are checked
for shape and sign only (their shard counts are not in the state). Hints (byte offsets,
byte ranges, a video's done clips) are checked for shape; whether an offset is inside
its file is only known when it is read.
"""

from __future__ import annotations

import functools
from typing import Any

from ._schema import (
    Anything,
    Bool,
    Choice,
    Dict,
    Env,
    Int,
    Lazy,
    List,
    Lit,
    MapOf,
    OneOf,
    Opt,
    Scoped,
    Spec,
    Str,
    fail,
)

__all__ = ["validate"]

UNBOUNDED = 1 << 62


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


FETCH_HINT = OneOf(  # how to fetch a pending sample: nothing, or its byte range
    "a fetch hint (null or a byte range [start, end])",
    (lambda v: v is None, Lit(None)),
    (lambda v: isinstance(v, list), List(Int(0), min_len=2, max_len=2)),
)
RESUME_HINT = OneOf(  # where a cursor's next sample starts
    "a resume hint (null, a byte offset or {'done': [clip indices]})",
    (lambda v: v is None, Lit(None)),
    (_is_int, Int(0)),
    (lambda v: isinstance(v, dict), Dict({"done": List(Int(0))})),
)
POS = List(Int(0), items=[Int(0, "shards")], min_len=2)
ROW = List(items=[Int(0, "shards"), Int(0), FETCH_HINT, List(Int(0))], min_len=3)
# partly delivered flattened groups: each the positions of its samples (``Ledger.groups``);
# a mix's positions are (source, restart, *position)
GROUPS = List(List(List(items=[Int(0, "shards"), Int(0)], min_len=2, max_len=2), min_len=1))
MIX_GROUPS = List(List(List(Int(0), min_len=3), min_len=1))


class MixRow(Spec):
    """A mixed pipeline's pending row: ``[source, *position, hint, (settled)]``."""

    def check(self, value: Any, path: str, env: Env) -> None:
        if not isinstance(value, list) or len(value) < 3:
            raise fail(path, "a list [source, *position, hint, (settled children)]", value)
        body = value[:-1] if isinstance(value[-1], list) else value
        if isinstance(value[-1], list):
            List(Int(0)).check(value[-1], f"{path}[{len(value) - 1}]", env)
        if len(body) < 3:
            raise fail(path, "a list [source, *position, hint, (settled children)]", value)
        FETCH_HINT.check(body[-1], f"{path}[{len(body) - 1}]", env)
        Int(0, "shards").check(body[0], f"{path}[0]", env)
        for i in range(1, len(body) - 1):
            Int(0).check(body[i], f"{path}[{i}]", env)


class Cursor(Spec):
    """A source's lanes cursor: ``lanes`` and exactly one of ``next_lane``/``seen``."""

    LANE = Opt(List(items=[Int(0, "shards"), Int(0), RESUME_HINT], min_len=3))
    SPEC = Dict(
        {"lanes": List(LANE, min_len=1)},
        optional={"next_lane": Int(0), "seen": List(items=[Int(0), List(Int(0))], min_len=2)},
    )

    def check(self, value: Any, path: str, env: Env) -> None:
        self.SPEC.check(value, path, env)
        if ("next_lane" in value) == ("seen" in value):
            raise ValueError(f"{path}: expected exactly one of 'next_lane' and 'seen'")
        if "next_lane" in value:
            Int(0, len(value["lanes"])).check(value["next_lane"], f"{path}['next_lane']", env)


SHUFFLE = Dict({"counter": Int(0), "pool": List(POS), "emitted": List(POS)})
USER_STAGE = Dict({"value": Anything()})  # streambuf.Stage with owns_state: the user's value
STAGE = OneOf(
    "a stage's state (a shuffle's, or a user stage's {'value': ...})",
    (lambda v: isinstance(v, dict) and "counter" in v, SHUFFLE),
    (lambda v: isinstance(v, dict) and "value" in v, USER_STAGE),
)


class Snapshot(Spec):
    """A worker's snapshot (``streambuf._iteration``): ``stage_keys`` are the stages
    that keep a state (the shuffles; None: unknown, a mix's sub-pipeline). A snapshot
    whose pass has not opened (``source`` null) has none; an open one has all."""

    def __init__(self, mix: bool, stage_keys: tuple[str, ...] | None) -> None:
        self.stage_keys = stage_keys
        source: Spec = Cursor()
        if mix:
            sub = Scoped(Lazy(lambda: Snapshot(False, None)), shards=UNBOUNDED)
            mixed = Dict(
                {
                    "mix": Dict(
                        {
                            "counter": Int(0),
                            "done": List(Bool()),
                            "restarts": List(Int(0)),
                            "taken_pass": List(Int(0)),
                            "subs": List(sub),
                        }
                    )
                }
            )
            source = OneOf("a mix cursor", (lambda v: isinstance(v, dict) and "mix" in v, mixed))
        self.spec = Dict(
            {
                "pass": Int(0),
                "produced": Int(0),
                "last": Bool(),
                "source": Opt(source),
                "pending": List(MixRow() if mix else ROW),
                "stages": MapOf(Int(0), STAGE),
            },
            optional={"groups": MIX_GROUPS if mix else GROUPS},
        )

    def check(self, value: Any, path: str, env: Env) -> None:
        self.spec.check(value, path, env)
        if self.stage_keys is None:
            return
        want = set(self.stage_keys) if value["source"] is not None else set()
        have = set(value["stages"])
        if have != want:
            missing, extra = sorted(want - have), sorted(have - want)
            raise ValueError(
                f"{path}['stages']: expected the states of stages {sorted(want)} (this "
                f"pipeline's shuffles and stateful stages, once its source is open); "
                f"missing {missing}, "
                f"unexpected {extra}"
            )


PROGRESS = Dict(
    {
        "claims": MapOf(
            Int(0, "shards"),
            List(List(items=[Int(1), Int(0), Opt(Int(0)), RESUME_HINT], min_len=4)),
        ),
        "sets": MapOf(Int(0, "shards"), List(Int(0))),
        "pending": List(ROW),
    },
    optional={"groups": GROUPS},
)
NAME = OneOf(
    "a shard name or a run [prefix, suffix, width, start, step, count]",
    (lambda v: isinstance(v, str), Str()),
    (
        lambda v: isinstance(v, list),
        List(items=[Str(), Str(), Int(1, 65), Int(0), Choice(1, -1), Int(1, 1 << 31)], min_len=6),
    ),
)
LAYOUT = Dict(  # world_size first: the bound of rank
    {"world_size": Int(1), "rank": Int(0, "world"), "num_workers": Int(0), "in_order": Bool()}
)


@functools.lru_cache(maxsize=64)
def _state_spec(mix: bool, stage_keys: tuple[str, ...]) -> Dict:
    return Dict(
        {
            "version": Lit(1),
            "kind": Lit("streambuf.state"),
            "epoch": Int(0),
            "seed": Int(-(1 << 63), 1 << 64),
            "shards": Int(0),
            "fingerprint": Str(),
            "names": Opt(List(NAME)),
            "layout": LAYOUT,
            "workers": List(Opt(Snapshot(mix, stage_keys)), length="slots"),
            "next_worker": Int(0, "slots"),
            "complete": Bool(),
            "before": Opt(PROGRESS),
        },
        optional={"digest": Str()},  # states saved before it had none
    )


def _int(v: Any) -> int:
    return v if _is_int(v) else 0  # a bad value is reported where it is, before its use


def validate(state: Any, *, stage_keys: tuple[str, ...], mix: bool, path: str = "state") -> None:
    """Raise ``ValueError`` naming the first field of ``state`` that does not fit;
    ``stage_keys``: the loading pipeline's stages that keep a state (``"k"``: stage k)."""
    if not isinstance(state, dict):
        raise fail(path, "a dict", state)
    layout = state.get("layout")
    layout = layout if isinstance(layout, dict) else {}
    env = {
        "shards": _int(state.get("shards")),
        "world": _int(layout.get("world_size")),
        "slots": max(1, _int(layout.get("num_workers"))),
    }
    _state_spec(mix, stage_keys).check(state, path, env)
