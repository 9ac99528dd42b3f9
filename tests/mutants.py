"""``make mutants``: plant known bugs one at a time and check the suite catches each.

Each mutant replaces one exact snippet of one file (it must occur exactly once: a
mutant that no longer applies is an error, so the list follows the code when it moves)
in a scratch copy of the repository, then runs only the test files that guard that
code (``-x``, hypothesis without shrinking). A mutant is *killed* when those tests fail.
Prints ``N of N mutants killed`` and exits 1 if any survived or no longer applies.

    python tests/mutants.py            # all
    python tests/mutants.py budget     # those whose name contains "budget"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant(
        "adaptive map: inline starts one item before the threads' items are all delivered",
        "streambuf/prefetch.py",
        "return self._delivered == self._next_index",
        "return self._delivered >= self._next_index - 1",
        ("tests/test_prefetch_adaptive.py",),
    ),
    Mutant(
        "adaptive map: back on the threads, round robin restarts at lane 0",
        "streambuf/prefetch.py",
        "self._runner._buf._restart_at(self._next_index % self._threads_n)",
        "self._runner._buf._restart_at(0)",
        ("tests/test_prefetch_adaptive.py",),
    ),
    Mutant(
        "budget admits 25% more bytes (sharded and pooled)",
        "streambuf/budget.py",
        "and self._w[o + _USED_B] + nbytes <= self._w[o + _LIM_B]",
        "and self._w[o + _USED_B] + nbytes <= self._w[o + _LIM_B] * 5 // 4",
        ("tests/test_budget.py::TestBudgetInline", "tests/test_loader_budget.py"),
    ),
    Mutant(
        "budget admits one batch more than max_batches (sharded)",
        "streambuf/budget.py",
        "self._w[o + _USED_N] < self._w[o + _LIM_N]",
        "self._w[o + _USED_N] <= self._w[o + _LIM_N]",
        ("tests/test_loader_budget.py", "tests/test_budget.py"),
    ),
    Mutant(
        "budget admits one batch more than max_batches (pooled)",
        "streambuf/budget.py",
        "return used_n < self._g[_G_MAX_N] and",
        "return used_n <= self._g[_G_MAX_N] and",
        ("tests/test_loader_budget.py", "tests/test_budget.py"),
    ),
    Mutant(
        "Loader under-reserves the batch being built",
        "streambuf/_worker.py",
        "estimate = max(size, 1) if first else max(estimate, size)",
        "estimate = 1",
        ("tests/test_loader_budget.py",),
    ),
    Mutant(
        "stage share is half of max_bytes instead of a quarter",
        "streambuf/loader.py",
        "stage_total = self.max_bytes // 4 if",
        "stage_total = self.max_bytes // 2 if",
        ("tests/test_loader_budget.py",),
    ),
    Mutant(
        "sharding: slot 0 skips its last shard",
        "streambuf/sharding.py",
        "return Assignment(tuple(order[slot::slots]))",
        "return Assignment(tuple(order[slot::slots])[: -1 if slot == 0 and len(order[slot::slots]) > 1 else None])",
        ("tests/test_sharding.py",),
    ),
    Mutant(
        "sharding: a shard is read twice",
        "streambuf/sharding.py",
        "return Assignment(tuple(order[slot::slots]))",
        "return Assignment(tuple(order[slot::slots]) + tuple(order[slots - 1 : slots] if slot == 0 else ()))",
        ("tests/test_sharding.py",),
    ),
    Mutant(
        "equalize='drop' trims one batch too many",
        "streambuf/sharding.py",
        'target = min(totals) if mode == "drop" else max(totals)',
        'target = min(totals) - 1 if mode == "drop" else max(totals)',
        ("tests/test_sharding.py",),
    ),
    Mutant(
        "equalize='pad' adds one batch too many",
        "streambuf/sharding.py",
        'target = min(totals) if mode == "drop" else max(totals)',
        'target = min(totals) if mode == "drop" else max(totals) + 1',
        ("tests/test_sharding.py",),
    ),
    Mutant(
        "buffer: a lane admits one item over its count bound",
        "streambuf/_engine.py",
        "return n < lane.max_items and lane.bytes + size <= lane.max_bytes",
        "return n <= lane.max_items and lane.bytes + size <= lane.max_bytes",
        ("tests/test_buffer_properties.py", "tests/test_buffer.py"),
    ),
    Mutant(
        "buffer: the pool admits 50 bytes over its byte bound",
        "streambuf/_engine.py",
        "return n < self._max_items and self._bytes + size <= self._max_bytes",
        "return n < self._max_items and self._bytes + size <= self._max_bytes + 50",
        ("tests/test_buffer_properties.py", "tests/test_buffer.py"),
    ),
    Mutant(
        "buffer: a lane delivers LIFO instead of FIFO",
        "streambuf/_engine.py",
        "item, size = lane.q.popleft()",
        "item, size = lane.q.pop()",
        ("tests/test_buffer.py", "tests/test_buffer_properties.py"),
    ),
    Mutant(
        "video: each clip's frames shifted by one",
        "streambuf/video/decode.py",
        "            _put_frame(out, t, rgb, layout)",
        "            _put_frame(out, max(t - 1, 0), rgb, layout)",
        ("tests/video/test_decode.py",),
    ),
    Mutant(
        "video: pts shifted by one frame duration",
        "streambuf/video/decode.py",
        "pts_seconds=torch.from_numpy(info.pts_seconds[idx]),",
        "pts_seconds=torch.from_numpy(info.pts_seconds[idx] + info.frame_duration_seconds[idx]),",
        ("tests/video/test_decode.py",),
    ),
    Mutant(
        "tar: member padding off by one block",
        "streambuf/sources/tar.py",
        "padded = -size % _BLOCK",
        "padded = -size % _BLOCK + (_BLOCK if size > 700 else 0)",
        ("tests/sources/test_tar.py",),
    ),
    Mutant(
        "retry resumes one byte early",
        "streambuf/sources/_resumable.py",
        "self._connect(self.offset)",
        "self._connect(max(0, self.offset - 1))",
        ("tests/sources/test_opener.py",),
    ),
    Mutant(
        "resume: delivered samples stay pending (replayed twice)",
        "streambuf/_ledger.py",
        "            entry.live -= 1",
        "            entry.live -= 0",
        ("tests/test_resume.py",),
    ),
    Mutant(
        "resume: a lane's cursor skips one sample",
        "streambuf/_source.py",
        "self._cur[lane] = [i, j + 1, h1]",
        "self._cur[lane] = [i, j + 2, h1]",
        ("tests/test_resume.py",),
    ),
    Mutant(
        "resume: the shuffle forgets what it emitted but was not delivered",
        "streambuf/stages.py",
        '"emitted": [list(r.pos) for r in self.emitted if ledger.is_open(r)],',
        '"emitted": [],',
        ("tests/test_resume.py",),
    ),
    Mutant(
        "resume: in-order rotation lost (the first worker delivers first)",
        "streambuf/_checkpoint.py",
        "plan.rotation = nxt if self.in_order else 0",
        "plan.rotation = 0",
        ("tests/test_resume.py",),
    ),
    Mutant(
        "elastic: an open shard's claim covers one sample too many",
        "streambuf/_elastic.py",
        "self.claim(shard, stride, offset, upto, hint)",
        "self.claim(shard, stride, offset, upto + 1, hint)",
        ("tests/test_resume.py::test_elastic_resume_exactly_once",),
    ),
    Mutant(
        "tar fetch numbers a fetched run from the wrong sample",
        "streambuf/sources/access.py",
        "first_index=run[0][0],",
        "first_index=run[0][0] + 1,",
        ("tests/sources/test_resume_shards.py",),
    ),
    Mutant(
        "arena: a slot is freed while its batch is still in use",
        "streambuf/_transport.py",
        "whole = torch.frombuffer(_arena.registered(token).adopt(slot), dtype=torch.uint8)",
        "whole = torch.frombuffer(_arena.registered(token).adopt(slot)[:], dtype=torch.uint8)",
        ("tests/test_arena.py",),
    ),
    Mutant(
        "mix: the draw count is not restored on resume",
        "streambuf/mixing.py",
        'self.counter = int(state.get("counter", 0))',
        "self.counter = 0",
        ("tests/test_mixing.py::test_resume_is_exact",),
    ),
    Mutant(
        "worker exceptions lose their type (ExceptionWrapper behaviour)",
        "streambuf/_transport.py",
        "        if not isinstance(exc, BaseException):",
        "        exc = None\n        if not isinstance(exc, BaseException):",
        ("tests/test_loader_errors.py",),
    ),
    Mutant(
        "DDP: the Loader freezes rank and world size on the user's pipeline when built",
        "streambuf/loader.py",
        "        self._arena: Any = None",
        "        self._arena: Any = None\n        self.pipeline._rank_world = current_rank_world()",
        ("tests/test_distributed.py::test_loader_built_before_init_process_group_shards_per_rank",),
    ),
    Mutant(
        "orphans: workers do not watch their parent",
        "streambuf/_worker.py",
        "            if os.getppid() != parent:  # re-parented: the main process is gone",
        "            if False:",
        ("tests/test_loader_faults.py::test_workers_exit_when_the_main_process_is_killed",),
    ),
    Mutant(
        "tar smuggling: a negative pax size is accepted",
        "streambuf/sources/tar.py",
        "    if not _PAX_SIZE.fullmatch(value):",
        '    if not value.lstrip("-").isdigit():',
        ("tests/sources/test_tar.py",),
    ),
    Mutant(
        "HTTP resume: a 200 answer with the same ETag is taken for a changed object",
        "streambuf/sources/_http.py",
        "            if now is not None and now != was:",
        "            if now is not None:",
        ("tests/sources/test_opener.py::test_server_ignoring_range_is_handled",),
    ),
    Mutant(
        "trickle: the progress rule never drops a slow connection",
        "streambuf/sources/_resumable.py",
        "        if self._min_rate is not None and self._win_busy_s >= self._window_s:",
        "        if False:",
        ("tests/sources/test_opener.py::test_trickle_below_min_rate_is_dropped_and_resumed",),
    ),
    Mutant(
        "options: timeout_s=0 accepted at build time",
        "streambuf/sources/options.py",
        '        check_seconds(self.timeout_s, name="timeout_s")',
        '        check_seconds(self.timeout_s, name="timeout_s", allow_zero=True)',
        ("tests/test_options.py::test_timeout_zero_with_skip_is_refused_not_silently_skipping",),
    ),
    Mutant(
        "nodes: an in-order result larger than its reservation is put over the bound",
        "streambuf/nodes/_window.py",
        "if size > reserved and (self._waiters or not self._fits(size)):",
        "if False:",
        ("tests/test_nodes_properties.py",),
    ),
    Mutant(
        "nodes: an as-ready result larger than its reservation is put over the bound",
        "streambuf/nodes/_run.py",
        "if rec[3] <= est:",
        "if True:",
        ("tests/test_nodes_properties.py",),
    ),
    Mutant(
        "nodes: items being made are not counted in bytes (no reservation estimate)",
        "streambuf/nodes/_run.py",
        "est = self._largest if self._largest >= 0 else self._share",
        "est = 0",
        ("tests/test_nodes.py::test_items_being_made_count_against_the_byte_bound",),
    ),
    Mutant(
        "nodes: the window never hands the head over (in-order deadlock)",
        "streambuf/nodes/_window.py",
        "(slot.admitted or slot.token is not None)",
        "slot.admitted",
        ("tests/test_nodes.py::test_a_head_result_larger_than_its_reservation_is_handed_over",),
    ),
    Mutant(
        "nodes: the state counts what the threads ran ahead on",
        "streambuf/nodes/_run.py",
        "            self._mark(idx, state)\n        return out",
        "            self._mark(idx, self._source.state_dict())\n        return out",
        ("tests/test_nodes.py",),
    ),
    Mutant(
        "nodes: the state forgets items delivered out of order",
        "streambuf/nodes/_run.py",
        "ahead = sorted(i - base for i in (*self._ahead, *self._skip))",
        "ahead: list[int] = []",
        (
            "tests/test_nodes.py::test_out_of_order_state_lists_what_was_delivered_ahead_and_resumes_exactly",
        ),
    ),
    Mutant(
        "nodes: reset leaves the previous iteration's threads running",
        "streambuf/nodes/map.py",
        "        super().reset(initial_state)\n        self._close()",
        "        super().reset(initial_state)",
        ("tests/test_nodes.py",),
    ),
    Mutant(
        "nodes: garbage collection does not stop the threads",
        "streambuf/nodes/map.py",
        "self._stop = weakref.finalize(self, run.close)",
        "self._stop = weakref.finalize(run, run.close)",
        ("tests/test_nodes.py::test_reset_shutdown_and_garbage_collection_stop_the_threads",),
    ),
    Mutant(
        "nodes: PipelineNode resumes an end-of-epoch state as the next epoch",
        "streambuf/nodes/pipeline.py",
        'if plan["complete"]:',
        "if False:",
        ("tests/test_nodes.py",),
    ),
]


def _copy_tree(dst: Path) -> None:
    for name in ("streambuf", "tests", "examples"):
        shutil.copytree(
            ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)


def run_one(m: Mutant) -> tuple[str, float]:
    """'killed', 'survived' or 'stale' (no longer applies), and the seconds it took."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="streambuf-mutant-") as tmp:
        dst = Path(tmp)
        _copy_tree(dst)
        target = dst / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            return "stale", time.monotonic() - t0
        target.write_text(text.replace(m.old, m.new))
        env = dict(os.environ, STREAMBUF_MUTANTS="1", PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests]
        try:
            proc = subprocess.run(
                cmd, cwd=dst, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return "killed", time.monotonic() - t0  # a hang is caught too (by timeouts)
        if proc.returncode == 0:
            return "survived", time.monotonic() - t0
        if proc.returncode not in (1,):  # 2+: collection/usage errors are not a kill
            tail = (proc.stdout + proc.stderr)[-2000:]
            print(f"    pytest exit {proc.returncode}:\n{tail}")
            return "broken", time.monotonic() - t0
        return "killed", time.monotonic() - t0


def all_mutants() -> list[Mutant]:
    """This file's list, then the shard cache's (``tests/sources/cache_mutants.py``) and
    the webdataset compatibility's (``tests/sources/wds_mutants.py``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.sources.cache_mutants import MUTANTS as CACHE
    from tests.sources.wds_mutants import MUTANTS as WDS

    return [*MUTANTS, *CACHE, *WDS]


def main(argv: list[str]) -> int:
    chosen = [m for m in all_mutants() if not argv or any(a in m.name for a in argv)]
    results = []
    t0 = time.monotonic()
    # Three at a time: most of a mutant's seconds are pytest starting and tests waiting
    # (sleeps, timeouts), so three overlap well on 2 cores. MUTANT_JOBS=1 runs them one by one.
    jobs = max(1, int(os.environ.get("MUTANT_JOBS", "3")))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for m, (verdict, took) in zip(chosen, pool.map(run_one, chosen)):
            results.append(verdict)
            print(f"{verdict:>8}  {took:5.1f} s  {m.name}", flush=True)
    killed = results.count("killed")
    took = time.monotonic() - t0
    print(f"{killed} of {len(chosen)} mutants killed ({took:.0f} s, {jobs} at a time)")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
