"""Is the data the bottleneck? ``loader.report()`` on the seed's workload (10 ms per
sample, like a remote read; batches of 32), once with a training step faster than the
data and once with a slower one.

python examples/where_time_goes.py
"""

from __future__ import annotations

import time

import torch

import streambuf as sb


def load(i: int) -> torch.Tensor:
    time.sleep(0.01)  # stands in for a network read or a decode that releases the GIL
    return torch.full((64, 64), i % 256, dtype=torch.uint8)


def run(step_s: float, batches: int = 48) -> str:
    pipe = sb.Pipeline(range(32 * batches)).map(load, threads=8).batch(32)
    with sb.Loader(pipe, num_workers=2, max_batches=8, max_bytes="64MiB") as loader:
        for _ in loader:
            time.sleep(step_s)  # the training step
        return loader.report()


def main() -> None:
    fast = run(step_s=0.0)
    print("training step 0 ms:\n" + fast + "\n")
    slow = run(step_s=0.25, batches=16)
    print("training step 250 ms:\n" + slow)
    assert fast.splitlines()[-1].startswith("bottleneck: map(load)")
    assert slow.splitlines()[-1].startswith("bottleneck: consumer")


if __name__ == "__main__":
    main()
