"""The planted bugs of "where the time goes" (issue 27): the per-stage meter and the
diagnosis. Each must make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

R = "tests/test_report.py"

_m = planted("report")

MUTANTS = [
    _m(
        "meter: a link's time includes the links it calls (inclusive, not its own)",
        "streambuf/_meter.py",
        "                dt = clock() - t\n                ns += dt - cell[0]\n                cell[0] = outer + dt\n            n += 1",
        "                dt = clock() - t\n                ns += dt\n                cell[0] = outer + dt\n            n += 1",
        f"{R}::test_slow_map_is_named_and_timed",
    ),
    _m(
        "meter: the last counts of a link are not flushed when it ends",
        "streambuf/_meter.py",
        "        flush()\n        if held is not None:  # the run ended",
        "        if held is not None:  # the run ended",
        f"{R}::test_slow_map_is_named_and_timed",
    ),
    _m(
        "meter: a threaded map's function time is not counted on its threads",
        "streambuf/stages.py",
        "        if env.meter is not None:\n            fn = env.meter.timed(fn, k, env.worker)",
        "        if False:\n            fn = env.meter.timed(fn, k, env.worker)",
        f"{R}::test_slow_threaded_map_function_is_timed_on_its_threads",
    ),
    _m(
        "diagnosis: a threaded map's function time is not spread over its threads",
        "streambuf/_diagnosis.py",
        "        n = max(1, threads)\n",
        "        n = 1\n",
        f"{R}::test_diagnosis_rules_on_numbers",
    ),
    _m(
        "diagnosis: a consumer that never waits is not recognised",
        "streambuf/_diagnosis.py",
        "    if wait_fraction is not None and wait_fraction < CONSUMER_WAIT and any(",
        "    if wait_fraction is not None and wait_fraction < 0 and any(",
        f"{R}::test_slow_consumer_is_named",
    ),
    _m(
        "report: time handing outputs on is not counted (downstream)",
        "streambuf/_iteration.py",
        "                    ns += clock() - t\n                    n += 1",
        "                    n += 1",
        f"{R}::test_slow_consumer_is_named",
    ),
    _m(
        "meter: a link's CPU includes the CPU of the links it calls",
        "streambuf/_meter.py",
        "                    cpu += dc - cell[1]\n",
        "                    cpu += dc\n",
        f"{R}::test_cpu_of_a_stage_in_the_worker_thread_tells_computing_from_waiting",
    ),
    _m(
        "meter: the calls inside a sampled call are not all sampled",
        "streambuf/_meter.py",
        "            if n >= nxt or cell[2]:  # a sampled call",
        "            if n >= nxt:",
        f"{R}::test_cpu_of_a_stage_in_the_worker_thread_tells_computing_from_waiting",
    ),
    _m(
        "meter: what a stage held stays in its gauge after the run ends",
        "streambuf/_meter.py",
        "            raw[i_held] = raw[i_held_bytes] = 0",
        "            pass",
        f"{R}::test_held_items_and_bytes_are_gauges_of_what_a_stage_holds",
    ),
    _m(
        "diagnosis: a stage in the worker's thread is never seen computing",
        "streambuf/_diagnosis.py",
        "        cpu = min(1.0, s.cpu_s / ran) if ran > 0 else 0.0",
        "        cpu = 0.0",
        f"{R}::test_cpu_of_a_stage_in_the_worker_thread_tells_computing_from_waiting",
    ),
    _m(
        "log_every: nothing is logged at the end of an epoch",
        "streambuf/loader.py",
        "        if self._log is not None and self._iter_batches:\n",
        "        if False:\n",
        f"{R}::test_log_every_hands_scalars_to_a_sink_in_time_and_at_the_epoch_end",
    ),
    _m(
        "log_every: the scalars handed to a sink include text",
        "streambuf/stats.py",
        '            if k in ("decisions", "bottleneck"):  # (not numbers)',
        '            if k == "decisions":',
        f"{R}::test_log_every_hands_scalars_to_a_sink_in_time_and_at_the_epoch_end",
    ),
    _m(
        "diagnosis: waiting for a busy machine's cores is taken for I/O",
        "streambuf/_diagnosis.py",
        "        ran = s.own_s - s.core_wait_s",
        "        ran = s.own_s",
        f"{R}::test_a_stage_that_waits_for_a_busy_core_is_seen_computing",
    ),
    _m(
        "meter: the time a thread waits for a core is not counted",
        "streambuf/_meter.py",
        "        raw[i_core] += _core_wait(ns)\n",
        "        _core_wait(ns)\n",
        f"{R}::test_a_stage_that_waits_for_a_busy_core_is_seen_computing",
    ),
    _m(
        "diagnosis: a threaded map costs its wall over its threads only (GIL-bound: undercounted)",
        "streambuf/_diagnosis.py",
        "        return max(s.fn_s / n, s.fn_cpu_s / min(n, _cores()))",
        "        return s.fn_s / n",
        f"{R}::test_a_threaded_map_costs_no_less_than_its_cpu_over_the_cores",
    ),
    _m(
        "diagnosis: a one-shot iterable source is advised more workers",
        "streambuf/_diagnosis.py",
        '    if s.stage == "source (iterable)":  # every worker reads it whole, keeping its share',
        "    if False:",
        f"{R}::test_advice_is_what_the_stage_can_take",
    ),
]
