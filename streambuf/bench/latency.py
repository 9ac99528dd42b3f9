"""The latency ladder: latency-bound samples through DataLoader, torchdata.nodes, streambuf.

Workloads (each sample takes 10 ms of sleep: I/O or a decode that releases the GIL;
batch 32; 4 workers):

* **seed** (the headline): the mission's exact workload, 3x224x224 float32 samples
  (19 MiB batches), ``pin_memory=True`` and ``persistent_workers=True`` for every loader
  that has them (pinning only takes effect where an accelerator exists: the JSON
  records ``pin_memory_effective``);
* **64KiB**: 64 KiB float32 samples (2 MiB batches).

The threaded loaders (torchdata.nodes, streambuf) run 4x the DataLoader rows' batches
(at ~100 batches/s the base count is over in half a second, while ``threads="auto"``
is still climbing).

Loaders, same samples, same batch size, same collate:

* ``DataLoader`` over a map-style Dataset, ``prefetch_factor`` 1, 2, 4, 8, 4 workers;
* ``torchdata.nodes`` ``ParallelMapper(method="thread")`` in one process with as many
  threads as streambuf has in all (4 x 8 = 32; no IPC at all);
* ``streambuf``: ``Pipeline.map(threads=8).batch(32)`` through ``Loader`` with 4
  workers, ``max_batches`` = 2 per worker and ``max_bytes`` = 2 batches per worker of
  credit (a quarter more for the stage buffers); and the same with ``threads="auto"``
  (the count chosen at run time in each worker, ``streambuf._tuner``: the rows record
  the total over workers every 8 batches, the count it settled on and when it was
  first reached).

**50 ms rows** (remote-storage latency, 64 KiB samples): torchdata.nodes 32 threads
against streambuf 4 x 8 and 4 x ``"auto"`` threads, both streambuf rows with
``max_bytes`` = 64 MiB (what a user would give a loader of 2 MiB batches; the auto count
stays within it). No DataLoader row (at 50 ms it would take minutes).

Zero-latency rows of each (the transport ceiling: what each loader moves when the
samples cost nothing) sit beside them, with streambuf also at ``adaptive=False`` (its
threads always used, the ablation of running cheap work inline) and with its per-stage
time accounting off (``stage stats off``: what ``loader.report()`` costs where samples
cost nothing), and the DataLoader's theoretical ceiling
``workers / (latency x batch)``. Every run is a fresh child process; memory growth per
docs/design.md (the run's peak AnonPages + Shmem minus the same run with 1-element samples),
measured in full runs. Repeats interleaved, medians quoted.

    streambuf bench latency [--quick] [--out DIR]
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ._benchmark import Benchmark
from ._harness import MIB, measure_configs, run_config, with_growth
from ._report import Headline, Ladder, short_name, versus

LATENCY_S = 0.010
BATCH = 32
WORKERS = 4
THREADS = 8
WORKLOADS = {"seed": [3, 224, 224], "64KiB": [16384]}
RUNNER = "streambuf.bench.workloads:run_loader"
SLOW_WORKLOAD, SLOW_S, SLOW_MAX_BYTES = "64KiB", 0.050, 64 * MIB  # the 50 ms rows


def _settings(mode: str) -> dict[str, Any]:
    if mode == "tiny":  # the smoke test: proves it runs, measures nothing
        return dict(
            batches=6,
            workers=2,
            threads=4,
            pfs=[2],
            repeats=1,
            isolate=False,
            growth=False,
            workloads={"seed": [3, 32, 32]},
            ladder_workloads=["seed"],
        )
    quick = mode == "quick"
    return dict(
        batches=40 if quick else 80,
        workers=WORKERS,
        threads=THREADS,
        pfs=[1, 2, 4, 8],
        repeats=1 if quick else 3,
        isolate=True,
        growth=not quick,
        workloads=WORKLOADS,
        ladder_workloads=["seed"] if quick else list(WORKLOADS),  # quick: 64KiB at pf=2 only
    )


def configs(mode: str) -> list[dict[str, Any]]:
    s = _settings(mode)
    out = []
    for wl, shape in s["workloads"].items():
        batch_bytes = BATCH * 4 * math.prod(shape)
        base = {
            "runner": RUNNER,
            "workload": wl,
            "shape": shape,
            "latency_s": LATENCY_S,
            "batch_size": BATCH,
            "batches": s["batches"],
            "workers": s["workers"],
            "pin_memory": True,
            "persistent_workers": True,
        }
        pfs = s["pfs"] if wl in s["ladder_workloads"] else [2]
        for k in pfs:
            out.append(
                dict(base, kind="dataloader", prefetch_factor=k, name=f"{wl}: DataLoader pf={k}")
            )
        total = s["workers"] * s["threads"]
        # the threaded loaders run 4x the batches: at ~100 batches/s the base count takes
        # under half a second, where threads="auto" is still climbing (it settles in
        # about that time); every loader's rate is taken from its first batch on
        fast = dict(base, batches=base["batches"] * (1 if mode == "tiny" else 4))
        tdn = dict(fast, kind="torchdata", threads=total, prefetch_factor=2)
        sb = dict(
            fast,
            kind="streambuf",
            threads=s["threads"],
            max_batches=2 * s["workers"],
            max_bytes=math.ceil(4 / 3 * 2 * s["workers"] * batch_bytes),
        )
        out.append(dict(tdn, name=f"{wl}: torchdata.nodes {total} threads"))
        out.append(dict(sb, name=f"{wl}: streambuf {s['workers']}x{s['threads']} threads"))
        out.append(dict(sb, threads="auto", name=f"{wl}: streambuf {s['workers']}x auto threads"))
        if wl == SLOW_WORKLOAD and mode != "tiny":
            # remote-storage latency: 50 ms a sample; the byte budget a user would give
            # a 2 MiB-batch loader (64 MiB), the same for both streambuf rows
            slow = dict(
                base,
                workload=f"{wl} {SLOW_S * 1e3:.0f} ms",
                latency_s=SLOW_S,
                batches=2 * base["batches"],
            )
            out.append(
                dict(tdn, **slow, name=f"{slow['workload']}: torchdata.nodes {total} threads")
            )
            for threads in (s["threads"], "auto"):
                out.append(
                    dict(
                        sb,
                        **slow,
                        threads=threads,
                        max_bytes=SLOW_MAX_BYTES,
                        name=f"{slow['workload']}: streambuf {s['workers']}x"
                        f"{threads if threads != 'auto' else ' auto'} threads",
                    )
                )
        if wl in s["ladder_workloads"]:
            deep = max(s["pfs"])
            # 0 ms rows run 5x the batches: at 100-300 batches/s the base count is under a
            # second, where start-up transients, not the loaders, decide the figure
            zero = dict(base, batches=base["batches"] * (1 if mode == "tiny" else 5))
            out.append(
                dict(
                    zero,
                    kind="dataloader",
                    prefetch_factor=deep,
                    latency_s=0.0,
                    name=f"{wl} 0 ms: DataLoader pf={deep}",
                )
            )
            out.append(
                dict(
                    tdn,
                    batches=zero["batches"],
                    latency_s=0.0,
                    name=f"{wl} 0 ms: torchdata.nodes {total} threads",
                )
            )
            out.append(
                dict(sb, batches=zero["batches"], latency_s=0.0, name=f"{wl} 0 ms: streambuf")
            )
            if mode != "tiny":  # the ablation: the same without running cheap work inline
                out.append(
                    dict(
                        sb,
                        batches=zero["batches"],
                        latency_s=0.0,
                        adaptive=False,
                        name=f"{wl} 0 ms: streambuf adaptive=False",
                    )
                )
            # the cost of the per-stage time accounting where it shows most (no latency)
            out.append(
                dict(
                    sb,
                    batches=zero["batches"],
                    latency_s=0.0,
                    stage_stats=False,
                    name=f"{wl} 0 ms: streambuf, stage stats off",
                )
            )
    return out


def _measure(mode: str) -> dict[str, Any]:
    s = _settings(mode)

    def one(cfg: dict[str, Any]) -> dict[str, Any]:
        if s["growth"]:
            return with_growth(cfg, isolate=s["isolate"])
        return run_config(cfg, isolate=s["isolate"])

    keys = ["batches_per_s", "growth_bytes", "peak_in_flight_bytes"]
    rows = measure_configs(configs(mode), one, repeats=s["repeats"], label="latency", keys=keys)
    return {
        "settings": s,
        "latency_s": LATENCY_S,
        "batch_size": BATCH,
        "dataloader_ceiling_batches_per_s": s["workers"] / (LATENCY_S * BATCH),
        "rows": rows,
    }


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = report["rows"]
    ref = {r["config"]["workload"]: r for r in rows if r["name"].endswith("DataLoader pf=2")}
    nan = float("nan")
    out: list[tuple[Any, ...]] = [
        (
            r["name"],
            r["batches_per_s"],
            r["batches_per_s"] / ref[r["config"]["workload"]]["batches_per_s"]
            if r["config"]["workload"] in ref
            else nan,  # the 50 ms rows have no DataLoader row (minutes at 50 ms)
            r["growth_bytes"] / MIB,
        )
        for r in rows
    ]
    out.append(
        (
            "DataLoader theoretical ceiling, workers / (latency x batch)",
            report["dataloader_ceiling_batches_per_s"],
            float("nan"),
            float("nan"),
        )
    )
    return out


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    s = report["settings"]

    def rows(wl: str, lat: float) -> list[dict[str, Any]]:
        return [
            r
            for r in report["rows"]
            if (r["config"]["workload"], r["config"]["latency_s"]) == (wl, lat)
        ]

    def auto(r: dict[str, Any]) -> bool:
        return r["config"]["kind"] == "streambuf" and r["config"].get("threads") == "auto"

    def chose(r: dict[str, Any], peer: dict[str, Any]) -> str:
        got = r["runs"][-1].get("threads_chosen") or (0, float("nan"))
        effs = [x["efficiency"] for x in r["runs"] if "efficiency" in x]
        eff = f", {statistics.median(effs):.2f} of threads/latency once settled" if effs else ""
        return (
            f"batch {BATCH}, {s['workers']} workers, threads='auto' (chose {got[0]} in "
            f"all, reached at {got[1]:.2f} s{eff}) vs {short_name(peer)}"
        )

    out: list[Headline | None] = [
        versus(
            rows(wl, lat),
            "batches_per_s",
            workload=f"latency {wl} ({lat * 1e3:.0f} ms/sample)",
            metric="batches/s",
            how=f"batch {BATCH}, {s['workers']} workers x {s['threads']} threads vs "
            "DataLoader pf ladder and torchdata.nodes at equal total threads",
        )
        for wl in s["workloads"]
        for lat in (LATENCY_S, 0.0)
    ]
    slow = f"{SLOW_WORKLOAD} {SLOW_S * 1e3:.0f} ms"
    for wl, lat in [(wl, LATENCY_S) for wl in s["workloads"]] + [(slow, SLOW_S)]:
        got = rows(wl, lat)
        out.append(
            versus(
                got,
                "batches_per_s",
                workload=f"latency {wl.split()[0]} ({lat * 1e3:.0f} ms/sample), threads='auto'",
                metric="batches/s",
                mine=auto,
                peers=lambda r: r["config"]["kind"] == "torchdata",
                how=chose,
            )
        )
    return out


def _plot(report: dict[str, Any]) -> Ladder:
    s = report["settings"]
    return Ladder(
        title=f"seed workload ({s['workloads']['seed']} float32, 10 ms/sample, batch 32)",
        rows=[
            r
            for r in report["rows"]
            if r["config"]["workload"] == "seed" and r["config"]["latency_s"] > 0
        ],
        memory="growth_bytes" if s["growth"] else None,
    )


BENCHMARK = Benchmark(
    name="latency",
    measure=_measure,
    title=lambda r: (
        f"latency ladder ({r['mode']}): {LATENCY_S * 1e3:.0f} ms/sample, batch "
        f"{BATCH}, {r['settings']['workers']} workers; seed = {r['settings']['workloads']['seed']} "
        "float32"
    ),
    columns=("run", "batches/s", "x DataLoader pf=2", "growth MiB"),
    table=_table,
    headline=_headline,
    plot=_plot,
)
run = BENCHMARK.run
