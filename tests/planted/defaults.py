"""The planted bugs of the Loader's defaults: ``num_workers``, ``max_batches``,
``max_bytes`` left at "auto" (``streambuf.resources.loader_defaults`` and the Loader's
one log line). Each must make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

_m = planted("defaults", default_file="tests/test_loader_defaults.py")

MUTANTS = [
    _m(
        "num_workers='auto' is not bounded by the machine's cores",
        "streambuf/resources.py",
        '        bounds.append((limits.cores, "the machine\'s cores"))\n',
        "        pass\n",
        "::test_never_more_workers_than_the_cores_or_torch_suggests",
    ),
    _m(
        "num_workers='auto' is not bounded by torch's suggested max (its warning fires)",
        "streambuf/resources.py",
        '        bounds.append((limits.suggested_workers, "torch\'s suggested max"))\n',
        "        pass\n",
        "::test_the_default_stays_within_what_torch_suggests",
        "::test_never_more_workers_than_the_cores_or_torch_suggests",
    ),
    _m(
        "num_workers='auto' ignores the memory a worker costs",
        "streambuf/resources.py",
        "    if by_memory < count:\n",
        "    if False:\n",
        "::test_a_small_memory_limit_means_fewer_workers_and_a_smaller_max_bytes",
    ),
    _m(
        "num_workers='auto' picks workers for a pipeline decoding onto a device",
        "streambuf/resources.py",
        "    if on_device is not None:\n",
        "    if False:\n",
        "::test_the_existing_auto_rules_are_kept",
    ),
    _m(
        "max_bytes='auto' takes all the memory available, not its share",
        "streambuf/resources.py",
        "    share = int(available * MAX_BYTES_SHARE)\n",
        "    share = available\n",
        "::test_a_small_memory_limit_means_fewer_workers_and_a_smaller_max_bytes",
        "::test_the_loader_uses_the_limits_it_reads",
    ),
    _m(
        "max_bytes='auto' does not cover the fixed stage buffers (the Loader refuses it)",
        "streambuf/resources.py",
        "    need = 2 * fixed_bytes\n",
        "    need = 0\n",
        "::test_max_bytes_auto_covers_the_fixed_stage_buffers_or_says_what_to_pin",
        "::test_a_real_loader_takes_more_than_the_share_for_a_large_pack_block",
    ),
    _m(
        "the defaults are logged every epoch, not once per Loader",
        "streambuf/loader.py",
        "        rank, world = self._rank_world()\n        plan = self._tracker.start(",
        '        _logger.info("%s", self.defaults.line())\n'
        "        rank, world = self._rank_world()\n        plan = self._tracker.start(",
        "::test_loader_with_no_arguments_runs_to_the_end_and_logs_once",
    ),
]

T = "tests/test_tune.py"
MUTANTS += [
    _m(
        "tune recommends the fewest threads within 5% of its best trial, not its best",
        "streambuf/tune.py",
        '        (t for t in trials if t["batches_per_s"] == best), key=lambda t: (_count(t), t["depth"])',
        '        (t for t in trials if t["batches_per_s"] >= 0.95 * best),\n'
        '        key=lambda t: (_count(t), t["depth"]),',
        f"{T}::test_tune_recommends_the_fastest_of_its_trials",
    ),
    _m(
        "tune tries its own worker count, not the one the Loader takes",
        "streambuf/tune.py",
        "        num_workers = auto_num_workers(lim, on_device=pipe._decodes_on())[0]",
        "        num_workers = 2",
        f"{T}::test_tune_takes_the_worker_count_the_loader_takes",
    ),
    _m(
        "tune's trial rate includes the climb of threads='auto'",
        "streambuf/tune.py",
        "    half = times[(len(times) - 1) // 2 :]",
        "    half = times",
        f"{T}::test_a_trials_rate_is_measured_over_its_second_half",
    ),
    _m(
        "tune's trials end after their batches, however short",
        "streambuf/tune.py",
        "            if len(times) >= batches and now - times[0] >= seconds:",
        "            if len(times) >= batches:",
        f"{T}::test_a_real_trial_runs_its_seconds_and_reports_the_count_it_chose",
    ),
]
MUTANTS += [
    _m(
        "num_workers='auto' takes every CPU in each of a node's processes",
        "streambuf/resources.py",
        "    if local > 1:  # each of the node's processes gets its share\n",
        "    if False:\n",
        "::test_the_processes_of_a_node_share_its_cpus_and_memory",
    ),
    _m(
        "max_bytes='auto' takes a quarter of the memory in each of a node's processes",
        "streambuf/resources.py",
        "        max_bytes, reasons[2] = auto_max_bytes(limits.available // local, fixed_bytes=fixed)",
        "        max_bytes, reasons[2] = auto_max_bytes(limits.available, fixed_bytes=fixed)",
        "::test_the_processes_of_a_node_share_its_cpus_and_memory",
    ),
    _m(
        "the node's process count is not read from LOCAL_WORLD_SIZE",
        "streambuf/resources.py",
        '    text = os.environ.get("LOCAL_WORLD_SIZE", "")',
        '    text = ""',
        "::test_the_processes_of_a_node_are_read_from_local_world_size",
    ),
]
