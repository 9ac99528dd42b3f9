"""The planted bugs of "Tests II" (part b: arena lifetimes across epochs, the float
image path's decode bound, how ``mix()`` splits the stage grant, and that its blend
follows the epoch): ``tests/planted`` gathers them with the others. Each must make the
tests named beside it fail; the suite before those tests (tests/test_arena.py,
tests/sources/test_decoders.py, tests/sources/test_wds_compat.py, tests/test_mixing.py)
missed every one."""

from __future__ import annotations

from tests.planted._mutant import planted

ARENA = "tests/test_arena_epochs.py"
BOUNDS = "tests/test_bounds_paths.py"
MIX = "tests/test_mixing_grants.py"


_m = planted("tests2b")


MUTANTS = [
    _m(
        "a worker starting an epoch frees its arena slots (kept batches too)",
        "streambuf/_arena.py",
        "    _active = None if arena is None or not arena.usable else (arena, worker)\n",
        "    _active = None if arena is None or not arena.usable else (arena, worker)\n"
        "    if _active is not None:  # a fresh start: this worker's slots are all free\n"
        "        first = worker * arena.slots_per_worker\n"
        "        for slot in range(first, first + arena.slots_per_worker):\n"
        "            arena._state[slot] = 0\n",
        ARENA,
    ),
    _m(
        "a new epoch reclaims arena slots that a kept batch still views",
        "streambuf/_arena.py",
        "if self._state[slot] and slot not in self._adopted:",
        "if self._state[slot]:",
        ARENA,
    ),
    _m(
        "the decode bound counts a float image at 1 byte per value",
        "streambuf/wds/images.py",
        "len(mode) * (4 if is_float else 1)",
        "len(mode) * 1",
        BOUNDS,
    ),
    _m(
        "mix grants each source the whole stage grant",
        "streambuf/mixing.py",
        "self.share = None if stage_bytes is None else max(1, stage_bytes // k)",
        "self.share = stage_bytes",
        MIX,
    ),
    _m(
        "the mix blend ignores the epoch",
        "streambuf/mixing.py",
        "self.seed = hash_seed(spec.seed, ctx.epoch, ctx.rank, ctx.worker)",
        "self.seed = hash_seed(spec.seed, 0, ctx.rank, ctx.worker)",
        MIX,
    ),
]
