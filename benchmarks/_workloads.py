"""Workloads shared by the benchmarks (module level so DataLoader workers can pickle them).

A sample is a float32 tensor of ``sample_bytes`` (first element = its index), made
after ``latency_s`` of sleep (standing in for I/O or decode, which release the GIL).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class SampleMaker:
    sample_bytes: int = 4
    latency_s: float = 0.0
    lognormal_sigma: float = 0.0  # > 0: heavy-tailed latency with median latency_s
    seed: int = 0
    phase_samples: int = 0  # > 0: alternate phases of fast (latency_s) and slow samples
    slow_latency_s: float = 0.0

    def latency(self, i: int) -> float:
        if self.phase_samples > 0:
            slow = (i // self.phase_samples) % 2 == 1
            return self.slow_latency_s if slow else self.latency_s
        if self.lognormal_sigma <= 0:
            return self.latency_s
        rng = random.Random(self.seed * 1_000_003 + i)
        return self.latency_s * math.exp(rng.gauss(0.0, self.lognormal_sigma))

    def __call__(self, i: int) -> torch.Tensor:
        lat = self.latency(i)
        if lat > 0:
            time.sleep(lat)
        n = max(1, self.sample_bytes // 4)
        t = torch.ones(n, dtype=torch.float32)  # touches every page
        t[0] = i
        return t


class MapDataset(Dataset[torch.Tensor]):
    """The map-style baseline: ``__getitem__`` does the same work as the pipeline."""

    def __init__(self, n: int, maker: SampleMaker) -> None:
        self.n = n
        self.maker = maker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.maker(i)
