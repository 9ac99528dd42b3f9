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
        "            ns += dt - cell[0]\n            cell[0] = outer + dt\n            n += 1",
        "            ns += dt\n            cell[0] = outer + dt\n            n += 1",
        f"{R}::test_slow_map_is_named_and_timed",
    ),
    _m(
        "meter: the last counts of a link are not flushed when it ends",
        "streambuf/_meter.py",
        "        counters.add(worker, {ns_key: ns, items_key: n - flushed})\n        close =",
        "        close =",
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
        "        return s.fn_s / max(1, threads)",
        "        return s.fn_s",
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
]
