"""Samples/s over a slow HTTP server: streambuf lanes vs webdataset vs map-style range GETs.

The server (a child process, ``benchmarks._netdata.Server``) adds ``latency_s`` (50 ms)
to every request and paces every connection to ``bandwidth_bps``, like an object store:
throughput comes from concurrent streams. Over the same shards, in one run:

* (a) ``streambuf.shards(lanes=3)`` through ``streambuf.Loader`` with ``workers`` workers;
* (b) ``webdataset.WebDataset(urls, shardshuffle=False)`` through ``DataLoader`` with the
  same workers (its http reader is ``curl``, one stream per worker);
* (c) a map-style ``Dataset`` doing one HTTP Range GET per sample (a persistent
  connection per worker) under ``DataLoader(prefetch_factor=2, 4, 8)``, on a fixed
  random subset of the samples (its rate is steady; the whole epoch would take minutes).

Every run uses the same batch size, decodes ``bin`` to a uint8 tensor and checks it got
every sample once. Runs are interleaved (a b c2 c4 c8, repeated) and medians quoted; the
rate is samples / seconds from creating the loader to its last batch (worker start-up
included), with the rate after the first batch beside it. Writes JSON with every figure.

    python -m benchmarks.network_shards [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import streambuf as sb
from benchmarks._netdata import RangeDataset, Server, make_dataset, to_tensor, wds_sample

KIB, MIB = 1 << 10, 1 << 20


def config(quick: bool) -> dict[str, Any]:
    """Sizes of one run (the smoke test passes smaller ones)."""
    return {
        "shards": 12 if quick else 24,
        "per_shard": 16 if quick else 32,
        "sample_bytes": 64 * KIB,
        "latency_s": 0.05,
        "bandwidth_bps": 4e6,
        "workers": 2,
        "lanes": 3,
        "batch_size": 16,
        "max_bytes": 64 * MIB,
        "map_samples": 64 if quick else 160,
        "prefetch_factors": [2, 4, 8],
        "repeats": 2 if quick else 3,
    }


def _measure(loader: Iterable[Any], expected: int) -> dict[str, float]:
    t0 = time.perf_counter()
    n = first_n = 0
    t_first = t0
    keys: set[str] = set()
    for batch in loader:
        if n == 0:
            t_first, first_n = time.perf_counter(), len(batch["__key__"])
        n += len(batch["__key__"])
        keys.update(batch["__key__"])
        assert batch["bin"].dtype == torch.uint8
    t_end = time.perf_counter()
    if n != expected or len(keys) != expected:
        raise RuntimeError(f"expected {expected} samples once, got {n} ({len(keys)} distinct)")
    return {
        "samples": n,
        "seconds": t_end - t0,
        "samples_per_s": n / (t_end - t0),
        "steady_samples_per_s": (n - first_n) / max(1e-9, t_end - t_first),
        "first_batch_s": t_first - t0,
    }


def _streambuf(urls: list[str], cfg: dict[str, Any]) -> dict[str, float]:
    pipe = (
        sb.shards(urls, lanes=cfg["lanes"], shuffle_shards=False)
        .decode({"bin": to_tensor})
        .batch(cfg["batch_size"])
    )
    loader = sb.Loader(
        pipe,
        num_workers=cfg["workers"],
        max_batches=4 * cfg["workers"],
        max_bytes=cfg["max_bytes"],
        timeout_s=120,
    )
    return _measure(loader, len(urls) * cfg["per_shard"])


def _webdataset(urls: list[str], cfg: dict[str, Any]) -> dict[str, float]:
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=False).map(wds_sample)
    loader = DataLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"], timeout=120)
    return _measure(loader, len(urls) * cfg["per_shard"])


def _map_style(base_url: str, index: list[Any], cfg: dict[str, Any], pf: int) -> dict[str, float]:
    subset = random.Random(0).sample(range(len(index)), cfg["map_samples"])
    loader = DataLoader(
        RangeDataset(base_url, index),
        batch_size=cfg["batch_size"],
        sampler=subset,
        num_workers=cfg["workers"],
        prefetch_factor=pf,
        timeout=120,
    )
    return _measure(loader, len(subset))


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("streambuf", "webdataset"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # not installed as a distribution: report what we can
            out[pkg] = "?"
    return out


def _run_all(cfg: dict[str, Any]) -> dict[str, list[dict[str, float]]]:
    """Make the shards, start the server, run every case ``repeats`` times, interleaved."""
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="streambuf-net-") as tmp:
        index = make_dataset(
            Path(tmp),
            shards=cfg["shards"],
            per_shard=cfg["per_shard"],
            sample_bytes=cfg["sample_bytes"],
        )
        with Server(
            Path(tmp), latency_s=cfg["latency_s"], bandwidth_bps=cfg["bandwidth_bps"]
        ) as srv:
            urls = sb.sources.expand_urls(
                f"{srv.base_url}/shard-{{000000..{cfg['shards'] - 1:06d}}}.tar"
            )
            cases: dict[str, Callable[[], dict[str, float]]] = {
                f"(a) streambuf lanes={cfg['lanes']}": lambda: _streambuf(urls, cfg),
                "(b) webdataset": lambda: _webdataset(urls, cfg),
            }
            for pf in cfg["prefetch_factors"]:
                cases[f"(c) map-style pf={pf}"] = lambda pf=pf: _map_style(
                    srv.base_url, index, cfg, pf
                )
            for r in range(cfg["repeats"]):  # interleaved: a b c c c, a b c c c, ...
                for name, fn in cases.items():
                    res = fn()
                    runs.setdefault(name, []).append(res)
                    print(
                        f"  round {r + 1}: {name:<28} {res['samples_per_s']:8.1f} samples/s",
                        flush=True,
                    )
    return runs


def run(
    *, quick: bool = False, out: str | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    cfg = {**config(quick), **(overrides or {})}
    saved = dict(os.environ)
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        os.environ.pop(var, None)  # loopback only: never through a proxy (curl included)
    os.environ["no_proxy"] = os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    try:
        runs = _run_all(cfg)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    report = _report(cfg, runs)
    _print_table(report)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "network_shards.json"
        path.write_text(json.dumps(report, indent=2))
        print(f"wrote {path}")
    return report


def _report(cfg: dict[str, Any], runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    rows = {}
    for name, rs in runs.items():
        rows[name] = {
            "runs": rs,
            "median_samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
            "median_steady_samples_per_s": statistics.median(r["steady_samples_per_s"] for r in rs),
        }
    names = list(rows)
    a = rows[names[0]]["median_samples_per_s"]
    b = rows[names[1]]["median_samples_per_s"]
    best_c = max(rows[n]["median_samples_per_s"] for n in names[2:])
    return {
        "benchmark": "network_shards",
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_after": os.getloadavg(),
        "versions": _versions(),
        "config": cfg,
        "rows": rows,
        "ratios": {
            "a_over_b": a / b,
            "a_over_best_c": a / best_c,
            "targets": {"a_over_b": 2.0, "a_over_best_c": 5.0},
        },
    }


def _print_table(report: dict[str, Any]) -> None:
    cfg, rows = report["config"], report["rows"]
    a = next(iter(rows.values()))["median_samples_per_s"]
    print(
        f"\n{cfg['shards']} shards x {cfg['per_shard']} samples x {cfg['sample_bytes'] // KIB} "
        f"KiB; server: +{cfg['latency_s'] * 1000:.0f} ms/request, "
        f"{cfg['bandwidth_bps'] / 1e6:.0f} MB/s per connection; {cfg['workers']} workers, "
        f"batch {cfg['batch_size']}; medians of {cfg['repeats']}"
    )
    print(f"{'approach':<30}{'samples/s':>11}{'after 1st':>11}{'MB/s':>8}{'(a) is':>9}")
    for name, row in rows.items():
        rate = row["median_samples_per_s"]
        mbs = rate * cfg["sample_bytes"] / 1e6
        print(
            f"{name:<30}{rate:>11.1f}{row['median_steady_samples_per_s']:>11.1f}{mbs:>8.1f}"
            f"{a / rate:>8.1f}x"
        )
    r = report["ratios"]
    print(
        f"(a)/(b) = {r['a_over_b']:.2f} (target >= 2); "
        f"(a)/best (c) = {r['a_over_best_c']:.2f} (target >= 5)"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results")
    a = p.parse_args(argv)
    run(quick=a.quick, out=a.out)


if __name__ == "__main__":
    main()
