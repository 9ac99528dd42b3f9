"""The planted bugs of "Architecture": the public stage contract (what a checkpoint
saves of a stage's state, groups settled whole, dropped samples settled, the
configuration in the fingerprint), what a Source adds to the fingerprint, a pipeline's
counters across processes, a share that ends without a batch, and the package's layers
(a lazy import that closes a circle).
Each must make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

STAGE = "tests/test_custom_stage.py"
EMPTY = "tests/test_loader_empty_shares.py"

_m = planted("arch")

MUTANTS = [
    _m(
        "stage state: a checkpoint saves the state at the last yield (outputs in flight "
        "counted as delivered)",
        "streambuf/compose.py",
        "before = self.emitted[0][1] if self.emitted else self.at_yield",
        "before = self.at_yield",
        f"{STAGE}::test_the_example_resumes_exactly_with_0_and_2_workers",
    ),
    _m(
        "ledger: a delivered group settles only its first member",
        "streambuf/_ledger.py",
        "                    self.settle_all(member)",
        "                    self.settle(member)",
        f"{STAGE}::test_the_example_resumes_exactly_with_0_and_2_workers",
    ),
    _m(
        "stage: samples pulled after the last output stay pending",
        "streambuf/compose.py",
        "                for r in dropped:\n                    ledger.settle_all(r)\n",
        "                pass\n",
        f"{STAGE}::test_dropped_samples_are_settled_and_the_state_is_complete",
    ),
    _m(
        "stage: the fingerprint leaves out the stage's configuration",
        "streambuf/compose.py",
        "        cfg = json.dumps(self.config(), sort_keys=True, default=_stable)\n",
        "        cfg = ''\n",
        f"{STAGE}::test_a_state_of_another_stage_configuration_does_not_load",
    ),
    _m(
        "source: the state's fingerprint leaves out what the Source adds (a mix's sources)",
        "streambuf/_state.py",
        "    source = pipe._src.fingerprint()",
        '    source = ""',
        "tests/test_mixing.py::test_a_state_of_other_mixed_sources_does_not_load",
    ),
    _m(
        "counters: a spawned worker's counts stay in the worker",
        "streambuf/_counters.py",
        "raw = self._raw if context.get_spawning_popen() is not None else list(self._raw)",
        "raw = list(self._raw)",
        "tests/sources/test_loader_shards.py::test_reader_pickles_and_runs_under_spawn",
    ),
    _m(
        "a worker whose share ends without a batch sends no state",
        "streambuf/_worker.py",
        "                    if first:  # no batch carried a snapshot",
        "                    if False:  # no batch carried a snapshot",
        EMPTY,
    ),
    _m(
        "layers: a lazy import closes a circle (the iteration imports the Pipeline)",
        "streambuf/_iteration.py",
        "    from ._contracts import PipelineView, WorkerContext\n",
        "    from ._contracts import PipelineView, WorkerContext\n"
        "    from .pipeline import Pipeline  # noqa: F401\n",
        "tests/test_layout.py::test_no_import_cycle_among_the_package_modules",
    ),
    _m(
        "ledger: a flattened group settles only its first sample (its others stay pending)",
        "streambuf/_ledger.py",
        "            if rec.members is not None:\n                rest = leaves(rec)[1:]",
        "            if False:\n                rest = leaves(rec)[1:]",
        f"{STAGE}::test_a_flattened_group_settles_all_its_samples",
    ),
    _m(
        "elastic: a partly delivered group's samples are handed out in position order, "
        "each by its own slot (not together, first, by the slot of its first)",
        "streambuf/_elastic.py",
        "        rows = self._share_rows(shards, stride, offset)\n        if not self.groups:\n"
        "            return rows\n",
        "        rows = self._share_rows(shards, stride, offset)\n        if True:\n"
        "            return rows\n",
        f"{STAGE}::test_an_elastic_resume_finishes_a_partly_delivered_group_once",
    ),
    _m(
        "resume: flatten skips a partly delivered output's children by index in an output "
        "made of other samples",
        "streambuf/stages.py",
        "    if saved == [now]:",
        "    if True:",
        f"{STAGE}::test_a_group_made_of_other_samples_on_resume_is_refused",
    ),
    _m(
        "resume: a group not yet given again to flatten is left out of the next state",
        "streambuf/_iteration.py",
        "            groups = self.ledger.groups() + (list(env.groups.values()) if env else [])",
        "            groups = self.ledger.groups()",
        f"{STAGE}::test_a_state_taken_before_a_resumed_group_is_made_again_still_names_it",
    ),
    _m(
        "resume: a resumed iteration's state before its source opens says the epoch's start",
        "streambuf/_iteration.py",
        "            if src is None and (self.resume is not None or self.progress is not None):",
        "            if False:",
        f"{STAGE}::test_a_state_taken_before_a_resumed_group_is_made_again_still_names_it",
    ),
    _m(
        "elastic: equal batch counts count a partly delivered sample whole (its delivered "
        "children not taken off)",
        "streambuf/sharding.py",
        "        return left - progress.delivered_children(self.shards, self.stride, self.offset)",
        "        return left",
        f"{STAGE}::test_equal_batch_counts_after_an_elastic_resume_count_children_delivered",
    ),
    _m(
        "stage state: a stage owning state before a shuffle resumes a mid-epoch state anyway",
        "streambuf/_state.py",
        "    if unresumable is not None and not complete:",
        "    if False:",
        f"{STAGE}::test_state_after_a_reordering_stage_is_refused_not_resumed_wrong",
    ),
    _m(
        "stage fingerprint: values JSON cannot hold written by their repr (addresses)",
        "streambuf/compose.py",
        "cfg = json.dumps(self.config(), sort_keys=True, default=_stable)",
        "cfg = json.dumps(self.config(), sort_keys=True, default=repr)",
        f"{STAGE}::test_a_stage_fingerprint_is_the_same_in_every_process",
    ),
    _m(
        "stage errors: an error raised upstream is noted as raised in the stage",
        "streambuf/compose.py",
        "                    if exc is not self.upstream:",
        "                    if True:",
        f"{STAGE}::test_an_error_raised_upstream_of_a_stage_is_not_blamed_on_it",
    ),
    _m(
        "stage state: a value JSON cannot hold is snapshotted unchecked",
        "streambuf/compose.py",
        "            try:\n                json.dumps(before)",
        "            try:\n                pass",
        f"{STAGE}::test_a_state_value_json_cannot_hold_is_refused_naming_the_stage",
    ),
]
