"""A latency-bound pipeline (10 ms per sample, like a remote read): the benchmark's shape.

python examples/latency_pipeline.py            # iterate it through a Loader
streambuf tune examples/latency_pipeline.py:make_pipeline   # ask for settings
"""

from __future__ import annotations

import time

import torch

import streambuf as sb


def load(i: int) -> torch.Tensor:
    time.sleep(0.01)  # stands in for a network read or a decode that releases the GIL
    return torch.full((64, 64), i % 256, dtype=torch.uint8)


def make_pipeline(n: int = 4096) -> sb.Pipeline:
    return sb.Pipeline(range(n)).map(load, threads=16).batch(32)


def main() -> None:
    loader = sb.Loader(make_pipeline(1024), num_workers=2, max_batches=8, max_bytes="64MiB")
    t0 = time.perf_counter()
    n = sum(1 for _ in loader)
    dt = time.perf_counter() - t0
    s = loader.stats()
    print(f"{n} batches in {dt:.2f} s ({n / dt:.1f}/s); depth {s.depth}; waited {s.wait_s:.2f} s")


if __name__ == "__main__":
    main()
