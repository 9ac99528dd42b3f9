"""streambuf's benchmarks: ``streambuf bench NAME [--quick] [--out DIR]``.

Each one measures streambuf against the strongest peer a user would pick, in the same
run (the DataLoader ``prefetch_factor`` ladder, ``torchdata.nodes``, webdataset, PyAV
seek-per-clip, torchcodec ...), on data it makes itself, and writes JSON with every raw
figure and the environment (plus PNG plots for the ladders). ``streambuf bench all``
runs them all and prints the headline table. Peers and plots need
``pip install 'streambuf[bench]'``. See docs/benchmarks.md.

One module per benchmark, each declaring a ``_benchmark.Benchmark`` (how it measures, its
table, headline rows and plot) whose ``run`` checks, prints and writes every report alike;
shared pieces in ``_harness`` (runs, repeats, environment), ``_report`` (checks, headline
rows, tables, JSON, the ladder plot) and ``workloads`` (synthetic samples and the
DataLoader / torchdata.nodes / streambuf loaders).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from types import ModuleType

__all__ = ["BENCHMARKS", "describe", "load"]

BENCHMARKS: dict[str, str] = {
    "latency": "latency-bound samples (the seed workload): DataLoader ladder, torchdata.nodes, streambuf",
    "nodes": "torchdata.nodes graphs: torchdata's ParallelMapper/Prefetcher vs streambuf.nodes', 1 MiB and 64 KiB",
    "mixed": "GIL-releasing I/O plus GIL-holding Python per sample: processes x threads vs each alone",
    "memory": "memory growth: DataLoader prefetch_factor ladder vs streambuf's byte budget",
    "stall": "consumer wait with heavy-tailed latency and a train step",
    "bursty": "adaptive depth vs fixed depths on bursts of slow samples (ablation, no peer)",
    "buffer": "BoundedBuffer vs queue.Queue hand-over cost",
    "network": "tar shards over HTTP, local disk and S3 (moto): streambuf vs webdataset, map-style",
    "cache": "shard cache: epoch 1 vs epoch 2 over HTTP +50 ms, streambuf vs webdataset cache_dir",
    "video": "random clips from 720p H.264: streambuf vs PyAV seek-per-clip, torchcodec",
    "scale": "memory at scale: per-worker growth over an epoch of 100,000 shard URLs",
    "resume": "checkpoint cost: state_dict() time and size, time to first batch after a resume",
    "gpu": "GPU busy fraction: seed ladder and video clips feeding real models (needs CUDA)",
    "all": "every benchmark above (gpu only where CUDA is), then the headline table",
}


def load(name: str) -> ModuleType:
    """The module of benchmark ``name`` (imported on demand)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    return importlib.import_module(f"{__name__}.{name}")


def describe(name: str) -> str:
    """Benchmark ``name``'s module docstring, read without importing it (for ``--help``)."""
    spec = importlib.util.find_spec(f"{__name__}.{name}")
    if spec is None or spec.origin is None:
        return BENCHMARKS[name]
    with open(spec.origin, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or BENCHMARKS[name]
