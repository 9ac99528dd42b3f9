"""The seed's question, run directly: DataLoader's prefetch_factor ladder against
streambuf's byte budget on latency-bound samples.

Each sample takes LATENCY seconds to arrive (a sleep: remote storage or a GIL-releasing
decode) and is a 3x224x224 float32 tensor (600 KB). DataLoader keeps
``prefetch_factor x num_workers`` batches in flight, counted in batches; streambuf keeps
what fits in ``max_bytes`` with 8 threads per worker. For each row: batches per second,
and the memory rise (system anonymous + shared memory, peak minus the start), so you can
see the depth each setting buys and what it costs.

    python benchmarks/prefetch_ladder.py            # under a minute on 2 cores
    python benchmarks/prefetch_ladder.py --tiny     # a few seconds (a smoke run)

The tuned version of this ladder (repeats, isolated child processes, torchdata.nodes,
JSON and plots) is ``streambuf bench latency``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import streambuf as sb
from streambuf.bench.memwatch import watch

LATENCY = 0.010
BATCH = 32


def make_sample(i: int) -> torch.Tensor:
    time.sleep(LATENCY)
    return torch.full((3, 224, 224), float(i))


class Samples(Dataset[torch.Tensor]):
    """The map-style dataset a DataLoader user would write."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return make_sample(i)


def timed(loader: object) -> tuple[float, int]:
    """Batches per second after the first batch (start-up excluded), and the batch count."""
    it = iter(loader)  # type: ignore[call-overload]
    next(it)
    t0, n = time.perf_counter(), 0
    for _ in it:
        n += 1
    return n / max(time.perf_counter() - t0, 1e-9), n + 1


def main(argv: list[str] | None = None) -> list[dict[str, object]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a few batches per row")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    n = BATCH * args.workers * (2 if args.tiny else 20)  # whole batches in every worker
    ladder = (1, 4) if args.tiny else (1, 2, 4, 8)
    rows: list[dict[str, object]] = []

    def row(name: str, make: object) -> None:
        (rate, batches), peak = watch(lambda: timed(make()))  # type: ignore[operator]
        rows.append(
            {
                "loader": name,
                "batches_per_s": rate,
                "batches": batches,
                "rise_mib": peak.rise / 2**20,
            }
        )
        print(f"{name:<44} {rate:8.1f} batches/s  rise {peak.rise / 2**20:6.0f} MiB")

    print(
        f"{n} samples of 600 KB, {LATENCY * 1000:.0f} ms each, batch {BATCH}, "
        f"{args.workers} workers"
    )
    for pf in ladder:
        row(
            f"DataLoader(prefetch_factor={pf})",
            lambda pf=pf: DataLoader(
                Samples(n), batch_size=BATCH, num_workers=args.workers, prefetch_factor=pf
            ),
        )
    pipe = sb.Pipeline(range(n)).map(make_sample, threads=8).batch(BATCH)
    row(
        "streambuf Loader(max_bytes=256MiB), 8 threads",
        lambda: sb.Loader(pipe, num_workers=args.workers, max_batches=16, max_bytes="256MiB"),
    )
    return rows


if __name__ == "__main__":
    main()
