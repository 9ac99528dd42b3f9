"""A mixed workload: I/O latency that releases the GIL plus pure-Python work that holds it.

Each sample costs 5 ms of sleep (a read: the GIL is released) and ~2 ms of a pure-Python
loop (parsing, augmentation in Python: the GIL is held; the loop length is calibrated
once on this machine and recorded), 3x64x64 float32 samples, batch 32. This is where
neither threads nor processes alone suffice: threads in one process serialise on the GIL
(at most 1 / 2 ms = 500 samples/s whatever their number), one sample in flight per
DataLoader worker leaves each process idle 5 ms of every 7. Processes x threads should
beat both. Compared in one run, interleaved:

* ``DataLoader`` over a map-style Dataset, 4 workers, ``prefetch_factor`` 1, 2, 4, 8;
* ``torchdata.nodes`` ``ParallelMapper(method="thread")``, 32 threads in one process;
* ``streambuf`` ``Loader``: 4 workers x 8 threads (32 in all), then the ladder of fixed
  counts (4 workers x 1, 2, 4, 16 threads) and ``threads="auto"`` (the count chosen at
  run time: it must match the best fixed count). streambuf's rows run 3-4x the
  batches of the others (``threads="auto"`` needs a few seconds to settle where every
  worker tunes at once on saturated CPUs; the fixed counts run as long); and the
  ablation ``"auto"`` with each worker climbing alone (no leader: ``streambuf._tuner.Lead``).

A **CPU-bound** section beside it: the same samples with no sleep at all (2 ms of pure
Python each), streambuf ``threads=1`` against ``threads="auto"`` (the controller must not
add threads that fight over the GIL) and ``threads="auto", adaptive=False`` (the
controller alone, without the inline chooser).

    streambuf bench mixed [--quick] [--out DIR]
"""

from __future__ import annotations

import math
from typing import Any

from ._benchmark import Benchmark
from ._harness import measure_configs, run_config
from ._report import Headline, Ladder, best_peer, short_name, versus
from .workloads import calibrate_spin

SHAPE = [3, 64, 64]
LATENCY_S = 0.005
CPU_S = 0.002
BATCH = 32
RUNNER = "streambuf.bench.workloads:run_loader"


def _settings(mode: str) -> dict[str, Any]:
    if mode == "tiny":
        return {
            "batches": 6,
            "workers": 2,
            "threads": 4,
            "pfs": [2],
            "repeats": 1,
            "isolate": False,
            "ladder": [],
        }
    quick = mode == "quick"
    return {
        "batches": 30 if quick else 80,
        "workers": 4,
        "threads": 8,
        "pfs": [2, 8] if quick else [1, 2, 4, 8],
        "repeats": 1 if quick else 3,
        "isolate": True,
        "ladder": [1, 2, 4, 16],  # besides "threads" (8)
    }


def configs(mode: str, cpu_iters: int) -> list[dict[str, Any]]:
    s = _settings(mode)
    base = {
        "runner": RUNNER,
        "shape": SHAPE,
        "latency_s": LATENCY_S,
        "cpu_iters": cpu_iters,
        "batch_size": BATCH,
        "batches": s["batches"],
        "workers": s["workers"],
    }
    out = [
        dict(base, kind="dataloader", prefetch_factor=k, name=f"DataLoader pf={k}")
        for k in s["pfs"]
    ]
    total = s["workers"] * s["threads"]
    out.append(dict(base, kind="torchdata", threads=total, name=f"torchdata.nodes {total} threads"))
    batch_bytes = BATCH * 4 * math.prod(SHAPE)
    # streambuf's rows run longer: threads="auto" needs a few seconds to settle where
    # every worker tunes at once on saturated CPUs (the fixed rows run as long, to compare)
    longer = {"tiny": 1, "quick": 4, "full": 3}[mode]
    sb = dict(
        base,
        batches=base["batches"] * longer,
        kind="streambuf",
        max_batches=2 * s["workers"],
        max_bytes=math.ceil(4 / 3 * 2 * s["workers"] * batch_bytes),
    )
    w = s["workers"]
    out.append(dict(sb, threads=s["threads"], name=f"streambuf {w}x{s['threads']} threads"))
    for k in s["ladder"]:
        out.append(dict(sb, threads=k, name=f"streambuf {w}x{k} threads"))
    out.append(dict(sb, threads="auto", name=f"streambuf {w}x auto threads"))
    if mode != "tiny":  # the ablation: every worker climbing alone (no leader)
        out.append(
            dict(sb, threads="auto", ablate="lead", name=f"streambuf {w}x auto, each worker alone")
        )
    # CPU-bound: no sleep, 2 ms of pure Python a sample
    cpu = dict(sb, latency_s=0.0, section="cpu")
    out.append(dict(cpu, threads=1, name=f"cpu-bound: streambuf {w}x1 thread"))
    out.append(dict(cpu, threads="auto", name=f"cpu-bound: streambuf {w}x auto threads"))
    out.append(
        dict(
            cpu,
            threads="auto",
            adaptive=False,
            name=f"cpu-bound: streambuf {w}x auto threads, adaptive=False",
        )
    )
    return out


def _measure(mode: str) -> dict[str, Any]:
    s = _settings(mode)
    cpu_iters = calibrate_spin(CPU_S)
    rows = measure_configs(
        configs(mode, cpu_iters),
        lambda c: run_config(c, isolate=s["isolate"]),
        repeats=s["repeats"],
        label="mixed",
        keys=["batches_per_s", "samples_per_s", "peak_in_flight_bytes"],
    )
    return {"settings": s, "cpu_iters": cpu_iters, "cpu_s_target": CPU_S, "rows": rows}


def _mixed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["config"].get("section") != "cpu"]


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = report["rows"]
    peer = best_peer([r for r in _mixed(rows) if r["kind"] != "streambuf"], "batches_per_s")
    # the CPU-bound rows: against streambuf threads=1 (the count auto must not lose to)
    one = next((r for r in rows if r["name"].startswith("cpu-bound") and "x1 " in r["name"]), peer)
    return [
        (
            r["name"],
            r["batches_per_s"],
            r["samples_per_s"],
            r["batches_per_s"] / (one if r["config"].get("section") else peer)["batches_per_s"],
        )
        for r in rows
    ]


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    s = report["settings"]
    rows = report["rows"]

    def auto(r: dict[str, Any]) -> bool:
        return r["config"].get("threads") == "auto" and r["config"].get("adaptive", True)

    def chose(r: dict[str, Any], peer: dict[str, Any]) -> str:
        got = r["runs"][-1].get("threads_chosen") or (0, float("nan"))
        return (
            f"batch {BATCH}, {s['workers']} workers, threads='auto' (chose {got[0]} in "
            f"all, reached at {got[1]:.2f} s) vs {short_name(peer)}"
        )

    return [
        versus(
            _mixed(rows),
            "batches_per_s",
            workload=f"mixed ({LATENCY_S * 1e3:.0f} ms I/O + {CPU_S * 1e3:.0f} ms Python per sample)",
            metric="batches/s",
            how=f"batch {BATCH}, {s['workers']} workers x {s['threads']} threads vs DataLoader "
            "pf ladder and torchdata.nodes threads at equal total threads",
        ),
        versus(
            _mixed(rows),
            "batches_per_s",
            workload="mixed, threads='auto'",
            metric="batches/s",
            mine=auto,
            how=chose,
        ),
    ]


BENCHMARK = Benchmark(
    name="mixed",
    measure=_measure,
    title=lambda r: (
        f"mixed ({r['mode']}): {LATENCY_S * 1e3:.0f} ms sleep + {CPU_S * 1e3:.0f} ms "
        f"pure Python ({r['cpu_iters']} loop turns) per sample, batch {BATCH}, "
        f"{r['settings']['workers']} workers"
    ),
    columns=("run", "batches/s", "samples/s", "x strongest peer (cpu-bound rows: x threads=1)"),
    table=_table,
    headline=_headline,
    plot=lambda r: Ladder("mixed: 5 ms I/O + 2 ms pure Python per sample, batch 32", r["rows"]),
)
run = BENCHMARK.run
