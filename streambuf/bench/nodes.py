"""torchdata.nodes graphs: torchdata's own Prefetcher and ParallelMapper against
streambuf.nodes' on the same graph, in one run.

The graph (one process, threads only, no IPC)::

    IterableWrapper(range(n)) -> ParallelMapper(make, 16 threads, in order)
        -> Prefetcher -> torchdata.nodes.Loader

``make(i)`` sleeps 10 ms (I/O or a decode that releases the GIL), then allocates a
uint8 tensor of 1 MiB or 64 KiB. Two consumers: *steady* takes items as fast as they
come (the throughput figure: the queues stay nearly empty); *hiccups* also pauses 50 ms
every 400 items (a logging or evaluation step), during which the queues fill to
whatever their bounds allow (the memory figure). Same counts on both sides: torchdata's
``ParallelMapper(num_workers=16)`` (``max_concurrent`` default 2 x 16 = 32) and
``Prefetcher(prefetch_factor=8)``; streambuf's ``ParallelMapper(threads=16,
max_items=32, max_bytes=20MiB)`` and ``Prefetcher(max_items=8, max_bytes=4MiB)``. With
64 KiB items the byte bounds never bind (the same depths, another mechanism); with 1 MiB
items they do.

Figures: items/s from the first item to the last (start-up excluded on both sides);
*peak live bytes*, the most bytes of items made and not yet freed at once (each tensor is
tracked with ``weakref.finalize``: the same measure on both sides, the consumer's
current item included); and for streambuf the nodes' own accounting
(``stats().peak_bytes``: queued plus reserved for items being made), which must stay
within each node's ``max_bytes``. Every run is a fresh child process (in-process for the
smoke test); repeats interleaved, medians quoted.

    streambuf bench nodes [--quick] [--out DIR]
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from ._benchmark import Benchmark
from ._harness import MIB, measure_configs, run_config
from ._report import Better, Headline, versus

LATENCY_S = 0.010
THREADS = 16
SIZES = {"1MiB": 1 << 20, "64KiB": 64 << 10}
MAX_CONCURRENT = 2 * THREADS  # torchdata's default; streambuf's max_items
PREFETCH = 8
PAUSE_EVERY, PAUSE_S = 400, 0.050  # the consumer's hiccups: the queues fill meanwhile
MAPPER_MAX_BYTES = 20 * MIB
PREFETCHER_MAX_BYTES = 4 * MIB
RUNNER = "streambuf.bench.nodes:run_graph"


class _Live:
    """Bytes of the items made and not yet freed, and their peak."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.now += n
            self.peak = max(self.peak, self.now)

    def drop(self, n: int) -> None:
        with self.lock:
            self.now -= n


class _Make:
    """Item ``i``: ``latency_s`` of sleep, then a tensor of ``nbytes`` (tracked live)."""

    def __init__(self, latency_s: float, nbytes: int, live: _Live) -> None:
        self.latency_s, self.nbytes, self.live = latency_s, nbytes, live

    def __call__(self, i: int) -> Any:
        import torch

        if self.latency_s:
            time.sleep(self.latency_s)
        t = torch.empty(self.nbytes, dtype=torch.uint8)
        self.live.add(self.nbytes)
        weakref.finalize(t, self.live.drop, self.nbytes)
        return t


def run_graph(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build the graph ``cfg`` describes (``kind``: "torchdata" or "streambuf"), iterate
    it once through ``torchdata.nodes.Loader``, report (see the module docstring)."""
    import torchdata.nodes as tn

    import streambuf as sb

    live = _Live()
    make = _Make(cfg["latency_s"], cfg["item_bytes"], live)
    n = cfg["items"]
    src = tn.IterableWrapper(range(n))
    mapper: Any
    pre: Any
    if cfg["kind"] == "torchdata":
        mapper = tn.ParallelMapper(src, make, num_workers=cfg["threads"], method="thread")
        pre = tn.Prefetcher(mapper, prefetch_factor=cfg["prefetch"])
    else:
        mapper = sb.nodes.ParallelMapper(
            src,
            make,
            threads=cfg["threads"],
            max_items=cfg["max_concurrent"],
            max_bytes=cfg["mapper_max_bytes"],
        )
        pre = sb.nodes.Prefetcher(
            mapper, max_items=cfg["prefetch"], max_bytes=cfg["prefetcher_max_bytes"]
        )
    seen = 0
    pause_every, pause_s = cfg["pause_every"], cfg["pause_s"]
    t0 = t_first = t_last = time.perf_counter()
    for item in tn.Loader(pre):
        t_last = time.perf_counter()
        if seen == 0:
            t_first = t_last
        seen += 1
        del item
        if pause_s and seen % pause_every == 0:
            time.sleep(pause_s)
    steady = t_last - t_first
    out: dict[str, Any] = {
        "samples": seen,
        "expected_samples": n,
        "items_per_s": (seen - 1) / steady if seen > 1 and steady > 0 else float("nan"),
        "first_item_s": t_first - t0,
        "peak_live_bytes": live.peak,
    }
    if cfg["kind"] == "streambuf":
        ms, ps = mapper.stats(), pre.stats()
        out.update(
            mapper_peak_bytes=ms.peak_bytes,
            mapper_max_bytes=ms.max_bytes,
            prefetcher_peak_bytes=ps.peak_bytes,
            prefetcher_max_bytes=ps.max_bytes,
            oversize=ms.oversize + ps.oversize,
            # for check_runs: each node's peak is checked against its own bound below
            peak_in_flight_bytes=ms.peak_bytes + ps.peak_bytes,
            budget_max_bytes=ms.max_bytes + ps.max_bytes,
        )
    return out


def _settings(mode: str) -> dict[str, Any]:
    if mode == "tiny":  # the smoke test: proves it runs, measures nothing
        return dict(
            items=48,
            threads=4,
            latency_s=0.002,
            pause_every=16,
            pause_s=0.005,
            repeats=1,
            isolate=False,
        )
    quick = mode == "quick"
    return dict(
        items=1600 if quick else 6400,
        pause_every=PAUSE_EVERY,
        pause_s=PAUSE_S,
        threads=THREADS,
        latency_s=LATENCY_S,
        repeats=2 if quick else 5,
        isolate=True,
    )


def configs(mode: str) -> list[dict[str, Any]]:
    s = _settings(mode)
    out = []
    for size, nbytes in SIZES.items():
        for consumer, pause_s in (("steady", 0.0), ("hiccups", s["pause_s"])):
            base = {
                "runner": RUNNER,
                "size": size,
                "consumer": consumer,
                "item_bytes": nbytes,
                "items": s["items"],
                "threads": s["threads"],
                "latency_s": s["latency_s"],
                "pause_every": s["pause_every"],
                "pause_s": pause_s,
                "max_concurrent": 2 * s["threads"],
                "prefetch": PREFETCH,
            }
            out.append(dict(base, kind="torchdata", name=f"{size} {consumer}: torchdata.nodes"))
            out.append(
                dict(
                    base,
                    kind="streambuf",
                    name=f"{size} {consumer}: streambuf.nodes",
                    mapper_max_bytes=MAPPER_MAX_BYTES,
                    prefetcher_max_bytes=PREFETCHER_MAX_BYTES,
                )
            )
    return out


def _check_node_bounds(rows: list[dict[str, Any]]) -> None:
    bad = [
        f"{row['name']} run {k}: {node} peak {run[f'{node}_peak_bytes']} > "
        f"{run[f'{node}_max_bytes']}"
        for row in rows
        if row["kind"] == "streambuf"
        for k, run in enumerate(row["runs"])
        for node in ("mapper", "prefetcher")
        if run[f"{node}_peak_bytes"] > run[f"{node}_max_bytes"]
    ]
    if bad:
        raise RuntimeError("streambuf.nodes over their byte bounds:\n  " + "\n  ".join(bad))


def _measure(mode: str) -> dict[str, Any]:
    s = _settings(mode)
    rows = measure_configs(
        configs(mode),
        lambda c: run_config(c, isolate=s["isolate"]),
        repeats=s["repeats"],
        label="nodes",
        keys=["items_per_s", "peak_live_bytes", "peak_in_flight_bytes", "budget_max_bytes"],
    )
    _check_node_bounds(rows)
    for r in rows:
        r["peak_live_mib"] = r["peak_live_bytes"] / MIB
    return {"settings": s, "rows": rows}


def _row(report: dict[str, Any], size: str, consumer: str, kind: str) -> dict[str, Any]:
    return next(
        r
        for r in report["rows"]
        if (r["config"]["size"], r["config"]["consumer"], r["kind"]) == (size, consumer, kind)
    )


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    out = []
    for size in SIZES:
        td, td_h = (
            _row(report, size, "steady", "torchdata"),
            _row(report, size, "hiccups", "torchdata"),
        )
        for kind, label in (("torchdata", "torchdata.nodes"), ("streambuf", "streambuf.nodes")):
            steady, hiccups = (
                _row(report, size, "steady", kind),
                _row(report, size, "hiccups", kind),
            )
            out.append(
                (
                    f"{size}: {label}",
                    steady["items_per_s"],
                    steady["items_per_s"] / td["items_per_s"],
                    hiccups["items_per_s"] / td_h["items_per_s"],
                    steady["peak_live_mib"],
                    hiccups["peak_live_mib"],
                    max(steady["peak_in_flight_bytes"], hiccups["peak_in_flight_bytes"]) / MIB,
                    steady["budget_max_bytes"] / MIB,
                )
            )
    return out


HEADS: tuple[tuple[str, str, str, str, Better], ...] = (  # consumer, what, key, metric, better
    ("steady", "steady consumer", "items_per_s", "items/s", "higher"),
    ("hiccups", "consumer hiccups", "peak_live_mib", "peak live MiB", "lower"),
)


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    s = report["settings"]
    return [
        versus(
            [
                r
                for r in report["rows"]
                if r["config"]["size"] == size and r["config"]["consumer"] == consumer
            ],
            key,
            workload=f"torchdata.nodes graph, {size} items, {what}",
            metric=metric,
            better=better,
            how=f"{s['threads']} threads, {s['latency_s'] * 1e3:.0f} ms/item, in order; "
            f"max_concurrent/max_items {2 * s['threads']}, prefetch {PREFETCH}",
            peer_name=lambda _: "torchdata.nodes ParallelMapper + Prefetcher",
        )
        for size in SIZES
        for consumer, what, key, metric, better in HEADS
    ]


BENCHMARK = Benchmark(
    name="nodes",
    measure=_measure,
    title=lambda r: (
        f"nodes ({r['mode']}): {r['settings']['items']} items, "
        f"{r['settings']['latency_s'] * 1e3:.0f} ms each, {r['settings']['threads']} threads, in "
        f"order; hiccups: {r['settings']['pause_s'] * 1e3:.0f} ms pause every "
        f"{r['settings']['pause_every']} items; streambuf max_bytes {MAPPER_MAX_BYTES // MIB} MiB "
        f"(mapper) + {PREFETCHER_MAX_BYTES // MIB} MiB (prefetcher)"
    ),
    columns=(
        "graph",
        "items/s steady",
        "x torchdata steady",
        "x torchdata hiccups",
        "peak live MiB steady",
        "peak live MiB hiccups",
        "streambuf accounted peak MiB",
        "streambuf max_bytes MiB",
    ),
    table=_table,
    headline=_headline,
)
run = BENCHMARK.run
