"""``Progress``: which samples an earlier run delivered, for a resume at a new layout.

A run of ``world_size x num_workers`` slots saved, for each slot, its source cursors
and its pending samples (``streambuf._iteration``). Under another layout (other
``num_workers`` or world size, or ``in_order=False`` where the old order cannot be
replayed) the remainder of the epoch is re-split: a new slot reads its own shards and
skips what is *done*. Per shard that is a set of **claims**, one per old slot that read
it: ``(stride, offset, upto, hint)`` = "the samples ``i >= offset`` with ``(i - offset) %
stride == 0`` and ``i < upto`` (``upto`` None: all) were handed out by that slot, and
``hint`` is where sample ``upto`` starts" minus the **pending** samples (handed out but
not delivered: they are delivered again, fetched by position), and the children already
delivered of partly delivered (flattened) samples.

A partly delivered output of a user stage made of several samples (a **group**,
``Ledger.groups``) can be finished only by the stage making it of the same samples again:
its samples are routed together to the slot whose share holds its first sample, and
handed out there first, in the group's order (``pending_for``); the fresh stage groups
them as before, and ``stages.Flatten`` refuses to skip children of a group it made of
other samples.

A state saved by a run that was itself resumed this way carries its ``Progress`` along
(``"before"``), so resuming twice, at two new layouts, still delivers each sample once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .sharding import assign, shard_order

__all__ = ["Progress"]

Claim = tuple[int, int, int | None, Any]  # stride, offset, upto (None: to the end), hint


class Progress:
    """Done samples per shard (see the module docstring); plain data via ``to_data``."""

    def __init__(self) -> None:
        self.claims: dict[int, list[Claim]] = {}
        self.sets: dict[int, set[int]] = {}  # explicit done indices (a video's clips)
        self.pending: dict[int, dict[int, list[Any]]] = {}  # shard -> index -> entry
        # partly delivered groups: (shard, index) of the first sample -> its samples
        self.groups: dict[tuple[int, int], list[list[int]]] = {}

    # -- building -----------------------------------------------------------------------
    def claim(self, shard: int, stride: int, offset: int, upto: int | None, hint: Any) -> None:
        self.claims.setdefault(shard, []).append((stride, offset, upto, hint))

    def claim_set(self, shard: int, indices: Iterable[int]) -> None:
        self.sets.setdefault(shard, set()).update(int(i) for i in indices)

    def add_pending(self, entry: Sequence[Any]) -> None:
        self.pending.setdefault(int(entry[0]), {})[int(entry[1])] = list(entry)

    def add_group(self, group: Sequence[Sequence[int]]) -> None:
        self.groups[(int(group[0][0]), int(group[0][1]))] = [[int(x) for x in p] for p in group]

    def _prune_groups(self) -> None:
        """Keep the groups still partly delivered: their first sample still pending."""
        self.groups = {k: g for k, g in self.groups.items() if k[1] in self.pending.get(k[0], {})}

    @classmethod
    def of_states(cls, pipe: Any, states: Sequence[dict[str, Any]]) -> Progress:
        """What the saved ranks of one run (``states``, one per rank) delivered."""
        before = states[0].get("before")
        prog = cls.from_data(before) if before is not None else cls()
        inherited = cls.from_data(before) if before is not None else None
        for state in states:
            layout = state["layout"]
            world, workers, rank = layout["world_size"], layout["num_workers"], layout["rank"]
            n = state["shards"]
            order = shard_order(
                n, seed=state["seed"], epoch=state["epoch"], shuffle=pipe._sharding.shuffle_shards
            )
            for w, snap in enumerate(state["workers"]):
                if snap is None:
                    continue
                a = assign(n, order, rank * workers + w, world * workers)
                if inherited is not None:  # what this slot owed from before and delivered
                    # past its first pass (equalize="pad" repeating) it delivered all it
                    # owed: its pending samples now are repeats, not the owed ones
                    rows = (snap.get("pending") or []) if snap.get("pass", 0) == 0 else []
                    still = {(int(p[0]), int(p[1])) for p in rows}
                    for row in inherited.pending_for(a.shards, a.stride, a.offset):
                        if (int(row[0]), int(row[1])) not in still:
                            prog.pending.get(int(row[0]), {}).pop(int(row[1]), None)
                prog._add_slot(list(a.shards), a.stride, a.offset, snap)
                for group in snap.get("groups") or []:
                    prog.add_group(group)
        prog._prune_groups()
        return prog

    def _add_slot(self, shards: list[int], stride: int, offset: int, snap: dict[str, Any]) -> None:
        if snap.get("pass", 0) > 0 or snap.get("last"):
            for shard in shards:  # the slot's stream is behind it (repeats and trims aside)
                self.claim(shard, stride, offset, None, None)
            return
        cursor = snap.get("source") or {}
        lanes = cursor.get("lanes") or []
        k = len(lanes)
        first_ready = "seen" in cursor
        open_at: dict[int, tuple[int, Any]] = {}
        for cur in lanes:
            if cur is not None:
                open_at[int(cur[0])] = (int(cur[1]), cur[2])
        for i, shard in enumerate(shards):
            if i in open_at:
                upto, hint = open_at[i]
                if isinstance(hint, dict) and "done" in hint:  # handed out in another order
                    self.claim_set(shard, hint["done"])
                else:
                    self.claim(shard, stride, offset, upto, hint)
            elif self._passed(i, k, lanes, first_ready, cursor):
                self.claim(shard, stride, offset, None, None)
        for entry in snap.get("pending") or []:
            self.add_pending(entry)

    @staticmethod
    def _passed(
        i: int, k: int, lanes: list[Any], first_ready: bool, cursor: dict[str, Any]
    ) -> bool:
        """Was slot-list shard ``i`` read to its end (and left) by its lane?"""
        if first_ready:  # seen and no longer any lane's: finished
            n, extra = cursor["seen"]
            return i < int(n) or i in extra
        lane = i % k if k else 0
        cur = lanes[lane] if k else None
        return cur is not None and int(cur[0]) > i

    # -- queries ------------------------------------------------------------------------
    def claimed(self, shard: int, index: int) -> bool:
        if index in self.sets.get(shard, ()):
            return True
        for stride, offset, upto, _ in self.claims.get(shard, ()):
            if (
                index >= offset
                and (index - offset) % stride == 0
                and (upto is None or index < upto)
            ):
                return True
        return False

    def done(self, shard: int, index: int) -> bool:
        """Was sample ``index`` of ``shard`` delivered?"""
        return self.claimed(shard, index) and index not in self.pending.get(shard, {})

    def shard_done(self, shard: int) -> bool:
        """Was every sample of ``shard`` delivered? (Its pending ones are fetched.)"""
        claims = [c for c in self.claims.get(shard, ()) if c[2] is None]
        if not claims:
            return False
        stride = claims[0][0]
        if any(c[0] != stride for c in claims):
            return False
        return {c[1] for c in claims} >= set(range(stride))

    def entry(self, shard: int) -> tuple[int, Any]:
        """Where to start reading ``shard``: past a whole-shard claim's end when nothing
        before it is left (pending samples are fetched on their own), else its start."""
        if shard in self.sets:  # the reader skips these itself
            return 0, {"done": sorted(self.sets[shard])}
        best: tuple[int, Any] = (0, None)
        for stride, offset, upto, hint in self.claims.get(shard, ()):
            if stride == 1 and offset == 0 and upto is not None and hint is not None:
                if upto > best[0]:
                    best = (upto, hint)
        return best

    def _share_rows(self, shards: Iterable[int], stride: int, offset: int) -> list[list[Any]]:
        out: list[list[Any]] = []
        for shard in shards:
            for index, row in sorted(self.pending.get(shard, {}).items()):
                if index >= offset and (index - offset) % stride == 0:
                    out.append(row)
        return out

    def groups_for(self, shards: Iterable[int], stride: int, offset: int) -> list[list[list[int]]]:
        """The groups the slot share ``(stride, offset)`` of ``shards`` finishes: those
        whose first sample is in it, in its order."""
        rows = self._share_rows(shards, stride, offset)
        return [self.groups[k] for r in rows if (k := (int(r[0]), int(r[1]))) in self.groups]

    def pending_for(self, shards: Iterable[int], stride: int, offset: int) -> list[list[Any]]:
        """The pending samples the slot share ``(stride, offset)`` of ``shards`` hands out
        again: the samples of the groups it finishes first (each group's together, in its
        order, wherever they are), then its own other pending samples."""
        rows = self._share_rows(shards, stride, offset)
        if not self.groups:
            return rows
        grouped = {(int(p[0]), int(p[1])) for g in self.groups.values() for p in g}
        out: list[list[Any]] = []
        for group in self.groups_for(shards, stride, offset):
            for p in group:
                row = self.pending.get(int(p[0]), {}).get(int(p[1]))
                if row is not None:
                    out.append(row)
        out += [r for r in rows if (int(r[0]), int(r[1])) not in grouped]
        return out

    def delivered_children(self, shards: Sequence[int], stride: int, offset: int) -> int:
        """Children already delivered of the partly delivered samples the share hands out
        again (each is one output less for it to deliver)."""
        return sum(
            len(row[3])
            for row in self.pending_for(shards, stride, offset)
            if len(row) > 3 and isinstance(row[3], list)
        )

    def routed(self, shards: Sequence[int], stride: int, offset: int) -> int:
        """Pending samples the share hands out beyond its own (the other samples of the
        groups it finishes) less its own that another share's groups take."""
        if not self.groups:
            return 0
        return len(self.pending_for(shards, stride, offset)) - len(
            self._share_rows(shards, stride, offset)
        )

    def remaining(self, shard: int, size: int, stride: int, offset: int) -> int:
        """Samples of ``shard`` (``size`` in all) in share ``(stride, offset)`` not done."""
        share = len(range(offset, size, stride))
        if shard not in self.claims and shard not in self.sets:
            return share
        if self.shard_done(shard):
            return sum(
                1
                for i in self.pending.get(shard, {})
                if i < size and i >= offset and (i - offset) % stride == 0
            )
        return sum(1 for i in range(offset, size, stride) if not self.done(shard, i))

    def remapped(self, mapping: Sequence[int]) -> Progress:
        """The same progress with shard ``s`` renamed ``mapping[s]`` (the saved list's
        index -> the new list's, ``streambuf._identity.remap``); shards of the new list
        that are no one's image have no claims: they are read whole."""
        out = Progress()
        for shard, claims in self.claims.items():
            out.claims[mapping[shard]] = list(claims)
        for shard, done in self.sets.items():
            out.sets[mapping[shard]] = set(done)
        for shard, rows in self.pending.items():
            new = mapping[shard]
            out.pending[new] = {i: [new, *row[1:]] for i, row in rows.items()}
        for group in self.groups.values():
            out.add_group([[mapping[p[0]], *p[1:]] for p in group])
        return out

    # -- plain data ---------------------------------------------------------------------
    def to_data(self) -> dict[str, Any]:
        return {
            "claims": {str(s): [list(c) for c in cs] for s, cs in self.claims.items()},
            "sets": {str(s): sorted(v) for s, v in self.sets.items()},
            "pending": [row for rows in self.pending.values() for row in rows.values()],
            **({"groups": list(self.groups.values())} if self.groups else {}),
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Progress:
        prog = cls()
        for shard, claims in data.get("claims", {}).items():
            for stride, offset, upto, hint in claims:
                prog.claim(int(shard), int(stride), int(offset), upto, hint)
        for shard, indices in data.get("sets", {}).items():
            prog.claim_set(int(shard), indices)
        for row in data.get("pending", []):
            prog.add_pending(row)
        for group in data.get("groups", []):
            prog.add_group(group)
        return prog
