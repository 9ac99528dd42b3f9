"""What a checkpoint costs: ``state_dict()`` time and size, and resume time to first batch.

* **state_dict()**: a ``Loader`` (2 workers) over ``shards()`` of 10,000 tiny tar shards
  (3 lanes, a 256-sample shuffle, batches of 32) is stopped mid-epoch; ``state_dict()``
  is then taken ``calls`` times in a row: median and p99 seconds, and the state's size as
  JSON. The state holds positions only: per lane a cursor, the pending samples, the
  shuffle's pool positions; it does not grow with the number of shards.
* **Resume**: shards over a loopback HTTP server adding 50 ms to every request; time
  from ``iter(loader)`` to the first batch for a fresh start and for a resume at
  mid-epoch (each lane reopens its shard with one ranged request at its next sample and
  the pending samples are fetched by byte range), interleaved, medians. Target: resume
  at most 2x a fresh start.

    streambuf bench resume [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ._benchmark import Benchmark
from ._report import Headline, Table
from ._servers import serve
from ._shards import make_shards


def _loader(spec: str, *, workers: int, shuffle: int, batch: int) -> Any:
    import streambuf as sb

    pipe = sb.shards(spec, lanes=3, seed=1, readahead_bytes=0).shuffle(shuffle).batch(batch)
    return sb.Loader(pipe, num_workers=workers, max_batches=2 * workers, max_bytes="256MiB")


def _state_cost(root: Path, *, shards: int, calls: int) -> dict[str, Any]:
    make_shards(root, shards=shards, per_shard=2, sample_bytes=64)
    loader = _loader(str(root / "*.tar"), workers=2, shuffle=256, batch=32)
    it = iter(loader)
    for _ in range(min(40, shards * 2 // 32 // 2)):  # mid-epoch
        next(it)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        state = loader.state_dict()
        times.append(time.perf_counter() - t0)
    size = len(json.dumps(state))
    it.close()
    loader.close()
    times.sort()
    return {
        "shards": shards,
        "calls": calls,
        "median_s": statistics.median(times),
        "p99_s": times[min(len(times) - 1, int(0.99 * len(times)))],
        "state_bytes": size,
        "pending": sum(len(w["pending"]) for w in state["workers"] if w),
    }


def _first_batch(loader: Any) -> float:
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    dt = time.perf_counter() - t0
    it.close()
    loader.close()
    return dt


def _resume_cost(root: Path, *, shards: int, stop: int, repeats: int) -> dict[str, Any]:
    make_shards(root, shards=shards, per_shard=64, sample_bytes=16 << 10)
    fresh, resumed = [], []
    with serve("http", str(root), 0.05, None) as base:
        spec = base + f"/shard-{{000000..{shards - 1:06d}}}.tar"
        kw = {"workers": 2, "shuffle": 128, "batch": 16}
        for _ in range(repeats):
            fresh.append(_first_batch(_loader(spec, **kw)))
            loader = _loader(spec, **kw)
            it = iter(loader)
            for _ in range(stop):
                next(it)
            state = json.loads(json.dumps(loader.state_dict()))
            it.close()
            loader.close()
            again = _loader(spec, **kw)
            again.load_state_dict(state)
            resumed.append(_first_batch(again))
    f, r = statistics.median(fresh), statistics.median(resumed)
    return {
        "latency_s": 0.05,
        "shards": shards,
        "stop_batches": stop,
        "fresh_first_batch_s": fresh,
        "resume_first_batch_s": resumed,
        "fresh_median_s": f,
        "resume_median_s": r,
        "ratio": r / f,
    }


def _measure(mode: str) -> dict[str, Any]:
    n_shards = {"tiny": 500, "quick": 10_000, "full": 10_000}[mode]
    calls = {"tiny": 50, "quick": 300, "full": 1000}[mode]
    repeats = {"tiny": 1, "quick": 2, "full": 5}[mode]
    with tempfile.TemporaryDirectory(prefix="streambuf-bench-resume-") as tmp:
        state = _state_cost(Path(tmp) / "tiny", shards=n_shards, calls=calls)
        resume = _resume_cost(Path(tmp) / "http", shards=8, stop=12, repeats=repeats)
    return {"state_dict": state, "resume": resume}


def _state_row(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    s = report["state_dict"]
    return [(s["shards"], s["median_s"] * 1e3, s["p99_s"] * 1e3, s["state_bytes"], s["pending"])]


def _first_batch_table(report: dict[str, Any]) -> list[Table]:
    r = report["resume"]
    return [
        Table(
            "time to first batch, HTTP shards, +50 ms per request (medians)",
            ("fresh start s", "resume mid-epoch s", "resume / fresh"),
            [(r["fresh_median_s"], r["resume_median_s"], r["ratio"])],
        )
    ]


BENCHMARK = Benchmark(
    name="resume",
    measure=_measure,
    title=lambda r: (
        f"resume ({r['mode']}): state_dict() of a 2-worker Loader over "
        f"{r['state_dict']['shards']} shards"
    ),
    columns=("shards", "state_dict median ms", "p99 ms", "state bytes (JSON)", "pending samples"),
    table=_state_row,
    more=_first_batch_table,
    headline=lambda r: [
        Headline(
            workload="resume: time to first batch (HTTP, +50 ms)",
            metric="s",
            better="lower",
            streambuf=r["resume"]["resume_median_s"],
            peer=r["resume"]["fresh_median_s"],
            peer_name="a fresh start of the same loader",
            how="2 workers x 3 lanes, 8 shards over loopback HTTP; resume at batch 12",
        )
    ],
)
run = BENCHMARK.run
