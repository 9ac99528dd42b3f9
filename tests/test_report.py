"""Where the time goes: pipelines with one deliberately slow stage (each in turn: the
source's I/O, a map, decode, a threaded map, the consumer) through a real Loader with 2
worker processes; ``loader.report()`` names that stage, and the counters agree with an
independent measurement (wall time taken around the slow function) within 10%."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

import streambuf as sb
from streambuf._diagnosis import diagnose
from tests.sources.helpers import make_shards
from tests.sources.httpserver import FaultyServer

pytestmark = pytest.mark.timeout(120)

# wall ns spent inside the slow function, over every worker (shared memory, made before
# the workers fork): the independent measurement
SPENT = multiprocessing.Value("q", 0, lock=True)


def _timed_sleep(seconds: float) -> None:
    t = time.perf_counter_ns()
    time.sleep(seconds)
    with SPENT.get_lock():
        SPENT.value += time.perf_counter_ns() - t


def slow(x: Any) -> Any:
    _timed_sleep(0.004)
    return x


def slow_expand(shard: int) -> Any:
    for i in range(12):
        _timed_sleep(0.004)
        yield shard * 100 + i


def slow_decode(data: bytes) -> int:
    _timed_sleep(0.004)
    return len(data)


def _run(pipe: sb.Pipeline, *, pause_s: float = 0.0) -> sb.Loader:
    SPENT.value = 0
    loader = sb.Loader(  # fork: the workers add to SPENT, made in this process
        pipe,
        num_workers=2,
        max_batches=4,
        max_bytes="16MiB",
        timeout_s=60,
        multiprocessing_context="fork",
    )
    for _ in loader:
        if pause_s:
            time.sleep(pause_s)
    return loader


def _stage(loader: sb.Loader, name: str) -> sb.StageStats:
    return next(s for s in loader.stats().stages if s.stage == name)


def _bottleneck(loader: sb.Loader) -> str:
    report = loader.report()
    line = report.splitlines()[-1]
    assert line.startswith("bottleneck: "), report
    return line


def test_slow_map_is_named_and_timed() -> None:
    loader = _run(sb.Pipeline(list(range(96))).map(slow).map(abs).batch(8))
    line = _bottleneck(loader)
    assert line.startswith("bottleneck: map(slow):"), loader.report()
    own = _stage(loader, "map(slow)").own_s
    assert own == pytest.approx(SPENT.value / 1e9, rel=0.1, abs=0.03)
    assert _stage(loader, "map(slow)").items == 96
    assert _stage(loader, "batch").items == 12 and _stage(loader, "downstream").items == 12


def test_slow_source_is_named_and_timed() -> None:
    pipe = sb.Pipeline(list(range(8)), expand=slow_expand).map(abs).batch(6)
    loader = _run(pipe)
    assert _bottleneck(loader).startswith("bottleneck: source (expand slow_expand):")
    own = _stage(loader, "source (expand slow_expand)").own_s
    assert own == pytest.approx(SPENT.value / 1e9, rel=0.1, abs=0.03)


def test_slow_threaded_map_function_is_timed_on_its_threads() -> None:
    """Behind a threaded map the chain only waits; its function's time, counted on its
    threads, is what the report weighs (here: waiting, so more threads)."""
    loader = _run(sb.Pipeline(list(range(96))).map(slow, threads=2).batch(8))
    line = _bottleneck(loader)
    assert line.startswith("bottleneck: map(slow):") and "threads" in line, loader.report()
    s = _stage(loader, "map(slow)")
    assert s.fn_calls == 96 and s.fn_s == pytest.approx(SPENT.value / 1e9, rel=0.1, abs=0.03)
    assert s.fn_cpu_s < 0.5 * s.fn_s  # a sleep waits


def test_slow_decode_of_tar_shards_is_named(tmp_path: Path) -> None:
    make_shards(tmp_path, 2, 16)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    pipe = sb.shards(urls).decode({"bin": slow_decode}).batch(4)
    loader = _run(pipe)
    assert _bottleneck(loader).startswith("bottleneck: map(decode):"), loader.report()
    assert _stage(loader, "map(decode)").own_s == pytest.approx(
        SPENT.value / 1e9, rel=0.1, abs=0.03
    )


def test_slow_reads_over_http_name_the_source(tmp_path: Path) -> None:
    """The source's I/O: every request to the server waits 40 ms (the samples are tiny)."""
    make_shards(tmp_path, 6, 4)
    with FaultyServer(tmp_path) as server:
        server.latency_s = 0.04
        urls = [f"{server.base_url}/{p.name}" for p in sorted(tmp_path.glob("*.tar"))]
        loader = _run(sb.shards(urls, lanes=1).batch(4))
    assert _bottleneck(loader).startswith("bottleneck: source (tar):"), loader.report()
    assert "lanes" in _bottleneck(loader)


def test_slow_consumer_is_named() -> None:
    loader = _run(sb.Pipeline(list(range(64))).map(abs).batch(8), pause_s=0.15)
    line = _bottleneck(loader)
    assert line.startswith("bottleneck: consumer:") and "ready" in line, loader.report()
    # the workers waited to hand batches on while the loop slept (8 x 150 ms)
    assert _stage(loader, "downstream").own_s > 0.5, loader.report()


def test_diagnosis_rules_on_numbers() -> None:
    """The rule alone: the costliest link, a threaded map's function over its threads,
    no verdict before anything was counted."""
    a = sb.StageStats("source (items)", 100, 0.5, 0.005)
    b = sb.StageStats("map(f)", 100, 2.0, 0.02, fn_s=8.0, fn_cpu_s=7.5, fn_calls=100)
    c = sb.StageStats("downstream", 10, 0.1, 0.01)
    found = diagnose([a, b, c], threads=[1, 16, 1])  # 8 s over 16 threads: 0.5 s
    assert found is not None and found.stage == "source (items)"
    found = diagnose([a, b, c], threads=[1, 2, 1])  # 4 s: computing
    assert found is not None and found.stage == "map(f)" and "computes" in found.advice
    assert diagnose([sb.StageStats("source (items)", 0, 0.0, 0.0)]) is None


def test_without_workers_the_loop_is_the_consumer() -> None:
    """num_workers=0: downstream is the loop itself; a slow loop is named the consumer."""
    loader = sb.Loader(
        sb.Pipeline(list(range(32))).batch(4), num_workers=0, max_batches=1, max_bytes="1MiB"
    )
    for _ in loader:
        time.sleep(0.03)
    assert _bottleneck(loader).startswith("bottleneck: consumer:"), loader.report()
    found = diagnose(loader.stats().stages, workers=0)
    assert found is not None and "num_workers > 0" in found.advice


def test_a_gil_bound_threaded_map_is_said_to_compute() -> None:
    """Wall time per call includes waiting for the GIL: CPU is compared with the stage's
    parallel time (its function's wall over its threads), so 8 threads of pure Python
    are 'computing', not 'waiting'."""
    s = sb.StageStats("map(f)", 800, 1.0, 0.001, fn_s=8.0, fn_cpu_s=0.95, fn_calls=800)
    found = diagnose([s], threads=[8])
    assert found is not None and "computes" in found.advice, found
    s = sb.StageStats("map(g)", 800, 1.0, 0.001, fn_s=8.0, fn_cpu_s=0.05, fn_calls=800)
    found = diagnose([s], threads=[8])
    assert found is not None and "waits" in found.advice, found
