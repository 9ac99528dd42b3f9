"""Faults with real processes: SIGKILL of a worker, SIGINT to the main process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streambuf import Loader, Pipeline, WorkerError
from tests.pipeline_data import sleepy

# serial: deaths and silences reported within time bounds (make pytest runs it alone)
pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[1]


def test_worker_killed_gives_clear_error_within_timeout():
    pipe = Pipeline(list(range(100_000))).map(sleepy).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=10)
    it = iter(loader)
    next(it)
    victim = loader.worker_pids()[0]
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        os.kill(victim, signal.SIGKILL)
        for _ in range(100_000):
            next(it)
    assert time.monotonic() - t0 < 15
    text = str(info.value)
    assert str(victim) in text and ("exited" in text or "killed" in text), text
    it.close()


def test_silent_worker_is_a_worker_error_within_its_timeout():
    """A worker that hangs without dying (SIGSTOP) with timeout_s=2: WorkerError after
    2 s, and the loop gets it promptly (shutdown does not wait for the stopped worker)."""
    pipe = Pipeline(list(range(100_000))).map(sleepy).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=2)
    it = iter(loader)
    next(it)
    pids = loader.worker_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(WorkerError) as info:
            for _ in range(100_000):
                next(it)
        took = time.monotonic() - t0
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert 2.0 <= took <= 4.5, took
    assert "timeout_s=2" in str(info.value)
    it.close()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" in f.read()
    except FileNotFoundError:
        return True


def test_sigint_to_main_process_exits_cleanly(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import signal, sys, time
            # a background job inherits SIGINT ignored; a terminal user gets Python's handler
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.path.insert(0, {str(ROOT)!r})
            from streambuf import Loader, Pipeline
            from tests.pipeline_data import sleepy

            pipe = Pipeline(list(range(100_000))).map(sleepy, threads=2).batch(4)
            loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB")
            it = iter(loader)
            next(it)
            pids = loader.worker_pids()
            print("PIDS", *pids, flush=True)
            try:
                for _ in it:
                    time.sleep(0.01)
            except KeyboardInterrupt:
                print("INTERRUPTED", flush=True)
                raise
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), proc.stderr.read() if proc.stderr else line
    pids = [int(p) for p in line.split()[1:]]
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert "INTERRUPTED" in out
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), "a worker outlived the main process"
    assert time.monotonic() - t0 < 15


def _proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_workers_exit_when_the_main_process_is_killed(tmp_path, mp_context):
    """SIGKILL the main process (OOM killer, preemption) while its 2 workers are blocked:
    one on credits (a consumer that stopped taking batches), the other with lane threads
    busy in a threaded map. Every worker must be gone within 10 s."""
    script = tmp_path / "orphan.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(ROOT)!r})
            from streambuf import Loader, Pipeline
            from tests.pipeline_data import sleepy

            if __name__ == "__main__":
                pipe = Pipeline(list(range(100_000))).map(sleepy, threads=3).batch(4)
                loader = Loader(pipe, num_workers=2, max_batches=2, max_bytes="1MiB",
                                multiprocessing_context={mp_context!r}, adaptive=False)
                it = iter(loader)
                next(it)
                print("PIDS", *loader.worker_pids(), flush=True)
                time.sleep(600)  # stop consuming: workers block on credits and lanes
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PIDS"), proc.stderr.read() if proc.stderr else line
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2 and all(_proc_ppid(p) == proc.pid for p in pids)
    time.sleep(1.0)  # let them fill the credits and block
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if not _gone(p)]
    for p in alive:  # do not leave them behind if the test fails
        os.kill(p, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their main process (orphaned)"


@pytest.mark.timeout(60)
def test_a_loop_closed_as_the_interpreter_ends_starts_no_thread(monkeypatch):
    """A generator closed while the interpreter shuts down (a loop left by the exception
    that ends the program) must not start a thread (one started then never runs, and
    ``start()`` can wait for it forever): its workers are killed and shut down in the
    closing thread. The interpreter's state is faked: finalizing, and no thread may
    start (the SIGINT test above meets the real one, where whether ``start()`` waits
    depends on how far the shutdown went)."""
    import types

    import streambuf.loader as loader_mod
    from tests.pipeline_data import sleepy

    class NoThread:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a thread was started while the interpreter shuts down")

    pipe = Pipeline(list(range(100_000))).map(sleepy, threads=2).batch(4)
    loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=30)
    it = iter(loader)
    next(it)
    procs = list(loader._dl_iter._workers)
    monkeypatch.setattr(loader_mod, "sys", types.SimpleNamespace(is_finalizing=lambda: True))
    monkeypatch.setattr(loader_mod, "threading", types.SimpleNamespace(Thread=NoThread))
    it.close()
    monkeypatch.undo()
    for p in procs:
        p.join(timeout=10)
        assert not p.is_alive(), p
    loader.close()
