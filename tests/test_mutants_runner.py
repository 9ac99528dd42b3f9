"""The planted-bug runner's own rules (``tests/mutants.py``): the control reads a junit
file right, so a targeted test that fails unmutated, or a target that ran nothing, fails
the run; and every list is built one way with unique names."""

from __future__ import annotations

from pathlib import Path

from tests.mutants import control_from_junit
from tests.planted import all_mutants
from tests.planted._mutant import Mutant

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="0.1"/>
<testcase classname="tests.test_a" name="test_two[x]" time="0.1"/>
<testcase classname="tests.test_b.TestK" name="runTest" time="0.1"><failure message="boom"/></testcase>
<testcase classname="tests.sub.test_c" name="test_skipped" time="0.1"><skipped message="no"/></testcase>
</testsuite></testsuites>"""


def _m(*tests: str) -> Mutant:
    return Mutant("x", "streambuf/x.py", "a", "b", tests)


def test_control_reads_passes_failures_and_missing_targets(tmp_path: Path):
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    assert control_from_junit([junit], [_m("tests/test_a.py")]) == []
    assert control_from_junit([junit], [_m("tests/test_a.py::test_two")]) == []
    failed = control_from_junit([junit], [_m("tests/test_b.py::TestK")])
    assert len(failed) == 1 and "failed unmutated" in failed[0]
    assert "no test ran" in control_from_junit([junit], [_m("tests/test_a.py::test_three")])[0]
    assert "no test ran" in control_from_junit([junit], [_m("tests/sub/test_c.py")])[0]


SERIAL = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.sub.test_c" name="test_timed" time="0.1"/>
<testcase classname="tests.test_d" name="test_bad" time="0.1"><error message="boom"/></testcase>
</testsuite></testsuites>"""


def test_control_reads_the_parallel_and_the_serial_part_together(tmp_path: Path):
    """``make pytest`` writes two junit files: a target is run if either ran it, and a
    failure in either fails it."""
    parallel, serial = tmp_path / "p.xml", tmp_path / "s.xml"
    parallel.write_text(JUNIT)
    serial.write_text(SERIAL)
    both = [parallel, serial]
    assert control_from_junit(both, [_m("tests/sub/test_c.py")]) == []  # ran in the serial
    assert "no test ran" in control_from_junit([parallel], [_m("tests/sub/test_c.py")])[0]
    assert control_from_junit(both, [_m("tests/test_a.py", "tests/sub/test_c.py")]) == []
    failed = control_from_junit(both, [_m("tests/test_d.py")])
    assert len(failed) == 1 and "failed unmutated" in failed[0]


def test_every_planted_bug_names_a_test_and_a_unique_name():
    bugs = all_mutants()
    assert len({m.name for m in bugs}) == len(bugs)
    assert all(m.tests and all(t.startswith("tests/") for t in m.tests) for m in bugs)
    assert all(m.old != m.new for m in bugs)


def test_every_planted_bug_applies_once_and_compiles():
    """A bug whose text no longer occurs once in its file (the code it names was edited:
    *stale*) or whose change does not compile (*broken*: it replaced the head of a line
    that went on, leaving ``pass.atexit = False``) fails here in a second, not at the end
    of ``make mutants``."""
    root = Path(__file__).resolve().parent.parent
    stale, broken = [], []
    for m in all_mutants():
        source = (root / m.path).read_text(encoding="utf-8")
        if source.count(m.old) != 1:
            stale.append(f"{m.name} ({m.path}: {source.count(m.old)} occurrences)")
        elif m.path.endswith(".py"):
            try:
                compile(source.replace(m.old, m.new), m.path, "exec")
            except SyntaxError as exc:
                broken.append(f"{m.name}: {exc}")
    assert not stale and not broken, (stale, broken)
