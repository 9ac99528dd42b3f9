"""What every benchmark shares: child-process runs under a memory watch, interleaved
repeats with medians, the environment record, tables, JSON and plots.

A *run* is one loader configuration executed in a fresh child process (so allocator
state and imports never leak between runs) while this process samples system used
memory (``streambuf.memwatch``). The child reports steady-state throughput: batches/s
between the first and the last batch, so worker start-up is excluded for every side.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from streambuf.memwatch import watch

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


# -- the child ----------------------------------------------------------------------------
def child_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """Iterate one loader described by ``cfg`` (runs in the child process)."""
    import torch
    from torch.utils.data import DataLoader

    import streambuf as sb
    from benchmarks._workloads import MapDataset, SampleMaker

    maker = SampleMaker(
        sample_bytes=cfg["sample_bytes"],
        latency_s=cfg.get("latency_s", 0.0),
        lognormal_sigma=cfg.get("lognormal_sigma", 0.0),
        phase_samples=cfg.get("phase_samples", 0),
        slow_latency_s=cfg.get("slow_latency_s", 0.0),
    )
    n = cfg["batches"] * cfg["batch_size"]
    if cfg["kind"] == "dataloader":
        loader: Any = DataLoader(
            MapDataset(n, maker),
            batch_size=cfg["batch_size"],
            num_workers=cfg["workers"],
            prefetch_factor=cfg["prefetch_factor"],
        )
    else:
        pipe = (
            sb.Pipeline(range(n))
            .map(maker, threads=cfg["threads"], ordered=cfg.get("ordered", True))
            .batch(cfg["batch_size"])
        )
        loader = sb.Loader(
            pipe,
            num_workers=cfg["workers"],
            max_batches=cfg["max_batches"],
            max_bytes=cfg["max_bytes"],
            in_order=cfg.get("in_order", True),
            adaptive=cfg.get("adaptive", True),
        )
    step_s = cfg.get("step_s", 0.0)
    times: list[float] = []
    waits: list[float] = []
    seen = 0
    t_req = time.perf_counter()
    for batch in loader:
        t_got = time.perf_counter()
        waits.append(t_got - t_req)
        times.append(t_got)
        seen += int(batch.shape[0])
        if step_s:
            _busy_wait(step_s)
        t_req = time.perf_counter()
    steady = times[-1] - times[0] if len(times) > 1 else float("nan")
    # wait fraction over the steady part: from the first batch to the end of the last step
    end = time.perf_counter()
    out: dict[str, Any] = {
        "samples": seen,
        "batches": len(times),
        "batches_per_s": (len(times) - 1) / steady if steady > 0 else float("nan"),
        "wait_fraction": sum(waits[1:]) / max(1e-9, end - times[0]),
        "first_batch_s": waits[0] if waits else float("nan"),
    }
    if isinstance(loader, sb.Loader):
        b = loader.stats().budget
        if b is not None:
            out["peak_in_flight_bytes"] = b.peak_in_flight_bytes
            out["peak_batch_bytes_held"] = b.peak_batch_bytes_held
            out["oversize"] = b.oversize
        st = loader.stats()
        out["final_depth"] = st.depth
        out["tuner_decisions"] = [d.as_dict() for d in st.decisions]
    del torch
    return out


def _busy_wait(seconds: float) -> None:
    """A stand-in for a train step that releases the GIL (sleep) like a CUDA launch does."""
    time.sleep(seconds)


def run_child(cfg: dict[str, Any], *, timeout_s: float = 600) -> dict[str, Any]:
    """Run ``cfg`` in a child process under a memory watch; its report plus ``peak``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def go() -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks._child", json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=str(ROOT),
        )
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark child failed ({cfg}):\n{proc.stderr[-3000:]}")
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))

    report, peak = watch(go)
    report["peak"] = peak.peak
    report["shm_peak"] = peak.shm_peak
    return report


def with_growth(cfg: dict[str, Any]) -> dict[str, Any]:
    """``run_child(cfg)`` plus ``growth_bytes``: its peak minus the tiny-sample run's."""
    tiny = run_child(dict(cfg, sample_bytes=4))
    real = run_child(cfg)
    real["tiny_peak"] = tiny["peak"]
    real["growth_bytes"] = real["peak"] - tiny["peak"]
    return real


# -- repeats, environment, output -------------------------------------------------------
def bench_main(run: Callable[..., dict[str, Any]], doc: str | None, argv: list[str] | None) -> None:
    """The command line every ladder benchmark shares: ``[--quick] [--out DIR]``."""
    import argparse

    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results")
    a = p.parse_args(argv)
    run(quick=a.quick, out=a.out)


def interleaved(
    configs: Sequence[dict[str, Any]],
    fn: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    repeats: int,
    label: str,
) -> list[list[dict[str, Any]]]:
    """Run every config ``repeats`` times, interleaved (A B C A B C ...), with a progress bar."""
    from tqdm import tqdm

    results: list[list[dict[str, Any]]] = [[] for _ in configs]
    with tqdm(total=repeats * len(configs), desc=label, file=sys.stderr, leave=False) as bar:
        for _ in range(repeats):
            for i, cfg in enumerate(configs):
                bar.set_postfix_str(cfg.get("name", str(i)))
                results[i].append(fn(cfg))
                bar.update()
    return results


def median(rows: Sequence[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if key in r and r[key] == r[key]]
    return float(statistics.median(vals)) if vals else float("nan")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def environment() -> dict[str, Any]:
    """Versions, CPU count/affinity and cgroup limits, for the JSON record."""
    import numpy
    import torch

    import streambuf

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "streambuf": streambuf.__version__,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max"),
        "cgroup_memory_max": _read("/sys/fs/cgroup/memory.max"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a Markdown table."""

    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def write_json(out: str | None, name: str, report: dict[str, Any]) -> Path | None:
    if not out:
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / f"{name}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {path}", flush=True)
    return path


def plot_ladder(
    out: str | None,
    name: str,
    *,
    title: str,
    dl_depths: Sequence[float],
    dl_throughput: Sequence[float],
    dl_memory_mib: Sequence[float],
    sb_points: Sequence[tuple[str, float, float]],
    throughput_label: str = "batches/s",
) -> Path | None:
    """Throughput and memory growth against DataLoader depth, streambuf's points beside."""
    if not out:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(dl_depths, dl_throughput, "o-", label="DataLoader prefetch_factor=k")
    ax2.plot(dl_depths, dl_memory_mib, "o-", label="DataLoader prefetch_factor=k")
    for label, thr, mem in sb_points:
        ax1.axhline(thr, linestyle="--", color="C1")
        ax1.annotate(label, (dl_depths[0], thr), color="C1", va="bottom")
        ax2.axhline(mem, linestyle="--", color="C1")
        ax2.annotate(label, (dl_depths[0], mem), color="C1", va="bottom")
    ax1.set_xscale("log", base=2)
    ax2.set_xscale("log", base=2)
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    ax1.set_xlabel("prefetch_factor")
    ax2.set_xlabel("prefetch_factor")
    ax1.set_ylabel(throughput_label)
    ax2.set_ylabel("memory growth (MiB)")
    ax1.legend(loc="best", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", flush=True)
    return path
