"""Memory at scale: per-worker growth over an epoch of 100,000 tiny shards.

Every shard URL a pipeline holds is read by the workers once per epoch. Held as a list
of Python strings, each read writes the string's reference count, so a forked worker
copies every page of the list it touches (pytorch/pytorch#13246): its private memory
grows by about the size of the list over the epoch. ``shards()`` and ``video.clips()``
hold URLs in a ``StrList`` (two flat buffers), which reading never writes.

Measured: a ``Loader`` with 2 forked workers over 100,000 shard URLs (each shard one
tiny sample, made without I/O), the workers' private dirty memory (``/proc/PID/
smaps_rollup``) after the first batch and at the end of the epoch; ``list`` against
``StrList`` of the same URLs, in one run.

    streambuf bench scale [--quick] [--out DIR]
"""

from __future__ import annotations

import statistics
from typing import Any

from .._compact import StrList
from ._benchmark import Benchmark
from ._harness import MIB
from ._report import Headline


def _private_dirty(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    return 0


def one_sample(url: str) -> list[int]:
    """A shard of one tiny sample, made without I/O (what matters here is the URL)."""
    return [len(url)]


def _run(urls: Any, batch: int) -> dict[str, Any]:
    import streambuf as sb

    pipe = sb.Pipeline(urls, expand=one_sample, shuffle_shards=True).batch(batch)
    loader = sb.Loader(
        pipe, num_workers=2, max_batches=4, max_bytes="64MiB", multiprocessing_context="fork"
    )
    it = iter(loader)
    next(it)
    pids = loader.worker_pids()
    start = {p: _private_dirty(p) for p in pids}
    n, end = 1, dict(start)
    for _ in it:
        n += 1
        if n % 50 == 0:
            end = {p: max(end[p], _private_dirty(p)) for p in pids}
    loader.close()
    growth = [end[p] - start[p] for p in pids]
    return {"batches": n, "growth_bytes": growth, "median_growth_bytes": statistics.median(growth)}


def _measure(mode: str) -> dict[str, Any]:
    n = {"tiny": 20_000, "quick": 100_000, "full": 100_000}[mode]
    urls = [f"s3://a-bucket-name/some/prefix/train-{i:08d}.tar" for i in range(n)]
    return {"shards": n, "list": _run(urls, 256), "strlist": _run(StrList(urls), 256)}


BENCHMARK = Benchmark(
    name="scale",
    measure=_measure,
    title=lambda r: f"scale ({r['mode']}): {r['shards']} shard URLs, 2 forked workers, one epoch",
    columns=("URLs held as", "growth per worker MiB (median)", "batches"),
    table=lambda r: [
        (label, r[key]["median_growth_bytes"] / MIB, r[key]["batches"])
        for label, key in (("list[str]", "list"), ("StrList", "strlist"))
    ],
    headline=lambda r: [
        Headline(
            workload=f"memory at scale ({r['shards']} shards)",
            metric="MiB growth per worker",
            better="lower",
            streambuf=r["strlist"]["median_growth_bytes"] / MIB,
            peer=r["list"]["median_growth_bytes"] / MIB,
            peer_name="the same URLs as a list of str",
            how="2 forked workers, one epoch, Private_Dirty after the first batch -> end",
        )
    ],
)
run = BENCHMARK.run
