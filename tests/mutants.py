"""``make mutants``: plant known bugs one at a time and check the suite catches each.

The planted bugs are listed in ``tests/planted`` (one list per part of the package). Each
replaces one exact snippet of one file (it must occur exactly once: a bug that no longer
applies is an error, so the lists follow the code when it moves) in a scratch copy of
the repository, then runs only the tests that guard that code (``-x``, hypothesis
without shrinking). A bug is *killed* when those tests fail. Rules that make the verdict
worth trusting:

* **Control first**: every targeted test must pass unmutated, or the run fails (from
  the junit file of ``make test``'s own suite run, or by running them once here).
* **A timeout is not a kill**: it is reported and fails the run.
* **Never more jobs than cores** (``MUTANT_JOBS`` may lower it): the tests have timing
  bounds.
* **Deterministic**: ``--repeat N`` runs each bug N times; one that is caught only
  sometimes is reported as unsteady and fails the run.

Prints ``N of N mutants killed`` and exits 1 unless every one was killed.

    python tests/mutants.py                 # all (control run first)
    python tests/mutants.py budget          # those whose name contains "budget"
    python tests/mutants.py --repeat 3      # each three times
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: tests/ is not a package root then
    sys.path.insert(0, str(ROOT))

from tests.planted import Mutant, all_mutants  # noqa: E402

TIMEOUT_S = 240
CONTROL_TIMEOUT_S = 900


def _copy_tree(dst: Path) -> None:
    for name in ("streambuf", "tests", "examples"):
        shutil.copytree(
            ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)


def run_one(m: Mutant) -> tuple[str, float]:
    """'killed', 'survived', 'timeout', 'broken' or 'stale' (no longer applies), and the
    seconds it took. Only 'killed' counts: a hang that the timeout ends is reported, not
    counted (a hang worth catching is worth a test with its own timeout)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="streambuf-mutant-") as tmp:
        dst = Path(tmp)
        _copy_tree(dst)
        target = dst / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            return "stale", time.monotonic() - t0
        target.write_text(text.replace(m.old, m.new))
        proc = _pytest(dst, m.tests, "-x")
        if proc is None:
            return "timeout", time.monotonic() - t0
        if proc.returncode == 0:
            return "survived", time.monotonic() - t0
        if proc.returncode not in (1,):  # 2+: collection/usage errors are not a kill
            tail = (proc.stdout + proc.stderr)[-2000:]
            print(f"    pytest exit {proc.returncode}:\n{tail}")
            return "broken", time.monotonic() - t0
        return "killed", time.monotonic() - t0


def _pytest(
    cwd: Path, tests: Sequence[str], *extra: str, timeout_s: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str] | None:
    env = dict(os.environ, STREAMBUF_MUTANTS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, *tests]
    try:
        return subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None


# -- the control: every targeted test passes unmutated ----------------------------------
def _targets(chosen: Sequence[Mutant]) -> list[str]:
    return sorted({t for m in chosen for t in m.tests})


def _matches(target: str, classname: str, name: str) -> bool:
    """Whether a junit testcase (``classname``, ``name``) is one of ``target``'s tests."""
    path, *parts = target.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    if classname != module and not classname.startswith(module + "."):
        return False
    rest = classname[len(module) + 1 :].split(".") if classname != module else []
    want_cls = [p for p in parts if not p.startswith("test")]
    want_fn = [p for p in parts if p.startswith("test")]
    if want_cls and rest[: len(want_cls)] != want_cls:
        return False
    return not want_fn or name == want_fn[0] or name.startswith(want_fn[0] + "[")


def control_from_junit(path: Path, chosen: Sequence[Mutant]) -> list[str]:
    """Problems with the unmutated run recorded in a pytest junit file: a targeted test
    that failed, or a target that ran no test (or only skipped ones)."""
    cases = ET.parse(path).getroot().iter("testcase")
    rows = [(c.get("classname", ""), c.get("name", ""), [x.tag for x in c]) for c in cases]
    problems = []
    for target in _targets(chosen):
        mine = [r for r in rows if _matches(target, r[0], r[1])]
        ran = [r for r in mine if "skipped" not in r[2]]
        bad = [f"{r[0]}::{r[1]}" for r in mine if {"failure", "error"} & set(r[2])]
        if not ran:
            problems.append(f"{target}: no test ran")
        elif bad:
            problems.append(f"{target}: failed unmutated: {', '.join(bad[:3])}")
    return problems


def control_run(chosen: Sequence[Mutant]) -> list[str]:
    """The targeted tests in a scratch copy, unmutated: all must pass."""
    with tempfile.TemporaryDirectory(prefix="streambuf-control-") as tmp:
        dst = Path(tmp)
        _copy_tree(dst)
        junit = dst / "control.xml"
        proc = _pytest(dst, _targets(chosen), f"--junitxml={junit}", timeout_s=CONTROL_TIMEOUT_S)
        if proc is None:
            return ["the control run timed out"]
        if not junit.exists():
            return [f"the control run wrote no report (pytest exit {proc.returncode})"]
        problems = control_from_junit(junit, chosen)
        if proc.returncode != 0 and not problems:
            problems.append(f"the control run failed (pytest exit {proc.returncode})")
        if problems:
            print((proc.stdout + proc.stderr)[-6000:])
        return problems


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="run the planted bugs whose name has one")
    parser.add_argument(
        "--control-junit",
        type=Path,
        help="take the control from this pytest junit file of the unmutated suite (make "
        "test's own run) instead of running the targeted tests once more",
    )
    parser.add_argument("--repeat", type=int, default=1, help="run each planted bug N times")
    args = parser.parse_args(argv)
    chosen = [m for m in all_mutants() if not args.names or any(a in m.name for a in args.names)]
    t0 = time.monotonic()
    if args.control_junit is not None:
        problems, how = control_from_junit(args.control_junit, chosen), str(args.control_junit)
    else:
        problems, how = control_run(chosen), "a run of the targeted tests"
    n_targets = len(_targets(chosen))
    if problems:
        print(f"control FAILED ({how}): the targeted tests must pass unmutated")
        for p in problems:
            print(f"    {p}")
        return 1
    print(f"control passed: {n_targets} targets, unmutated ({how}, {time.monotonic() - t0:.0f} s)")
    # Never more at once than cores: a mutant's tests include timing bounds.
    jobs = max(1, min(int(os.environ.get("MUTANT_JOBS", "99")), _cores()))
    runs = [m for m in chosen for _ in range(max(1, args.repeat))]
    verdicts: dict[str, list[str]] = {m.name: [] for m in chosen}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for m, (verdict, took) in zip(runs, pool.map(run_one, runs)):
            verdicts[m.name].append(verdict)
            print(f"{verdict:>8}  {took:5.1f} s  {m.name}", flush=True)
    killed = sum(all(v == "killed" for v in vs) for vs in verdicts.values())
    unsteady = [n for n, vs in verdicts.items() if len(set(vs)) > 1]
    took = time.monotonic() - t0
    for n in unsteady:
        print(f"unsteady (a flaky test): {n}: {verdicts[n]}")
    print(f"{killed} of {len(chosen)} mutants killed ({took:.0f} s, {jobs} at a time)")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
