"""The planted bugs of "Tests II" (resume beyond the one fixture layout, both sides of
the load checks, a node saved again right after a resume, set_epoch and lanes after a
load): ``tests/planted`` gathers them with the others. Each must make the tests named
beside it fail; the suite before those tests (tests/test_resume.py,
tests/test_resume_checks.py, tests/sources/test_resume_shards.py, tests/test_nodes.py,
tests/sources/test_tar.py) missed every one."""

from __future__ import annotations

from tests.planted._mutant import planted

GRID = "tests/test_resume_grid.py"
NEG = "tests/test_resume_negative.py"
PAX = "tests/sources/test_resume_pax.py"
NODES = "tests/test_nodes_resume_twice.py"
REPORT = "tests/test_report.py"
SHARDS = "tests/sources/test_loader_shards.py"


_m = planted("tests2")


MUTANTS = [
    _m(
        "equalize pad after an elastic resume repeats only what is left",
        "streambuf/_iteration.py",
        "progress=self.progress if self.pass_index == 0 else None,",
        "progress=self.progress,",
        GRID,
    ),
    _m(
        "equalize pad after an elastic resume pads only slots with samples left",
        "streambuf/sharding.py",
        "able = [w for w in range(num_workers) if whole[r * num_workers + w] > 0]",
        "able = [w for w in range(num_workers) if per_slot[r * num_workers + w] > 0]",
        GRID,
    ),
    _m(
        "elastic twice with pad: a slot's repeats taken for the samples it owed",
        "streambuf/_elastic.py",
        'rows = (snap.get("pending") or []) if snap.get("pass", 0) == 0 else []',
        'rows = snap.get("pending") or []',
        GRID,
    ),
    _m(
        "a state saved during a replay forgets the pending samples not replayed yet",
        "streambuf/_iteration.py",
        '"pending": self.ledger.pending() + (src.unissued() if src is not None else []),',
        '"pending": self.ledger.pending(),',
        GRID,
    ),
    _m(
        "elastic progress of first_ready lanes forgets shards finished out of order",
        "streambuf/_elastic.py",
        "return i < int(n) or i in extra",
        "return i < int(n)",
        GRID,
    ),
    _m(
        "the seed is not checked at load",
        "streambuf/_state.py",
        '    if state["seed"] != pipe.seed:\n',
        "    if False:\n",
        NEG,
    ),
    _m(
        "a sample's start offset is its member header, after its pax header",
        "streambuf/sources/tar.py",
        "            if long_name is None and pax is None:  # a member's first header starts here",
        "            if long_name is None:  # a member's first header starts here",
        PAX,
    ),
    _m(
        "a node's state forgets the skips it has not pulled again yet",
        "streambuf/nodes/_run.py",
        "ahead = sorted(i - base for i in (*self._ahead, *self._skip))",
        "ahead = sorted(i - base for i in self._ahead)",
        NODES,
    ),
    _m(
        "Pipeline.set_epoch after Pipeline.load_state_dict not checked",
        "streambuf/pipeline.py",
        "        if self._resume is not None:\n            _state.check_set_epoch(",
        "        if False:\n            _state.check_set_epoch(",
        NEG,
    ),
    _m(
        "changed lanes resume exactly (cursors restored onto other lanes)",
        "streambuf/_state.py",
        "lanes_changed = _lanes_changed(pipe, mine[0]) if mine else None",
        "lanes_changed = None",
        NEG,
    ),
    _m(
        "a threaded map's sampled function CPU is not scaled to all its calls",
        "streambuf/_meter.py",
        'fn_cpu = min(g["fn_ns"], fn_cpu * g["fn_calls"] // g["fn_cpu_calls"])',
        'fn_cpu = min(g["fn_ns"], fn_cpu)',
        f"{REPORT}::test_a_threaded_maps_sampled_cpu_is_scaled_to_all_its_calls",
    ),
    _m(
        "a prefetch's wait for its upstream is taken for its cost",
        "streambuf/_diagnosis.py",
        '    if s.stage == "prefetch":',
        "    if False:",
        f"{REPORT}::test_prefetchs_wait_for_its_upstream_is_not_its_cost",
    ),
    _m(
        "the advice names today's worker count, not more",
        "streambuf/_diagnosis.py",
        "workers + 1 if workers else 'N'",
        "workers if workers else 'N'",
        f"{REPORT}::test_advice_names_more_workers_than_there_are",
    ),
    _m(
        "a worker killed by SIGKILL gets no out-of-memory hint",
        "streambuf/_supervise.py",
        "            if any(w.exitcode == -signal.SIGKILL for _, w in dead):",
        "            if False:",
        f"{REPORT}::test_a_worker_killed_by_sigkill_is_said_to_be_maybe_out_of_memory",
    ),
    _m(
        "every worker death gets the out-of-memory hint",
        "streambuf/_supervise.py",
        "            if any(w.exitcode == -signal.SIGKILL for _, w in dead):",
        "            if dead:",
        f"{REPORT}::test_a_worker_killed_by_sigkill_is_said_to_be_maybe_out_of_memory",
    ),
    _m(
        "the read charge counts the lanes of a worker with the fewer shards",
        "streambuf/sources/pipe.py",
        "        per_worker = -(-len(urls) // max(1, workers))",
        "        per_worker = len(urls) // max(1, workers)",
        f"{SHARDS}::test_shards_not_divisible_by_workers_charge_the_most_lanes_a_worker_opens",
    ),
    _m(
        "the read charge replaces pack's block in fixed_bytes",
        "streambuf/loader.py",
        "            fixed += self.read_bytes * copies",
        "            fixed = self.read_bytes * copies",
        f"{SHARDS}::test_pack_over_shards_is_charged_its_block_and_the_reads",
    ),
    _m(
        "the read charge is cut to half of max_bytes ignoring pack's block",
        "streambuf/loader.py",
        "(self.max_bytes // 2 - fixed) // copies",
        "(self.max_bytes // 2) // copies",
        f"{SHARDS}::test_pack_over_shards_is_charged_its_block_and_the_reads",
    ),
]
