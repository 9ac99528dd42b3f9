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
    # threads="auto": each worker climbs to the thread count where the rate stops rising
    return sb.Pipeline(range(n)).map(load, threads="auto").batch(32)


def main() -> None:
    pipe = make_pipeline(1024)
    loader = sb.Loader(pipe, num_workers=2, max_batches=8, max_bytes="64MiB")
    t0 = time.perf_counter()
    n = 0
    counts = []
    for _ in loader:
        n += 1
        counts.append(sum(t.threads for t in pipe.stats().threads))
    dt = time.perf_counter() - t0
    s = loader.stats()
    print(f"{n} batches in {dt:.2f} s ({n / dt:.1f}/s); depth {s.depth}; waited {s.wait_s:.2f} s")
    print(f"threads over both workers, every 4 batches: {counts[::4]}")


if __name__ == "__main__":
    main()
