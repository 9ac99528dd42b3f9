"""The shard cache: epoch 1 (download) against epoch 2 (from the cache), streambuf beside
webdataset's ``cache_dir``, over HTTP with 50 ms per request.

The network benchmark's shards (WebDataset layout, one 64 KiB ``bin`` field per sample)
served by its loopback server (a child process adding ``latency_s`` to every request
and pacing every connection to ``bandwidth_bps``). Each run reads two epochs through one
loader over a fresh cache folder, every reader decoding ``bin`` to a uint8 tensor, batch
16, 2 workers, and is checked to deliver every sample of each epoch exactly once:

* ``streambuf.shards(lanes=3, cache_dir=, cache_limit=)`` + ``Loader``: epoch 1 streams
  and writes the cache as it goes, epoch 2 reads the cache (its shard stats must show
  no network request in epoch 2);
* the same without a cache (both epochs download: the reference for epoch 1's cost);
* ``webdataset.WebDataset(urls, cache_dir=)`` + ``DataLoader``, per sample and batched
  in the dataset (``.batched(16)``): webdataset downloads each shard whole into its
  cache, then reads the file;
* references, not peers: streambuf and webdataset (batched) reading the same shards from
  local files, the most a cache can give each of them.

The rate is samples / seconds from the start of an epoch's iteration to its last batch
(DataLoader workers start again each epoch, for every reader). Medians of interleaved
repeats; the JSON holds every run.

    streambuf bench cache [--quick] [--out DIR]
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from ._benchmark import Benchmark
from ._deps import require
from ._harness import interleaved, median
from ._report import Headline, versus
from ._servers import loopback_only, serve
from ._shards import make_shards, to_tensor, wds_sample
from .network import link_how, measure_loader, settings, shards_how
from .workloads import loader_stats


def _streambuf(urls: list[str], s: dict[str, Any], cache: Path | None) -> dict[str, Any]:
    import streambuf as sb
    from streambuf.sources import shard_stats

    kw: dict[str, Any] = {}
    if cache is not None:
        kw = {"cache_dir": str(cache), "cache_limit": 4 * s["dataset_bytes"]}
    pipe = (
        sb.shards(urls, lanes=s["lanes"], shuffle_shards=False, **kw)
        .decode({"bin": to_tensor})
        .batch(s["batch_size"])
    )
    epochs = []
    with sb.Loader(
        pipe,
        num_workers=s["workers"],
        max_batches=4 * s["workers"],
        max_bytes=s["max_bytes"],
        timeout_s=120,
    ) as loader:
        for epoch in (0, 1):
            before = shard_stats(pipe)
            loader.set_epoch(epoch)
            res = measure_loader(loader, len(urls) * s["per_shard"])
            res.update(loader_stats(loader))
            after = shard_stats(pipe)
            res["requests"] = after.io.requests - before.io.requests
            res["cache_hits"] = after.cache.hits - before.cache.hits
            res["cache_bytes_saved"] = after.cache.bytes_saved - before.cache.bytes_saved
            epochs.append(res)
    if cache is not None and epochs[1]["requests"]:
        raise RuntimeError(f"epoch 2 made {epochs[1]['requests']} requests with the cache on")
    return {"epochs": epochs}


def _webdataset(
    urls: list[str], s: dict[str, Any], cache: Path, *, batched: bool
) -> dict[str, Any]:
    wds = require("webdataset", purpose="the cache benchmark's webdataset peer")
    ds = wds.WebDataset(urls, shardshuffle=False, cache_dir=str(cache)).map(wds_sample)
    if batched:
        ds = ds.batched(s["batch_size"])
    loader = DataLoader(
        ds,
        batch_size=None if batched else s["batch_size"],
        num_workers=s["workers"],
        timeout=120,
    )
    return {"epochs": [measure_loader(loader, len(urls) * s["per_shard"]) for _ in (0, 1)]}


READERS = (  # (kind, name, reader)
    ("streambuf", "streambuf cache", "cache"),
    ("streambuf", "streambuf no cache", "none"),
    ("webdataset", "webdataset cache_dir per sample", "wds"),
    ("webdataset", "webdataset cache_dir batched", "wds-batched"),
    ("reference", "streambuf local files", "disk"),
    ("reference", "webdataset local files batched", "wds-disk"),
)


def _run(
    cfg: dict[str, Any], urls: list[str], disk: list[str], s: dict[str, Any], tmp: Path
) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=tmp))  # fresh: epoch 1 downloads
    reader = cfg["reader"]
    if reader in ("cache", "none", "disk"):
        return _streambuf(
            disk if reader == "disk" else urls, s, cache if reader == "cache" else None
        )
    return _webdataset(disk if reader == "wds-disk" else urls, s, cache, batched=reader != "wds")


def _rows(s: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    data = tmp / "shards"
    index = make_shards(
        data, shards=s["shards"], per_shard=s["per_shard"], sample_bytes=s["sample_bytes"]
    )
    names = sorted({name for name, _, _ in index})
    s["dataset_bytes"] = sum((data / n).stat().st_size for n in names)
    cfgs = [{"name": name, "kind": kind, "reader": r} for kind, name, r in READERS]
    with serve("http", str(data), s["latency_s"], s["bandwidth_bps"]) as base:
        urls = [f"{base}/{n}" for n in names]
        disk = [str(data / n) for n in names]
        results = interleaved(
            cfgs, lambda c: _run(c, urls, disk, s, tmp), repeats=s["repeats"], label="cache"
        )
    rows = []
    for cfg, runs in zip(cfgs, results):
        for e in (0, 1):
            epoch_runs = [r["epochs"][e] for r in runs]
            rows.append(
                {
                    "name": f"{cfg['name']}: epoch {e + 1}",
                    "reader": cfg["name"],
                    "kind": cfg["kind"],
                    "epoch": e + 1,
                    "config": cfg,
                    "runs": epoch_runs,
                    "samples_per_s": median(epoch_runs, "samples_per_s"),
                    # network requests (streambuf's io.requests; for local files, opens)
                    "requests": float("nan")
                    if cfg["reader"] == "disk"
                    else median(epoch_runs, "requests"),
                }
            )
    return rows


def _measure(mode: str) -> dict[str, Any]:
    s = settings(mode)
    require("webdataset", purpose="the cache benchmark's webdataset peer")
    with loopback_only():  # never through a proxy
        with tempfile.TemporaryDirectory(prefix="streambuf-cache-") as tmp:
            rows = _rows(s, Path(tmp))
    return {"settings": s, "rows": rows}


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    s = report["settings"]
    return [
        versus(
            [r for r in report["rows"] if r["epoch"] == epoch],
            "samples_per_s",
            workload=f"cache epoch {epoch}, {what} (HTTP {link_how(s)})",
            metric="samples/s",
            how=shards_how(s) + ", a fresh cache folder per run",
            mine=lambda r: r["reader"] == "streambuf cache",
            peers=lambda r: r["kind"] == "webdataset",
            peer_name=lambda r: str(r["reader"]),
        )
        for epoch, what in ((1, "filling the cache"), (2, "from the cache"))
    ]


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    by = {(r["reader"], r["epoch"]): r for r in report["rows"]}
    out = []
    for _, name, _ in READERS:
        e1, e2 = by[(name, 1)]["samples_per_s"], by[(name, 2)]["samples_per_s"]
        out.append((name, e1, e2, e2 / e1, by[(name, 2)]["requests"]))
    return out


BENCHMARK = Benchmark(
    name="cache",
    measure=_measure,
    title=lambda r: (
        f"cache ({r['mode']}): {shards_how(r['settings'])}, over HTTP "
        f"({link_how(r['settings'])}), medians of {r['settings']['repeats']}"
    ),
    columns=(
        "reader",
        "epoch 1 samples/s",
        "epoch 2 samples/s",
        "epoch 2 / epoch 1",
        "epoch 2 requests",
    ),
    table=_table,
    headline=_headline,
)
run = BENCHMARK.run
