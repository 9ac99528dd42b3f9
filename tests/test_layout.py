"""The package's shape: every module is in docs/design.md's module table, and no import
circle joins its modules (imports inside functions and under TYPE_CHECKING included)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "streambuf"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        mods[rel.removesuffix(".__init__")] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Every project module ``name`` imports anywhere (and the packages above it)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            bits = t.split(".")
            for i in range(1, len(bits) + 1):
                q = ".".join(bits[:i])
                if q in mods and q != name and not name.startswith(q + "."):
                    out.add(q)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_the_package_modules():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_lazy_import_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_every_module_is_in_the_design_table():
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## Modules") : text.index("## Invariants")]
    named = set(re.findall(r"`([A-Za-z0-9_/.]+)`", table))
    missing = []
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        parts = rel.split("/")
        packages = {"/".join(parts[:i]) + "/" for i in range(1, len(parts))}
        if rel not in named and not packages & named:
            missing.append(rel)
    assert missing == [], f"add these modules to docs/design.md's module table: {missing}"


def test_every_module_says_what_it_holds():
    bare = [
        p.relative_to(ROOT).as_posix()
        for p in PKG.rglob("*.py")
        if p.name != "py.typed" and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert bare == []
