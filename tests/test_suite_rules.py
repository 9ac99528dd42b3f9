"""Rules of the suite itself: ``make pytest`` runs most tests two at a time
(pytest-xdist) and the ones marked ``serial`` alone, so a test that reads machine-wide
memory or ``/dev/shm`` must be marked: a neighbour's processes would move what it reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# what reads state shared by every process on the machine
MACHINE_WIDE = re.compile(r"memwatch|MemoryWatch|/dev/shm|/proc/meminfo")


def _marked_serial(decorators: list[ast.expr]) -> bool:
    return any("mark.serial" in ast.unparse(d) for d in decorators)


def _module_serial(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "mark.serial" in ast.unparse(node.value)
    return False


def unmarked_machine_wide_tests(source: str) -> list[str]:
    """Test functions (and test classes) in ``source`` whose code reads machine-wide state
    (directly, or through a module-level helper it calls) without the ``serial`` mark."""
    tree = ast.parse(source)
    if _module_serial(tree):
        return []
    helpers = {
        n.name: ast.get_source_segment(source, n) or ""
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("test")
    }
    reads = {name for name, text in helpers.items() if MACHINE_WIDE.search(text)}
    out = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.ClassDef) or not node.name.startswith(
            ("test", "Test")
        ):
            continue
        text = ast.get_source_segment(source, node) or ""
        calls = {
            n.func.id
            for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        if (MACHINE_WIDE.search(text) or calls & reads) and not _marked_serial(node.decorator_list):
            out.append(node.name)
    return out


def test_every_test_reading_machine_wide_state_is_serial() -> None:
    found = {
        str(p.relative_to(TESTS)): bad
        for p in sorted(TESTS.rglob("test_*.py"))
        if p.name != Path(__file__).name
        for bad in [unmarked_machine_wide_tests(p.read_text())]
        if bad
    }
    assert not found, f"mark these @pytest.mark.serial (or the module's pytestmark): {found}"


def test_the_rule_sees_a_direct_read_a_helper_and_a_mark() -> None:
    src = """
import os, pytest

def _shm():
    return set(os.listdir("/dev/shm"))

def test_direct():
    open("/proc/meminfo").read()

def test_through_a_helper():
    assert _shm() is not None

@pytest.mark.serial
def test_marked():
    assert _shm() is not None

def test_plain():
    print(sorted([2, 1]))
"""
    assert unmarked_machine_wide_tests(src) == ["test_direct", "test_through_a_helper"]
    module_marked = src.replace(
        "import os, pytest\n", "import os, pytest\npytestmark = [pytest.mark.serial]\n"
    )
    assert unmarked_machine_wide_tests(module_marked) == []
