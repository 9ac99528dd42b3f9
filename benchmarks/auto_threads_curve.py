"""Is there a thread count that is both fast and efficient? The seed workload's rate
at fixed thread counts, with ``threads="auto"``, and with torchdata.nodes.

The workload is the seed row of ``streambuf bench latency``: 3x224x224 float32 samples
that take 10 ms each (a sleep: remote storage or a GIL-releasing decode), batch 32,
4 workers. Issue 26 asks ``threads="auto"`` for two things at once: >= 1.3x
torchdata.nodes with 32 threads, and a rate >= 0.95 of ``threads / latency`` for the
count it chose (``efficiency``). This script measures the curve those two targets sit
on: batches/s and efficiency at each fixed count (threads per worker x workers), the
count ``"auto"`` settled on, and the peer, interleaved in rounds (each run in a fresh
process, as ``streambuf bench`` runs them), so both targets can be read off one run.

    python benchmarks/auto_threads_curve.py                  # ~2 min on 2 cores
    python benchmarks/auto_threads_curve.py --counts 8 12 16 --rounds 3
    python benchmarks/auto_threads_curve.py --tiny           # seconds (a smoke run)
    python benchmarks/auto_threads_curve.py --counts 8 --budgets 1 2 4   # budget-bound?
    python benchmarks/auto_threads_curve.py --counts 8 12 --items-per-thread 1   # depth
    python benchmarks/auto_threads_curve.py --counts 10 12 16 --length 4 --tail  # steady

``--budgets K ...`` adds each fixed count again with ``K`` times the byte and batch
budget (``max_bytes``, ``max_batches``): if a larger budget does not raise a count's
efficiency, the budget is not what holds that count below ``threads / latency``.
``--items-per-thread K ...`` adds each fixed count and ``"auto"`` again with the map
holding ``K`` items a thread (``max_items``; ``"auto"``: ``K x max_threads``; the
default is 2: one being made, one made), e.g. ``1`` for the default before 2026-12-03.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from streambuf.bench import latency
from streambuf.bench._harness import run_config
from streambuf.prefetch import MAX_THREADS

LATENCY = latency.LATENCY_S
BATCH = latency.BATCH


def _seed_rows(mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The seed workload's torchdata.nodes and ``threads="auto"`` rows of ``streambuf
    bench latency`` (its shapes, budgets and batch counts), by kind."""
    rows = [c for c in latency.configs(mode) if c["workload"] == "seed"]
    peer = next(c for c in rows if c["kind"] == "torchdata")
    auto = next(c for c in rows if c["kind"] == "streambuf" and c["threads"] == "auto")
    return peer, auto


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[8, 10, 12, 14, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the tiny mode's rows, two counts")
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        default=[1],
        help="run each fixed count at these multiples of the byte and batch budget",
    )
    parser.add_argument(
        "--items-per-thread",
        type=int,
        nargs="+",
        default=[],
        help="run each fixed count again with the map holding K items a thread",
    )
    parser.add_argument(
        "--length",
        type=int,
        default=1,
        help="run K times the row's batches (every run, the peer's too)",
    )
    parser.add_argument(
        "--tail",
        action="store_true",
        help="read each run over its last three quarters of batches (start-up left out; "
        '"auto": the mean count over that span)',
    )
    args = parser.parse_args(argv)
    peer_cfg, auto_cfg = _seed_rows("tiny" if args.tiny else "full")
    peer_cfg = dict(peer_cfg, batches=args.length * peer_cfg["batches"])
    auto_cfg = dict(auto_cfg, batches=args.length * auto_cfg["batches"])
    if args.tiny:
        args.counts, args.rounds = [1, 2], 1
    workers = int(auto_cfg["workers"])
    total_peer = int(peer_cfg["threads"])
    runs = [dict(peer_cfg, name=f"torchdata {total_peer}")]
    totals: dict[str, float] = {runs[0]["name"]: total_peer}  # threads over all workers
    for k in args.budgets:
        for c in args.counts:
            name = f"streambuf {c}" + (f", budget x{k}" if k != 1 else "")
            budget = {
                "max_bytes": k * auto_cfg["max_bytes"],
                "max_batches": k * auto_cfg["max_batches"],
            }
            runs.append(dict(auto_cfg, **budget, threads=c, name=name))
            totals[name] = c * workers
    for k in args.items_per_thread:
        for c in args.counts:
            name = f"streambuf {c}, {k} a thread"
            runs.append(dict(auto_cfg, threads=c, map_max_items=k * c, name=name))
            totals[name] = c * workers
        # "auto" too: its window holds K items for each of its max_threads
        runs.append(
            dict(auto_cfg, map_max_items=k * MAX_THREADS, name=f"streambuf auto, {k} a thread")
        )
    runs += [dict(auto_cfg, name="streambuf auto")]
    got: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for cfg in runs:
            report = run_config(cfg, isolate=not args.tiny)
            if report.get("samples") != report.get("expected_samples"):
                raise RuntimeError(f"{cfg['name']}: delivered {report.get('samples')} samples")
            got.setdefault(cfg["name"], []).append(report)
    key = "tail_batches_per_s" if args.tail else "batches_per_s"

    def rate_of(r: dict[str, Any]) -> float:
        return float(r.get(key, r["batches_per_s"]))

    peer = statistics.median(rate_of(r) for r in got[f"torchdata {total_peer}"])
    rows: list[dict[str, Any]] = []
    print(
        f"seed workload: {LATENCY * 1000:.0f} ms a sample, batch {BATCH}, {workers} "
        f"workers, {args.rounds} rounds (medians), {args.length}x the batches"
        f"{', the last 3/4 of each run' if args.tail else ''}; peer: torchdata.nodes "
        f"{total_peer} threads {peer:.1f} batches/s"
    )
    print(f"{'run':<28} {'threads':>8} {'batches/s':>10} {'x peer':>7} {'efficiency':>10}")
    for name, reports in got.items():
        rate = statistics.median(rate_of(r) for r in reports)
        if name in totals:
            total: float = totals[name]
        elif args.tail:  # "auto": the mean count over the tail, and the tail's rate
            means = [r["tail_threads"] for r in reports if "tail_threads" in r]
            total = statistics.median(means) if means else float("nan")
        else:  # "auto": the count it settled on, and its rate from then
            chosen = [r["threads_chosen"][0] for r in reports if r.get("threads_chosen")]
            total = statistics.median(chosen) if chosen else float("nan")
            settled = [r["settled_batches_per_s"] for r in reports if "settled_batches_per_s" in r]
            rate = statistics.median(settled) if settled else rate
        efficiency = rate / (total / LATENCY / BATCH)
        rows.append(
            {
                "run": name,
                "threads": total,
                "batches_per_s": rate,
                "x_peer": rate / peer,
                "efficiency": efficiency,
                "max_bytes": reports[0].get("budget_max_bytes"),  # the loader's, as run
                "map_peak_items": max((r.get("map_peak_items", 0) for r in reports), default=0),
            }
        )
        print(f"{name:<28} {total:>8.4g} {rate:>10.1f} {rate / peer:>6.2f}x {efficiency:>10.2f}")
    return rows


if __name__ == "__main__":
    main()
