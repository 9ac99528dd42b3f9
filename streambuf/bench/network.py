"""Tar shards over HTTP, local disk and S3: streambuf lanes against webdataset and map-style.

Shards (WebDataset layout, one 64 KiB ``bin`` field per sample) are made here, then read
in one run, interleaved, every reader decoding ``bin`` to a uint8 tensor, batch 16, the
same 2 workers, and checked to deliver every sample exactly once:

* **http**: a loopback server (a child process) adding ``latency_s`` (50 ms) to every
  request and pacing every connection to ``bandwidth_bps`` (4 MB/s), like an object
  store: throughput comes from concurrent streams. Readers: ``streambuf.shards(lanes=3)``
  + ``Loader``; ``webdataset.WebDataset(urls)`` + ``DataLoader``, per sample (DataLoader
  batches) and batched in the dataset (``.batched(16)``, ``batch_size=None``: what
  webdataset recommends); a map-style Dataset with one HTTP Range GET per sample under
  ``DataLoader(prefetch_factor=2, 4, 8)``, on a fixed random subset (the whole epoch
  would take minutes); and streambuf's lane ladder, ``lanes`` = 1, 2, 4, 8 and
  ``"auto"`` (section ``http-lanes``: auto must match the best fixed count).
* **disk**: shards from local files (more of them, ``local_shards x local_per_shard``:
  an epoch of the HTTP section's size reads in ~0.1 s, mostly worker start-up):
  streambuf against webdataset per sample and batched (no latency: this measures
  per-sample overhead and transport); **disk-32**: the same with every reader in batches
  of 32.
* **s3**: the disk section's shards in moto's S3 server (a child process; skipped and recorded
  when moto or s3fs is missing): streambuf through fsspec/s3fs against webdataset with
  an fsspec ``s3://`` handler, per sample and batched.

The rate is samples / seconds from creating the loader to its last batch (worker start
up included: shard readers pay it once per epoch), the rate after the first batch beside
it. Medians of interleaved repeats; the JSON holds every run.

    streambuf bench network [--quick] [--out DIR]
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ._benchmark import Benchmark
from ._deps import importable, require
from ._harness import measure_configs
from ._report import Headline, versus
from ._servers import loopback_only, serve
from ._shards import RangeDataset, WdsS3Handler, make_shards, to_tensor, upload, wds_sample
from .workloads import loader_stats

KIB, MIB = 1 << 10, 1 << 20
BIG_BATCH = 32  # the disk section again, every reader in batches of this many


def settings(mode: str) -> dict[str, Any]:
    if mode == "tiny":
        return {
            "shards": 4,
            "per_shard": 4,
            "local_shards": 4,
            "local_per_shard": 8,
            "sample_bytes": 4 * KIB,
            "latency_s": 0.005,
            "bandwidth_bps": 50e6,
            "workers": 2,
            "lanes": 3,
            "batch_size": 4,
            "max_bytes": 16 * MIB,
            "map_samples": 8,
            "prefetch_factors": [2],
            "repeats": 1,
            "lane_ladder": ["auto"],
        }
    quick = mode == "quick"
    return {
        "shards": 12 if quick else 24,
        "per_shard": 16 if quick else 32,
        # disk and S3 read ~50x faster than the paced HTTP link: more data, so that the
        # rate measures reading rather than worker start-up (~40 ms of a 100 ms epoch)
        "local_shards": 32 if quick else 64,
        "local_per_shard": 32 if quick else 64,
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
        "lane_ladder": [1, 2, 4, 8, "auto"],
    }


def measure_loader(loader: Iterable[Any], expected: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    n = first_n = 0
    t_first = t0
    keys: set[str] = set()
    for batch in loader:
        if n == 0:
            t_first, first_n = time.perf_counter(), len(batch["__key__"])
        n += len(batch["__key__"])
        keys.update(batch["__key__"])
        if batch["bin"].dtype != torch.uint8:
            raise TypeError(f"expected uint8 batches, got {batch['bin'].dtype}")
    t_end = time.perf_counter()
    return {
        "samples": n,
        "distinct_samples": len(keys),
        "expected_samples": expected,
        "seconds": t_end - t0,
        "samples_per_s": n / (t_end - t0),
        "steady_samples_per_s": (n - first_n) / max(1e-9, t_end - t_first),
        "first_batch_s": t_first - t0,
    }


def _streambuf(
    urls: list[str], s: dict[str, Any], options: dict[str, Any] | None, lanes: Any = None
) -> dict[str, Any]:
    import streambuf as sb

    pipe = (
        sb.shards(
            urls,
            lanes=s["lanes"] if lanes is None else lanes,
            shuffle_shards=False,
            storage_options=options,
        )
        .decode({"bin": to_tensor})
        .batch(s["batch_size"])
    )
    with sb.Loader(
        pipe,
        num_workers=s["workers"],
        max_batches=4 * s["workers"],
        max_bytes=s["max_bytes"],
        timeout_s=120,
    ) as loader:
        res = measure_loader(loader, len(urls) * s["per_shard"])
        res.update(loader_stats(loader))
    for t in pipe.stats().threads:  # lanes="auto": the threads over the lanes, per worker
        res["lane_threads_mean"] = round(t.mean, 2)
        res["lane_thread_changes"] = t.changes
    return res


def _webdataset(
    urls: list[str], s: dict[str, Any], *, batched: bool, s3: dict[str, Any] | None
) -> dict[str, Any]:
    wds = require("webdataset", purpose="the network benchmark's webdataset peer")
    handler = WdsS3Handler(s3) if s3 is not None else None
    if handler is not None:
        handler.install()
    ds = wds.WebDataset(urls, shardshuffle=False).map(wds_sample)
    if batched:
        ds = ds.batched(s["batch_size"])
    loader = DataLoader(
        ds,
        batch_size=None if batched else s["batch_size"],
        num_workers=s["workers"],
        timeout=120,
        worker_init_fn=handler.install if handler is not None else None,
    )
    return measure_loader(loader, len(urls) * s["per_shard"])


def _map_style(base_url: str, index: list[Any], s: dict[str, Any], pf: int) -> dict[str, Any]:
    subset = random.Random(0).sample(range(len(index)), s["map_samples"])
    loader = DataLoader(
        RangeDataset(base_url, index),
        batch_size=s["batch_size"],
        sampler=subset,
        num_workers=s["workers"],
        prefetch_factor=pf,
        timeout=120,
    )
    return measure_loader(loader, len(subset))


Case = tuple[str, str, str, Callable[[], dict[str, Any]]]  # (section, kind, name, run)


def _wds_cases(
    section: str, urls: list[str], s: dict[str, Any], s3: dict[str, Any] | None
) -> list[Case]:
    return [
        (
            section,
            "webdataset",
            f"{section}: webdataset per sample",
            lambda: _webdataset(urls, s, batched=False, s3=s3),
        ),
        (
            section,
            "webdataset",
            f"{section}: webdataset batched",
            lambda: _webdataset(urls, s, batched=True, s3=s3),
        ),
    ]


def _run_cases(cases: list[Case], repeats: int) -> list[dict[str, Any]]:
    cfgs = [{"name": name, "kind": kind, "section": sec} for sec, kind, name, _ in cases]
    fns = {name: fn for _, _, name, fn in cases}
    keys = ["samples_per_s", "steady_samples_per_s"]
    rows = measure_configs(
        cfgs, lambda c: fns[c["name"]](), repeats=repeats, label="network", keys=keys
    )
    for r in rows:
        r["section"] = r["config"]["section"]
    return rows


def local(s: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The settings of the disk and S3 sections: more shards, more samples per shard."""
    return dict(s, shards=s["local_shards"], per_shard=s["local_per_shard"], **changes)


def _all_rows(s: dict[str, Any], tmp: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    index = make_shards(
        tmp, shards=s["shards"], per_shard=s["per_shard"], sample_bytes=s["sample_bytes"]
    )
    names = sorted({name for name, _, _ in index})
    sl = local(s)
    big = tmp / "local"
    big_index = make_shards(
        big, shards=sl["shards"], per_shard=sl["per_shard"], sample_bytes=sl["sample_bytes"]
    )
    disk = [str(big / n) for n in sorted({name for name, _, _ in big_index})]
    notes: dict[str, Any] = {}
    with serve("http", str(tmp), s["latency_s"], s["bandwidth_bps"]) as base:
        http = [f"{base}/{n}" for n in names]
        cases: list[Case] = [
            (
                "http",
                "streambuf",
                f"http: streambuf lanes={s['lanes']}",
                lambda: _streambuf(http, s, None),
            )
        ]
        # the lane ladder and lanes="auto" (issue 26: auto >= the best fixed count)
        for lanes in s["lane_ladder"]:
            cases.append(
                (
                    "http-lanes",
                    "streambuf",
                    f"http: streambuf lanes={lanes}",
                    partial(_streambuf, http, s, None, lanes),
                )
            )
        cases += _wds_cases("http", http, s, None)
        for pf in s["prefetch_factors"]:
            cases.append(
                (
                    "http",
                    "map-style",
                    f"http: map-style Range GET pf={pf}",
                    partial(_map_style, base, index, s, pf),
                )
            )
        cases.append(
            (
                "disk",
                "streambuf",
                f"disk: streambuf lanes={s['lanes']}",
                lambda: _streambuf(disk, sl, None),
            )
        )
        cases += _wds_cases("disk", disk, sl, None)
        # the same shards in batches of 32 on both sides (issue 25's "batched 32" row)
        s32 = dict(sl, batch_size=BIG_BATCH)
        cases.append(
            (
                "disk-32",
                "streambuf",
                f"disk-32: streambuf lanes={s['lanes']}",
                lambda: _streambuf(disk, s32, None),
            )
        )
        cases += _wds_cases("disk-32", disk, s32, None)
        rows = _run_cases(cases, s["repeats"])
    missing = importable("moto.server") or importable("s3fs")
    if missing:
        notes["s3"] = missing
        return rows, notes
    with serve("moto") as endpoint:
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        s3 = upload(big, "streambuf-bench", options)
        cases = [
            (
                "s3",
                "streambuf",
                f"s3: streambuf lanes={s['lanes']}",
                lambda: _streambuf(s3, sl, options),
            ),
            (
                "s3",
                "streambuf",
                "s3: streambuf lanes=auto",
                lambda: _streambuf(s3, sl, options, "auto"),
            ),
        ]
        cases += _wds_cases("s3", s3, sl, options)
        rows += _run_cases(cases, s["repeats"])
    return rows, notes


def _measure(mode: str) -> dict[str, Any]:
    s = settings(mode)
    require("webdataset", purpose="the network benchmark's webdataset peer")
    with loopback_only():  # never through a proxy
        with tempfile.TemporaryDirectory(prefix="streambuf-net-") as tmp:
            rows, notes = _all_rows(s, Path(tmp))
    return {"settings": s, "notes": notes, "rows": rows}


def shards_how(s: dict[str, Any]) -> str:
    """The shards and loaders of a run, for a headline's ``how``."""
    return (
        f"{s['shards']} shards x {s['per_shard']} x {s['sample_bytes'] >> 10} KiB, "
        f"{s['workers']} workers, batch {s['batch_size']}"
    )


def link_how(s: dict[str, Any]) -> str:
    """The HTTP server's latency and pacing, for titles and headlines."""
    return (
        f"+{s['latency_s'] * 1e3:.0f} ms/request, {s['bandwidth_bps'] / 1e6:g} MB/s per connection"
    )


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    s = report["settings"]
    sections = {
        "http": (f"network HTTP ({link_how(s)})", s),
        "disk": ("network local disk", local(s)),
        "disk-32": (f"network local disk, batch {BIG_BATCH}", local(s, batch_size=BIG_BATCH)),
        "s3": ("network S3 (moto on loopback)", local(s)),
    }
    out = [
        versus(
            [r for r in report["rows"] if r["section"] == section],
            "samples_per_s",
            workload=label,
            metric="samples/s",
            how=shards_how(section_s) + ", loader creation to last batch",
        )
        for section, (label, section_s) in sections.items()
    ]
    http = [r for r in report["rows"] if r["section"] in ("http", "http-lanes")]
    out.append(
        versus(
            http,
            "samples_per_s",
            workload=f"network HTTP, lanes='auto' ({link_how(s)})",
            metric="samples/s",
            mine=lambda r: r["name"].endswith("lanes=auto"),
            how=shards_how(s) + ", loader creation to last batch",
        )
    )
    out.append(
        versus(
            [r for r in report["rows"] if r["section"] == "s3"],
            "samples_per_s",
            workload="network S3 (moto on loopback), lanes='auto'",
            metric="samples/s",
            mine=lambda r: r["name"].endswith("lanes=auto"),
            how=shards_how(local(s)) + ", loader creation to last batch",
        )
    )
    return out


BENCHMARK = Benchmark(
    name="network",
    measure=_measure,
    title=lambda r: (
        f"network ({r['mode']}): http {shards_how(r['settings'])}; disk and s3 "
        f"{shards_how(local(r['settings']))}; medians of {r['settings']['repeats']}"
    ),
    columns=("reader", "samples/s", "after 1st batch", "MB/s"),
    table=lambda r: [
        (
            x["name"],
            x["samples_per_s"],
            x["steady_samples_per_s"],
            x["samples_per_s"] * r["settings"]["sample_bytes"] / 1e6,
        )
        for x in r["rows"]
    ],
    headline=_headline,
)
run = BENCHMARK.run
