"""Positions and the ledger: what a running pipeline owes its consumer.

Every sample carries a ``Rec``: its value, its **position** and its **seq**.

* ``pos``: where it came from, stable across epochs and world layouts: ``(shard, index)``
  with ``shard`` its index in the pipeline's source list and ``index`` its place in
  that shard (the sample index of a tar shard, the sampler's clip index of a video, 0 for
  a plain item); ``flatten`` appends the child's index: ``(shard, index, sub)``.
* ``seq``: the order in which the source handed it out in this run (0, 1, ...).

The ``Ledger`` records every sample the source has handed out and not yet *settled*
(delivered in a batch, or dropped by a filter): the **pending** set. A pipeline's state
is small because of it: everything behind the consumer is behind the source's cursors
minus the pending samples, and everything in flight (lane buffers, threaded maps,
shuffle pools, a partial batch) is pending, so it is re-derivable from positions
(docs/design.md, "State and resume"). One lock (``lock``) guards the ledger and every
stage's bookkeeping, so a snapshot taken under it is consistent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["Ledger", "Rec", "leaves"]

Pos = tuple[int, ...]


@dataclass(slots=True)
class Rec:
    """One sample on its way through a pipeline (see the module docstring); a batch is a
    ``Rec`` whose ``members`` are the samples in it (settled when it is delivered) and
    whose ``last`` says whether it ends its stream."""

    value: Any
    pos: Pos
    seq: int
    members: list[Rec] | None = None
    last: bool = False

    def with_value(self, value: Any) -> Rec:
        return Rec(value, self.pos, self.seq, self.members, self.last)


class _Entry:
    __slots__ = ("also", "hint", "live", "pos", "settled")

    def __init__(self, pos: Pos, hint: Any) -> None:
        self.pos = pos
        self.hint = hint  # how to fetch it again (a byte offset), or None
        self.live = 1  # copies downstream not yet settled (flatten makes children)
        self.settled: list[int] | None = None  # settled children of a flattened sample
        # a flattened group's other samples (a user stage's output made of several):
        # settled with this entry, when the group's last child is
        self.also: list[Rec] | None = None


class Ledger:
    """Samples handed out by the source and not settled yet, in ``seq`` order."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._open: dict[int, _Entry] = {}  # seq -> entry; insertion order is seq order

    def issued(self, seq: int, pos: Pos, hint: Any, settled: list[int] | None = None) -> None:
        """The source handed out sample ``seq`` (call under ``lock``); ``settled``: the
        children of it already delivered before a resume (it is flattened later)."""
        entry = self._open[seq] = _Entry(pos, hint)
        if settled:
            entry.settled = list(settled)

    def expanded(self, rec: Rec, children: int) -> None:
        """``flatten`` turned ``rec`` into ``children`` samples. A group (a user stage's
        output, ``members``) is flattened under its first sample's entry (the children's
        positions extend its position); the group's other samples stay open until the
        last child is settled, and are settled with it: a resume replays the whole group
        to the stage, which makes the same output again, and skips the children already
        delivered."""
        with self.lock:
            entry = self._open.get(rec.seq)
            if entry is None:
                return
            if rec.members is not None:
                rest = leaves(rec)[1:]
                if rest:
                    entry.also = (entry.also or []) + rest
            entry.live += children - 1
            if entry.live <= 0:
                self._close(rec.seq, entry)

    def _close(self, seq: int, entry: _Entry) -> None:
        """The entry's last copy was settled: it and the group samples riding on it."""
        del self._open[seq]
        for other in entry.also or ():
            self.settle(other)

    def settle(self, rec: Rec) -> None:
        """``rec`` was delivered or dropped: the consumer owes nothing more for it."""
        with self.lock:
            entry = self._open.get(rec.seq)
            if entry is None:
                return
            entry.live -= 1
            if entry.live <= 0:
                self._close(rec.seq, entry)
            elif len(rec.pos) > len(entry.pos):  # one child of a flattened sample
                if entry.settled is None:
                    entry.settled = []
                entry.settled.append(rec.pos[len(entry.pos)])

    def settle_all(self, rec: Rec) -> None:
        """Settle ``rec``, or every sample in it when it is a batch or a group (a user
        stage's output: its members may be groups in turn)."""
        with self.lock:
            if rec.members is None:
                self.settle(rec)
                return
            for member in rec.members:
                if member.members is None:
                    self.settle(member)
                else:
                    self.settle_all(member)

    def is_open(self, rec: Rec) -> bool:
        """True while ``rec`` is not settled (a group: any of its members; call under
        ``lock``)."""
        if rec.members is not None:
            return any(self.is_open(m) for m in rec.members)
        entry = self._open.get(rec.seq)
        if entry is None:
            return False
        if len(rec.pos) > len(entry.pos) and entry.settled is not None:
            return rec.pos[len(entry.pos)] not in entry.settled
        return True

    def pending(self) -> list[list[Any]]:
        """The open samples in ``seq`` order as plain data: ``[shard, index, hint]``, or
        ``[shard, index, hint, [settled children]]`` (call under ``lock``)."""
        out: list[list[Any]] = []
        for e in self._open.values():
            row = [*e.pos, e.hint]
            if e.settled:
                row.append(sorted(e.settled))
            out.append(row)
        return out

    def groups(self) -> list[list[list[int]]]:
        """The partly delivered flattened groups: for each open entry with settled
        children that a group rides on, its samples' positions in the group's order
        (``[[*first], [*second], ...]``; call under ``lock``). A resume hands the group to
        the stage again and skips the children delivered; it may do so only for the same
        group, so the state names it (``streambuf._elastic``, ``stages.Flatten``)."""
        return [
            [list(e.pos), *(list(o.pos) for o in e.also)]
            for e in self._open.values()
            if e.settled and e.also
        ]

    def __len__(self) -> int:
        return len(self._open)


def leaves(rec: Rec) -> list[Rec]:
    """The samples in ``rec``, in order (a group's members may be groups in turn)."""
    if rec.members is None:
        return [rec]
    return [leaf for m in rec.members for leaf in leaves(m)]
