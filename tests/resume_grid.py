"""The resume grid: layouts x world sizes x stop points x resume chains, generated in code
(``tests/test_resume_grid.py`` runs a fixed sample of it in CI and all of it under
``-m long``, ``make test-long``).

A **layout** is one pipeline over tar shards: shard sizes (uneven ones included),
``lanes``, ``order`` (``round_robin`` / ``first_ready``), a sample shuffle or none, a
filter or none, ``equalize`` or none, the batch size. A **chain** is a list of steps
``(world_size, stop)``: run every rank of that world (in this process: the pipeline's own
``rank=``/``world_size=``, a one-slot ``Pipeline`` per rank, its ``state_dict()``), stop
each after ``stop`` batches (None: to the end), save, and resume the next step from those
states: its own state per rank when the world size is the same (an *exact* resume),
the list of all ranks' states when it changed (*elastic*). Slots are ranks here; the
same code splits DataLoader workers (``slot = rank x num_workers + worker``), which the
few real-worker cases of the test file check.

Oracles (``check_chain``):

* every chain: the delivered samples are exactly the uninterrupted epoch's, each once
  (with ``equalize="pad"``: every sample at least once, the ranks of each step yielding
  equally many batches, the last step exactly as many as what is left needs);
* a chain whose steps are all exact, with ``round_robin`` lanes: each rank's batches
  are identical to its uninterrupted run's;
* an exact step after an elastic one (round_robin): identical to the elastic step run
  to the end without the interruption.
"""

from __future__ import annotations

import json
import math
import random
import tarfile
import zlib
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streambuf as sb
from streambuf.sharding import assign, shard_order

from .sources.helpers import add_member, switching_lanes

Step = tuple[int, int | None]  # (world size, batches per rank before the save; None: all)


@dataclass(frozen=True)
class Layout:
    sizes: tuple[int, ...]
    lanes: int = 2
    order: str = "round_robin"
    shuffle: int = 0
    filtered: bool = False
    equalize: str | None = None
    batch: int = 3

    @property
    def lane_mode(self) -> str:
        """How the case's lanes run, spread over the grid by its name: ``threads``
        (``adaptive=False``), ``inline`` (local files start inline; a case is shorter
        than the first re-check) or ``switch`` (threads <-> inline every few samples)."""
        return ("threads", "inline", "switch")[zlib.crc32(self.name.encode()) % 3]

    @property
    def name(self) -> str:
        parts = [
            "x".join(map(str, self.sizes)),
            f"l{self.lanes}",
            "fr" if self.order == "first_ready" else "rr",
        ]
        if self.shuffle:
            parts.append(f"sh{self.shuffle}")
        if self.filtered:
            parts.append("filt")
        if self.equalize:
            parts.append(self.equalize)
        return "-".join(parts)


def key_of(shard: int, index: int) -> str:
    return f"g{shard:02d}/{index:03d}"


def keep(sample: dict[str, Any]) -> bool:
    """The grid's filter (module level: picklable): drops every third sample."""
    return int(sample["__key__"].rsplit("/", 1)[1]) % 3 != 1


def write_shards(root: Path, sizes: Sequence[int]) -> list[str]:
    """Tar shards ``root/grid-XXXX.tar`` of ``sizes[s]`` samples (key ``g{s}/{i}``)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, n in enumerate(sizes):
        path = root / f"grid-{s:04d}.tar"
        if not path.exists():
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
                for i in range(n):
                    add_member(tf, f"{key_of(s, i)}.txt", f"{s}:{i}".encode() * 8)
        paths.append(str(path))
    return paths


def make_pipe(layout: Layout, paths: Sequence[str], rank: int, world: int) -> sb.Pipeline:
    pipe = sb.shards(
        list(paths),
        lanes=layout.lanes,
        order=layout.order,  # type: ignore[arg-type]
        adaptive=layout.lane_mode != "threads",
        seed=7,
        shuffle_shards=True,
        samples_per_shard=list(layout.sizes),
        equalize=layout.equalize,  # type: ignore[arg-type]
        rank=rank,
        world_size=world,
        backoff_s=0.01,
        max_backoff_s=0.05,
        timeout_s=10,
    )
    if layout.shuffle:
        pipe = pipe.shuffle(layout.shuffle)
    if layout.filtered:
        pipe = pipe.select(keep)
    return pipe.batch(layout.batch)


def keys(batch: dict[str, Any]) -> list[str]:
    return list(batch["__key__"])


def roundtrip(state: Any) -> Any:
    return json.loads(json.dumps(state))


def run_rank(
    layout: Layout,
    paths: Sequence[str],
    rank: int,
    world: int,
    *,
    state: Any = None,
    stop: int | None = None,
) -> tuple[list[list[str]], dict[str, Any]]:
    """Rank ``rank`` of ``world``, resumed from ``state`` (if any), for ``stop`` batches
    (None: to the end): (its batches' keys, its state then, through JSON)."""
    pipe = make_pipe(layout, paths, rank, world)
    if state is not None:
        pipe.load_state_dict(state)
    it = iter(pipe)
    got: list[list[str]] = []
    try:
        for batch in it:
            got.append(keys(batch))
            if stop is not None and len(got) >= stop:
                break
        return got, roundtrip(pipe.state_dict())
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def expected(layout: Layout) -> list[str]:
    out = [key_of(s, i) for s, n in enumerate(layout.sizes) for i in range(n)]
    if layout.filtered:
        out = [k for k in out if keep({"__key__": k})]
    return sorted(out)


def run_chain(
    layout: Layout, paths: Sequence[str], chain: Sequence[Step]
) -> tuple[list[list[list[str]]], list[list[dict[str, Any]]], list[list[int]]]:
    """Every step of ``chain``: per step, per rank, its samples; the states saved; and
    per step, per rank, its batch count."""
    delivered: list[list[list[str]]] = []
    saved: list[list[dict[str, Any]]] = []
    batches: list[list[int]] = []
    prev: list[dict[str, Any]] | None = None
    prev_world: int | None = None
    for world, stop in chain:
        step_batches, states = [], []
        for rank in range(world):
            if prev is None:
                state: Any = None
            elif world == prev_world:
                state = prev[rank]  # exact: this rank's own state
            else:
                state = prev if len(prev) > 1 else prev[0]  # elastic: every old rank's
            over = prev is not None and (
                state["complete"] if world == prev_world else all(x["complete"] for x in prev)
            )
            if over:  # this rank's (every rank's) epoch is over; loading it: the next one
                got, st = [], prev[rank] if world == prev_world else prev[0]
            else:
                got, st = run_rank(layout, paths, rank, world, state=state, stop=stop)
            step_batches.append(got)
            states.append(st)
        delivered.append([[k for b in r for k in b] for r in step_batches])
        batches.append([len(r) for r in step_batches])
        saved.append(states)
        prev, prev_world = states, world
    return delivered, saved, batches


def _left_per_slot(layout: Layout, before: set[str], world: int) -> list[int]:
    """What each new slot's share still holds (equalize counts it): the documented
    split (``streambuf.sharding.assign``) minus what was delivered before."""
    n = len(layout.sizes)
    order = shard_order(n, seed=7, epoch=0, shuffle=True)
    out = []
    for slot in range(world):
        a = assign(n, order, slot, world)
        left = 0
        for shard in a.shards:
            for i in range(a.offset, layout.sizes[shard], a.stride):
                if key_of(shard, i) not in before:
                    left += 1
        out.append(left)
    return out


def check_chain(layout: Layout, paths: Sequence[str], chain: Sequence[Step]) -> None:
    """Run ``chain`` and check the oracles of the module docstring."""
    with switching_lanes() if layout.lane_mode == "switch" else nullcontext():
        _check_chain(layout, paths, chain)


def _check_chain(layout: Layout, paths: Sequence[str], chain: Sequence[Step]) -> None:
    delivered, _, batches = run_chain(layout, paths, chain)
    flat = [k for step in delivered for r in step for k in r]
    want = expected(layout)
    where = f"{layout.name} chain {list(chain)}"
    if layout.equalize == "pad":
        assert sorted(set(flat)) == want, f"{where}: samples lost"
        before: set[str] = set()
        for (world, stop), step, counts in zip(chain, delivered, batches):
            if stop is None:
                assert len(set(counts)) == 1, f"{where}: unequal batch counts {counts}"
                # pad: the slot with the most left has no whole batch of padding
                need = max(
                    math.ceil(x / layout.batch) for x in _left_per_slot(layout, before, world)
                )
                assert counts[0] == need, f"{where}: {counts[0]} batches per rank, {need} needed"
                if world == 1:  # one slot: nothing to pad, exactly what is left, once
                    assert sorted(step[0]) == sorted(set(want) - before), f"{where}: not once"
            before |= {k for r in step for k in r}
        return
    c = Counter(flat)
    dups = sorted(k for k, v in c.items() if v > 1)
    missing = sorted(set(want) - set(c))
    extra = sorted(set(c) - set(want))
    assert not dups and not missing and not extra, (
        f"{where}: {len(flat)} delivered for {len(want)}: duplicates {dups[:8]}, "
        f"missing {missing[:8]}, unexpected {extra[:8]}"
    )
    if layout.order != "round_robin":
        return
    worlds = [w for w, _ in chain]
    if len(set(worlds)) == 1:  # all exact: identical to the uninterrupted run per rank
        world = worlds[0]
        for rank in range(world):
            ref, _ = run_rank(layout, paths, rank, world)
            got = [k for step in delivered for k in step[rank]]
            assert got == [k for b in ref for k in b], f"{where}: rank {rank} differs"
        return
    # an exact step right after an elastic one: identical to the elastic step uninterrupted
    for i in range(1, len(chain) - 1):
        if worlds[i - 1] != worlds[i] and worlds[i + 1] == worlds[i]:
            ref_chain = [*chain[:i], (worlds[i], None)]
            ref, _, _ = run_chain(layout, paths, ref_chain)
            got = [
                delivered[i][r] + delivered[i + 1][r] if chain[i + 1][1] is None else None
                for r in range(worlds[i])
            ]
            if all(g is not None for g in got):
                assert got == ref[i], f"{where}: the exact resume after the elastic one differs"


# -- the grid ---------------------------------------------------------------------------
SIZES = [(5, 7, 3, 6), (4, 9, 2, 8, 5, 7, 3), (6, 6, 6), (11, 4), (3, 8, 1, 7, 4, 6, 2, 9, 5)]
BASE_CHAINS: list[tuple[Step, ...]] = [
    ((1, 2), (1, None)),  # exact
    ((2, 2), (2, None)),  # exact, two ranks
    ((1, 3), (1, 2), (1, None)),  # exact twice
    ((3, 1), (1, 1), (1, None)),  # elastic 3 -> 1, saved mid-replay, then exact
    ((2, 2), (3, 1), (1, None)),  # elastic twice
    ((2, 1), (3, 2), (3, None)),  # elastic, then exact
    ((1, 2), (2, 1), (4, None)),  # elastic twice: more slots than some layouts' shards
    ((2, 3), (1, None)),  # elastic to one
]
STOP_SCALES = (1, 2, 4)  # the stop points: each chain's stops times these


def scaled(chain: tuple[Step, ...], k: int) -> tuple[Step, ...]:
    return tuple((w, None if s is None else s * k) for w, s in chain)


CHAINS = [scaled(c, k) for c in BASE_CHAINS for k in STOP_SCALES]


def layouts() -> list[Layout]:
    out = []
    for sizes in SIZES:
        for lanes in (1, 2, 3):
            for order in ("round_robin", "first_ready"):
                for shuffle in (0, 5):
                    for filtered in (False, True):
                        for equalize in (None, "pad"):
                            if equalize and filtered:
                                continue  # pad counts declared samples: no filters
                            out.append(Layout(sizes, lanes, order, shuffle, filtered, equalize))
    return out


def grid() -> list[tuple[Layout, tuple[Step, ...]]]:
    return [(lay, chain) for lay in layouts() for chain in CHAINS]


def ci_sample(k: int, seed: int = 20240611) -> list[tuple[Layout, tuple[Step, ...]]]:
    """A fixed sample of ``k`` grid cases, always containing the classes the grid is
    for: first_ready with an elastic resume, first_ready with 3+ shards per lane exact,
    a save mid-replay, elastic then exact, pad across an elastic resume, fewer shards
    than slots after two elastic resumes."""
    cases = grid()
    must = [
        (Layout(SIZES[4], 2, "first_ready", 5), BASE_CHAINS[4]),
        (Layout(SIZES[4], 1, "first_ready", 0), BASE_CHAINS[2]),
        (Layout(SIZES[4], 1, "first_ready", 5), scaled(BASE_CHAINS[2], 2)),
        (Layout(SIZES[1], 2, "round_robin", 5), BASE_CHAINS[3]),
        (Layout(SIZES[1], 2, "round_robin", 0, True), BASE_CHAINS[5]),
        (Layout(SIZES[0], 2, "round_robin", 5, False, "pad"), BASE_CHAINS[4]),
        (Layout(SIZES[1], 1, "round_robin", 5, False, "pad"), scaled(BASE_CHAINS[4], 2)),
        (Layout(SIZES[3], 2, "first_ready", 0, False, "pad"), BASE_CHAINS[6]),
        (Layout(SIZES[3], 3, "round_robin", 5, True), BASE_CHAINS[6]),
    ]
    rest = [c for c in cases if c not in must]
    return must + random.Random(seed).sample(rest, max(0, k - len(must)))
