"""Video clips: ``video.clips`` + ``Loader`` against what users write with PyAV and torchcodec.

On videos it generates (H.264 720p, 30 fps, 2 B-frames, a keyframe every ``gop``
frames: 30 = 1 s and 250 = ~8 s; output 224x224 RGB uint8; one FFmpeg thread per
decoder everywhere), random 16-frame clips, 2 per video, batch 4, the same 2 workers:

* **streambuf**: ``video.clips(paths, sampler=clips_at_random_indices(...))`` through
  ``Loader`` (each video opened once, its clips decoded forward, seeking only past the
  next keyframe);
* **PyAV seek-per-clip** (the strongest PyAV peer): a map-style Dataset whose item is a
  clip; it opens the file, seeks to the keyframe before the clip and decodes forward,
  under ``DataLoader(prefetch_factor=1, 2, 4, 8)``, shuffled; it gets the very clips
  streambuf's sampler draws, and a check confirms both produce identical frames;
* **torchcodec** ``VideoDecoder(seek_mode="approximate")`` + its
  ``samplers.clips_at_random_indices``, item = a video, where torchcodec imports (its
  PyPI wheel needs a CUDA build of torch); otherwise the JSON records why not;
* footnote: decode-from-start (no seek), the strawman older READMEs compared with.

Throughput is clips / seconds from creating the loader to its last batch. In full runs
a decode-overhead section (``_video_overhead``) compares a plain PyAV loop with
``clips()`` on the same frames. Repeats interleaved and rotated, medians quoted.

    streambuf bench video [--quick] [--out DIR]
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ._benchmark import Benchmark
from ._deps import importable, progress, require
from ._harness import median
from ._report import Headline, Table, versus
from ._video_data import make_videos
from ._video_overhead import decode_overhead
from ._video_peers import FromStart, SeekPerClip, TorchcodecVideos, torchcodec_resize_mode
from .workloads import loader_stats


@dataclass(frozen=True)
class Config:
    width: int = 1280
    height: int = 720
    fps: int = 30
    seconds: float = 20.0
    gops: tuple[int, ...] = (30, 250)  # keyframe interval, frames: 1 s and ~8 s
    size: int = 224  # output width = height
    distinct: int = 2  # videos encoded per GOP; the others are copies
    videos: int = 16
    clips_per_video: int = 2
    frames_per_clip: int = 16
    batch: int = 4
    workers: int = 2
    lanes: int = 2  # streambuf: videos decoded at once per worker
    repeats: int = 3
    prefetch_factors: tuple[int, ...] = (1, 2, 4, 8)
    torchcodec_pfs: tuple[int, ...] = (2, 8)
    overhead_videos: int = 8  # 0: skip the decode-overhead section


FULL = Config()
QUICK = replace(
    FULL,
    seconds=10.0,
    videos=8,
    repeats=1,
    prefetch_factors=(2, 8),
    torchcodec_pfs=(2,),
    overhead_videos=0,
)
TINY = replace(  # the smoke test: proves it runs, measures nothing
    FULL,
    width=160,
    height=96,
    seconds=2.0,
    gops=(30,),
    size=32,
    distinct=1,
    videos=2,
    repeats=1,
    prefetch_factors=(2,),
    torchcodec_pfs=(2,),
    overhead_videos=2,
)


def _sampler(cfg: Config) -> Any:
    import streambuf.video as sv

    return sv.clips_at_random_indices(
        num_clips=cfg.clips_per_video, num_frames_per_clip=cfg.frames_per_clip
    )


def same_clips(paths: list[str], cfg: Config) -> list[tuple[str, list[int], list[int]]]:
    """The clips streambuf draws with seed 0, epoch 0 (video i: generator (0, 0, i)),
    with their frames' pts, for the PyAV peers."""
    import streambuf.video as sv

    sampler, items = _sampler(cfg), []
    for i, p in enumerate(paths):
        info = sv.probe(p)
        for idx in sampler.sample(info, sv.sampler_rng(0, 0, i)):
            items.append((p, list(idx), [int(info.pts[j]) for j in idx]))
    return items


def seek_per_clip_frames(paths: list[str], cfg: Config) -> int:
    """Frames the seek-per-clip peer decodes (it decodes every frame from the keyframe
    before a clip to the clip's last frame, in presentation order)."""
    import streambuf.video as sv

    sampler, total = _sampler(cfg), 0
    for i, p in enumerate(paths):
        info = sv.probe(p)
        for idx in sampler.sample(info, sv.sampler_rng(0, 0, i)):
            total += max(idx) - info.keyframe_before(min(idx)) + 1
    return total


def _count(batches: Any, *, nested: bool = False) -> int:
    return sum(int(b.shape[0] * (b.shape[1] if nested else 1)) for b in batches)


def cuda_decoder() -> str | None:
    """Why ``decoder="cuda"`` cannot run here, or None when it can (a CUDA device and
    PyAV's cuda hwaccel): the GPU row is measured only where it can."""
    from streambuf.video.gpu import check_decoder

    try:
        check_decoder("cuda")
    except (ValueError, ImportError) as exc:
        return str(exc)
    return None


def _streambuf(paths: list[str], cfg: Config, decoder: str = "cpu") -> dict[str, Any]:
    import streambuf as sb
    import streambuf.video as sv

    # decoder="cuda" decodes in this process (NVDEC): as many videos at once as the
    # CPU rows' workers x lanes
    on_gpu = decoder != "cpu"
    lanes = cfg.workers * cfg.lanes if on_gpu else cfg.lanes
    pipe = sv.clips(
        paths,
        sampler=_sampler(cfg),
        width=cfg.size,
        height=cfg.size,
        seed=0,
        threads=lanes,
        decoder=decoder,
    )
    with sb.Loader(
        pipe.batch(cfg.batch),
        num_workers=0 if on_gpu else cfg.workers,
        max_batches=8,
        max_bytes="512MiB",
    ) as loader:
        n = sum(int(b.data.shape[0]) for b in loader)
        if on_gpu:
            torch.cuda.synchronize()  # the conversions launched are part of the time
        work = pipe.stats().videos
        return {
            "samples": n,
            "frames_decoded": work.frames_decoded,
            "frames_delivered": n * cfg.frames_per_clip,
            **loader_stats(loader),
        }


def _map_style(ds: Any, cfg: Config, pf: int, batch: int, nested: bool) -> dict[str, Any]:
    dl = DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=cfg.workers,
        prefetch_factor=pf,
    )
    return {"samples": _count(dl, nested=nested)}


def _check_same_frames(paths: list[str], cfg: Config, ds: SeekPerClip) -> bool:
    import streambuf.video as sv

    first = sorted(
        sv.decode_clips(paths[0], sampler=_sampler(cfg), width=cfg.size, height=cfg.size),
        key=lambda c: int(c.clip_index),
    )
    return all(torch.equal(first[k].data, ds[k]) for k in range(cfg.clips_per_video))


def _variants(paths: list[str], cfg: Config, torchcodec: str | None) -> tuple[dict[str, Any], bool]:
    clips = same_clips(paths, cfg)
    seek, start = SeekPerClip(clips, cfg.size), FromStart(clips, cfg.size)
    v: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "streambuf video.clips + Loader": ("streambuf", lambda: _streambuf(paths, cfg))
    }
    if cuda_decoder() is None:  # NVDEC, in the training process (streambuf.video.gpu)
        v["streambuf video.clips decoder='cuda' + Loader(num_workers=0)"] = (
            "streambuf-cuda",
            lambda: _streambuf(paths, cfg, "cuda"),
        )
    for pf in cfg.prefetch_factors:
        v[f"PyAV seek-per-clip pf={pf}"] = (
            "seek-per-clip",
            partial(_map_style, seek, cfg, pf, cfg.batch, False),
        )
    if torchcodec is None:
        tc = TorchcodecVideos(
            paths,
            cfg.size,
            clips_per_video=cfg.clips_per_video,
            frames_per_clip=cfg.frames_per_clip,
        )
        for pf in cfg.torchcodec_pfs:
            v[f"torchcodec VideoDecoder + samplers pf={pf}"] = (
                "torchcodec",
                partial(_map_style, tc, cfg, pf, max(1, cfg.batch // cfg.clips_per_video), True),
            )
    v["footnote: PyAV decode-from-start pf=2"] = (
        "from-start",
        lambda: _map_style(start, cfg, 2, cfg.batch, False),
    )
    return v, _check_same_frames(paths, cfg, seek)


def _rows(
    paths: list[str], cfg: Config, gop: int, torchcodec: str | None
) -> tuple[list[dict[str, Any]], bool]:
    variants, same = _variants(paths, cfg, torchcodec)
    expected = len(paths) * cfg.clips_per_video
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with progress(cfg.repeats * len(names), f"video GOP {gop}") as bar:
        for r in range(cfg.repeats):
            for k in range(len(names)):
                name = names[(k + r) % len(names)]  # rotate: no variant always goes first
                bar.label(name)
                t0 = time.perf_counter()
                res = variants[name][1]()
                res["seconds"] = time.perf_counter() - t0
                res["clips_per_s"] = res["samples"] / res["seconds"]
                res["expected_samples"] = expected
                runs[name].append(res)
                bar.step()
    rows = [
        {
            "name": f"GOP {gop}: {n}",
            "kind": variants[n][0],
            "gop": gop,
            "runs": runs[n],
            "clips_per_s": median(runs[n], "clips_per_s"),
        }
        for n in names
    ]
    delivered = expected * cfg.frames_per_clip
    for row in rows:  # decode work: frames decoded per frame delivered
        if row["kind"] in ("streambuf", "streambuf-cuda"):
            last = row["runs"][-1]
            row["decoded_per_delivered"] = last["frames_decoded"] / last["frames_delivered"]
        elif row["kind"] == "seek-per-clip":
            row["decoded_per_delivered"] = seek_per_clip_frames(paths, cfg) / delivered
    return rows, same


def _versions() -> dict[str, Any]:
    av = require("av", purpose="the video benchmark")
    return {
        "av": av.__version__,
        "ffmpeg": {k: ".".join(map(str, v)) for k, v in av.library_versions.items()},
    }


def _measure(mode: str, config: Config | None = None) -> dict[str, Any]:
    cfg = config or {"tiny": TINY, "quick": QUICK, "full": FULL}[mode]
    versions = _versions()
    torchcodec = importable("torchcodec.decoders")
    tmp = Path(tempfile.mkdtemp(prefix="streambuf-video-bench-"))
    rows: list[dict[str, Any]] = []
    same: dict[int, bool] = {}
    overhead = None
    try:
        for gop in cfg.gops:
            paths = make_videos(
                tmp,
                count=cfg.videos,
                distinct=cfg.distinct,
                seconds=cfg.seconds,
                fps=cfg.fps,
                width=cfg.width,
                height=cfg.height,
                keyint=gop,
                prefix=f"gop{gop}-",
            )
            gop_rows, same[gop] = _rows(paths, cfg, gop, torchcodec)
            rows += gop_rows
            if overhead is None and cfg.overhead_videos:
                overhead = decode_overhead(
                    paths[: cfg.overhead_videos],
                    frames_per_clip=cfg.frames_per_clip,
                    size=cfg.size,
                    batch=cfg.batch,
                    workers=cfg.workers,
                    repeats=cfg.repeats,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not all(same.values()):
        raise RuntimeError(f"streambuf and PyAV seek-per-clip decoded different frames: {same}")
    return {
        "versions": versions,
        "config": asdict(cfg),
        "torchcodec": torchcodec or "imported",
        "torchcodec_resize": None if torchcodec else torchcodec_resize_mode(),
        "same_frames": {str(k): v for k, v in same.items()},
        "cuda_decoder": cuda_decoder() or "measured",
        "rows": rows,
        "decode_overhead": overhead,
    }


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    c, tc = report["config"], report["torchcodec"]

    def how(workers: str) -> str:
        return (
            f"random {c['frames_per_clip']}-frame clips, {c['clips_per_video']}/video, "
            f"{workers}, batch {c['batch']}, -> {c['size']}x{c['size']}"
            + ("" if tc == "imported" else "; torchcodec " + tc)
        )

    cpu_workers = f"{c['workers']} workers"
    gpu_workers = (
        f"streambuf in-process, {c['workers'] * c['lanes']} lanes; peers {c['workers']} workers"
    )
    lines = []
    for gop in c["gops"]:
        rows = [r for r in report["rows"] if r["gop"] == gop]
        for kind, label, workers in (
            ("streambuf", "", cpu_workers),
            ("streambuf-cuda", ", decoder='cuda' (NVDEC)", gpu_workers),
        ):
            lines.append(
                versus(
                    rows,
                    "clips_per_s",
                    workload=f"video {c['height']}p, GOP {gop} frames ({gop / c['fps']:.1f} s)"
                    + label,
                    metric="clips/s",
                    how=how(workers),
                    mine=lambda r, kind=kind: r["kind"] == kind,  # type: ignore[misc]
                    peers=lambda r: r["kind"] in ("seek-per-clip", "torchcodec"),
                )
            )
    return [h for h in lines if h is not None]


def _title(report: dict[str, Any]) -> str:
    c = report["config"]
    return (
        f"video ({report['mode']}): random {c['frames_per_clip']}-frame clips, "
        f"{c['clips_per_video']} per {c['seconds']:.0f} s {c['width']}x{c['height']} video -> "
        f"{c['size']}x{c['size']}, {c['workers']} workers, batch {c['batch']}; torchcodec: "
        f"{report['torchcodec']}"
    )


def _table(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = report["rows"]
    sb = {r["gop"]: r["clips_per_s"] for r in rows if r["kind"] == "streambuf"}
    return [(r["name"], r["clips_per_s"], f"{sb[r['gop']] / r['clips_per_s']:.2f}x") for r in rows]


def _overhead(report: dict[str, Any]) -> list[Table]:
    work, seen = [], set()
    for r in report["rows"]:  # (one row per loader kind: every pf decodes the same)
        key = (r["gop"], r["kind"])
        if "decoded_per_delivered" in r and key not in seen:
            seen.add(key)
            work.append((f"GOP {r['gop']}: {r['kind']}", f"{r['decoded_per_delivered']:.2f}"))
    tables = [
        Table(
            "decode work: frames out of the decoder per frame delivered (seek-per-clip: "
            "every frame from the keyframe before a clip to its end)",
            ("loader", "decoded / delivered"),
            work,
        )
    ]
    overhead = report["decode_overhead"]
    if not overhead:
        return tables
    return [
        *tables,
        Table(
            "decode overhead, frames/s (plain PyAV vs streambuf, same frames):",
            ("case", "plain PyAV", "streambuf", "overhead"),
            [
                (o["label"], o["plain_median"], o["streambuf_median"], f"{o['overhead']:+.1%}")
                for o in overhead.values()
            ],
        ),
    ]


BENCHMARK = Benchmark(
    name="video",
    measure=_measure,
    title=_title,
    columns=("loader", "clips/s", "streambuf is"),
    table=_table,
    headline=_headline,
    more=_overhead,
)
run = BENCHMARK.run
