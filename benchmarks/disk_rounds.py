"""Local tar shards, per round: streambuf against webdataset on the same files, more
rounds than ``streambuf bench network`` runs (its 3 runs of a disk row spread 30% on the
2-core VM: one run each cannot tell 1.34x from 1.6x).

The disk sections of ``bench network`` (its full settings: 100 KB samples in WebDataset
shards on local disk, 2 workers), interleaved and rotated, each run in this process as
the benchmark runs them; per round, streambuf's rate over webdataset's (per sample, and
batched), and the median of those ratios:

    python benchmarks/disk_rounds.py                 # batch 32 (issue 25's "batched 32"), 7 rounds
    python benchmarks/disk_rounds.py --batch 16 --rounds 9
    python benchmarks/disk_rounds.py --tiny          # seconds (a smoke run)
    python benchmarks/disk_rounds.py --passes 3 --rounds 3   # longer runs: the shards 3 times

Each run's CPU time is recorded too (this process and its reaped Loader workers,
``getrusage``): on 2 cores both readers are CPU-bound, so the CPU microseconds a sample
costs, per reader, bound the ratio that rounds can show.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path
from typing import Any

from streambuf.bench import network
from streambuf.bench._harness import interleaved
from streambuf.bench._shards import make_shards


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=network.BIG_BATCH)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tiny", action="store_true", help="the tiny settings, one round")
    parser.add_argument("--passes", type=int, default=1, help="read the shard list N times a run")
    args = parser.parse_args(argv)
    s = network.local(network.settings("tiny" if args.tiny else "full"), batch_size=args.batch)
    rounds = 1 if args.tiny else args.rounds
    with tempfile.TemporaryDirectory(prefix="streambuf-disk-rounds-") as tmp:
        index = make_shards(
            Path(tmp), shards=s["shards"], per_shard=s["per_shard"], sample_bytes=s["sample_bytes"]
        )
        urls = [str(Path(tmp) / n) for n in sorted({name for name, _, _ in index})]
        urls *= max(1, args.passes)
        s = dict(s, shards=len(urls))
        runs = {
            f"streambuf lanes={s['lanes']}": lambda: network._streambuf(urls, s, None),
            "webdataset per sample": lambda: network._webdataset(urls, s, batched=False, s3=None),
            "webdataset batched": lambda: network._webdataset(urls, s, batched=True, s3=None),
        }
        cfgs = [{"name": name} for name in runs]
        got = interleaved(cfgs, lambda c: _with_cpu(runs[c["name"]]), repeats=rounds, label="disk")
    rates = {c["name"]: [r["samples_per_s"] for r in g] for c, g in zip(cfgs, got)}
    samples = len(urls) * s["per_shard"]
    cpu_us = {c["name"]: [r["cpu_s"] / samples * 1e6 for r in g] for c, g in zip(cfgs, got)}
    ours = rates[cfgs[0]["name"]]
    out: dict[str, Any] = {
        "batch": args.batch,
        "rounds": rounds,
        "rates": rates,
        "cpu_us_per_sample": cpu_us,
    }
    print(
        f"local tar, batch {args.batch}, {rounds} rounds (samples/s; x = streambuf / peer, per round)"
    )
    for name, rate in rates.items():
        line = (
            f"{name:<24} median {statistics.median(rate):>9,.0f}  runs {[round(x) for x in rate]}"
        )
        if name != cfgs[0]["name"]:
            ratios = [a / b for a, b in zip(ours, rate)]
            out[name] = statistics.median(ratios)
            line += f"  x {[round(x, 2) for x in ratios]}, median {out[name]:.2f}"
        print(line + f"  CPU {statistics.median(cpu_us[name]):,.0f} us/sample")
    return out


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that were reaped (a run's
    Loader workers, once it ends)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _with_cpu(run: Any) -> dict[str, Any]:
    before = _cpu_s()
    res = dict(run())
    res["cpu_s"] = _cpu_s() - before
    return res


if __name__ == "__main__":
    main()
