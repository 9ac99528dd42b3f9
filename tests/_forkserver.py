"""A fork server for ``tests/mutants.py``: one process imports the heavy third-party
packages (torch, numpy, av, hypothesis, pytest) once, then forks a child per planted bug
that runs pytest in that bug's scratch copy. Each child starts in a second instead of
paying the imports again (about half of a mutant's cost on a 2-core machine).

Invariants: the server imports nothing of the project (``streambuf``, ``tests``), so each
child imports the mutated copy from its own directory; the server is single-threaded
when it forks (checked); each child leads its own process group, so a timeout kills it
with every worker it started.

Protocol (one JSON object per line): the client writes ``{"id", "cwd", "args", "log",
"env"}``; the server answers ``{"id", "pid"}`` once forked and ``{"id", "rc"}`` when the
child ends (``rc`` negative: killed by that signal).
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading

PRELOAD = ("numpy", "torch", "torch.utils.data", "av", "psutil", "hypothesis", "pytest")


def _child(req: dict) -> None:
    try:
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(req["cwd"])
        os.environ.update(req["env"])
        sys.dont_write_bytecode = True
        sys.path[0] = req["cwd"]  # as `python -m pytest` run there would have it
        import pytest

        rc = int(pytest.main(list(req["args"])))
    except BaseException as e:  # anything here is a usage error, never a kill
        print(f"fork server child failed: {e!r}", file=sys.stderr)
        rc = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _say(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def serve() -> None:
    for name in PRELOAD:
        __import__(name)
    leaked = [m for m in sys.modules if m.split(".")[0] in ("streambuf", "tests")]
    if leaked or threading.active_count() != 1:
        raise SystemExit(
            f"fork server not clean: modules {leaked[:3]}, threads {threading.active_count()}"
        )
    _say({"ready": True})
    pending = b""
    children: dict[int, int] = {}
    open_ = True
    while open_ or children:
        readable, _, _ = select.select([0] if open_ else [], [], [], 0.05)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                open_ = False
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(req)
                children[pid] = req["id"]
                _say({"id": req["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _say({"id": children.pop(pid), "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
