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
* **Cheap to start**: each bug's pytest is forked from ``tests/_forkserver.py``, which
  imported torch & co once (about 1 s a bug instead of 4 on 2 cores). ``make mutants``'
  own control runs through the same server. A fork starts faster, nothing else: a
  verdict that differs with ``--no-fork-server`` (a fresh interpreter per bug) means a
  test that guesses timings, to be fixed like any unsteady one.

Prints ``N of N mutants killed`` and exits 1 unless every one was killed.

    python tests/mutants.py                 # all (control run first)
    python tests/mutants.py budget          # those whose name contains "budget"
    python tests/mutants.py --repeat 3      # each three times
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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
        if _SERVER is not None:
            rc, output = _SERVER.pytest(dst, [*_PYTEST_ARGS, "-x", *m.tests], TIMEOUT_S)
        else:
            proc = _pytest(dst, m.tests, "-x")
            rc, output = (
                (None, "") if proc is None else (proc.returncode, proc.stdout + proc.stderr)
            )
        if rc is None:
            return "timeout", time.monotonic() - t0
        if rc == 0:
            return "survived", time.monotonic() - t0
        if rc != 1:  # 2+: collection/usage errors (or a crash) are not a kill
            print(f"    pytest exit {rc}:\n{output[-2000:]}")
            return "broken", time.monotonic() - t0
        return "killed", time.monotonic() - t0


_ENV = {"STREAMBUF_MUTANTS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
_PYTEST_ARGS = ("-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


class ForkServer:
    """Client of ``tests/_forkserver.py``: ``pytest(cwd, args, timeout_s)`` runs pytest in
    a child forked from a process that imported torch & co once. Thread-safe; a timeout
    kills the child's process group and returns ``(None, output)``."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "_forkserver.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(os.environ, **_ENV),
        )
        assert self._proc.stdout is not None
        first = self._proc.stdout.readline()
        if not first or not json.loads(first).get("ready"):
            raise RuntimeError("the fork server did not start")
        self._lock = threading.Lock()
        self._next = 0
        self._pids: dict[int, Future[int]] = {}
        self._rcs: dict[int, Future[int]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            msg = json.loads(line)
            with self._lock:
                table = self._pids if "pid" in msg else self._rcs
                fut = table.pop(msg["id"])
            fut.set_result(msg["pid"] if "pid" in msg else msg["rc"])
        with self._lock:  # the server ended: nobody waits forever
            for fut in [*self._pids.values(), *self._rcs.values()]:
                fut.set_exception(RuntimeError("the fork server ended"))

    def pytest(self, cwd: Path, args: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
        log = cwd / "pytest.log"
        pid_f: Future[int] = Future()
        rc_f: Future[int] = Future()
        with self._lock:
            self._next += 1
            rid = self._next
            self._pids[rid], self._rcs[rid] = pid_f, rc_f
            req = {"id": rid, "cwd": str(cwd), "args": list(args), "log": str(log), "env": _ENV}
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(req) + "\n").encode())
            self._proc.stdin.flush()
        pid = pid_f.result(timeout=60)
        try:
            rc: int | None = rc_f.result(timeout=timeout_s)
        except TimeoutError:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc_f.result(timeout=60)
            rc = None
        else:  # the child's workers may outlive it in its group: end them too
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return rc, log.read_text(errors="replace") if log.exists() else ""

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


_SERVER: ForkServer | None = None


def _pytest(
    cwd: Path, tests: Sequence[str], *extra: str, timeout_s: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str] | None:
    env = dict(os.environ, **_ENV)
    cmd = [sys.executable, "-m", "pytest", *_PYTEST_ARGS, *extra, *tests]
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


def control_from_junit(paths: Sequence[Path], chosen: Sequence[Mutant]) -> list[str]:
    """Problems with the unmutated run recorded in pytest junit files (``make pytest``
    writes two: the parallel part and the serial one): a targeted test that failed, or a
    target that ran no test (or only skipped ones)."""
    cases = [c for path in paths for c in ET.parse(path).getroot().iter("testcase")]
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
        args = [*_PYTEST_ARGS, f"--junitxml={junit}", *_targets(chosen)]
        if _SERVER is not None:  # the same way the planted bugs will run
            rc, output = _SERVER.pytest(dst, args, CONTROL_TIMEOUT_S)
        else:
            proc = _pytest(dst, args[len(_PYTEST_ARGS) :], timeout_s=CONTROL_TIMEOUT_S)
            rc, output = (
                (None, "") if proc is None else (proc.returncode, proc.stdout + proc.stderr)
            )
        if rc is None:
            return ["the control run timed out"]
        if not junit.exists():
            return [f"the control run wrote no report (pytest exit {rc})"]
        problems = control_from_junit([junit], chosen)
        if rc != 0 and not problems:
            problems.append(f"the control run failed (pytest exit {rc})")
        if problems:
            print(output[-6000:])
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
        nargs="+",
        help="take the control from these pytest junit files of the unmutated suite (make "
        "test's own run) instead of running the targeted tests once more",
    )
    parser.add_argument("--repeat", type=int, default=1, help="run each planted bug N times")
    parser.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start a fresh interpreter per planted bug (slower; the fork server imports "
        "torch & co once and forks a child per bug)",
    )
    args = parser.parse_args(argv)
    chosen = [m for m in all_mutants() if not args.names or any(a in m.name for a in args.names)]
    t0 = time.monotonic()
    global _SERVER
    if not args.no_fork_server and hasattr(os, "fork"):
        _SERVER = ForkServer()
    try:
        return _run(args, chosen, t0)
    finally:
        if _SERVER is not None:
            _SERVER.close()


def _run(args: argparse.Namespace, chosen: Sequence[Mutant], t0: float) -> int:
    if args.control_junit is not None:
        how = " + ".join(map(str, args.control_junit))
        problems = control_from_junit(args.control_junit, chosen)
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
