"""The planted bugs of "drop-in checkpointing" (issue 27): the state digest and the
``torch.distributed.checkpoint`` wrapper. Each must make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

DCP = "tests/test_dcp.py"

_m = planted("checkpoints")

MUTANTS = [
    _m(
        "state digest: a state assembled from two ranks' fields is loaded",
        "streambuf/_state.py",
        '    if "digest" in state and digest(state) not in (state["digest"], None):',
        '    if False and "digest" in state and digest(state) not in (state["digest"], None):',
        f"{DCP}::test_state_assembled_from_two_ranks_is_refused",
    ),
    _m(
        "state digest: a rank-specific field is left out of it",
        "streambuf/_state.py",
        '    body = {k: v for k, v in state.items() if k not in ("names", "digest")}',
        '    body = {k: v for k, v in state.items() if k not in ("names", "digest", "workers")}',
        f"{DCP}::test_state_assembled_from_two_ranks_is_refused",
    ),
    _m(
        "Pipeline.load_state_dict: the loaded state is not used (a StatefulDataLoader "
        "resumes from the epoch's start)",
        "streambuf/pipeline.py",
        "        self._resume = _state.check_loadable(self, state)",
        "        _state.check_loadable(self, state)",
        "tests/test_stateful_dataloader.py",
    ),
    _m(
        "DistributedState: saves this rank's state only (not gathered)",
        "streambuf/checkpointing.py",
        "    if dist.get_world_size(group) == 1:",
        "    if True:",
        f"{DCP}::test_dcp_round_trip_on_two_gloo_ranks_exact_then_elastic",
    ),
    _m(
        "sizing: the package's nbytes pickles by value (a registered lambda breaks spawn)",
        "streambuf/sizing.py",
        '        if self is nbytes:\n            return "nbytes"',
        '        if False:\n            return "nbytes"',
        "tests/test_sizing.py::test_register_custom_type_and_subclass",
    ),
    _m(
        "DistributedState: ranks holding the same data rank are all kept",
        "streambuf/checkpointing.py",
        "    return list(seen.values())",
        "    return out",
        f"{DCP}::test_ranks_of_one_data_rank_give_one_state",
    ),
    _m(
        "mix resume: a changed source is searched for anywhere in the saved mix",
        "streambuf/_state.py",
        "        if saved.startswith(fp + end, pos):",
        "        if fp in saved:",
        "tests/test_mixing.py::test_a_changed_mixed_source_is_read_at_its_place",
    ),
    _m(
        "ranks whose loaders split the data differently are not told apart",
        "streambuf/checkpointing.py",
        "        if any(v != values[0] for v in values):",
        "        if False:",
        "tests/test_dcp.py::test_ranks_that_split_the_data_differently_are_refused",
    ),
    _m(
        "ranks compare the shard count and names, not the items' identity (token_files)",
        "streambuf/_source_kinds.py",
        "        return self.fingerprint()  # the items' identity is all a sequence adds",
        '        return ""',
        "tests/test_dcp.py::test_ranks_that_split_the_data_differently_are_refused",
    ),
    _m(
        "ranks compare a mix by its source count alone",
        "streambuf/mixing.py",
        "(data_identity(p) for p in self.pipelines)",
        "(str(len(self.pipelines)))",
        "tests/test_dcp.py::test_ranks_that_split_the_data_differently_are_refused",
    ),
    _m(
        "ranks do not compare equalize",
        "streambuf/checkpointing.py",
        '        "equalize": [sharding.equalize, sharding.samples_per_shard],',
        '        "equalize": None,',
        "tests/test_dcp.py::test_ranks_that_split_the_data_differently_are_refused",
    ),
]
