"""Video clips: streambuf's decoding pipeline against plain PyAV and a map-style Dataset.

Two comparisons, in one run, on videos it generates (H.264, 10 s, 25 fps, a keyframe
every second, 2 B-frames; output 224x224 RGB; everywhere one FFmpeg thread per decoder
and the same conversion: one reused swscale context per video, on one thread):

(a) **Decode overhead**: the same frames (every frame, cut into 16-frame TCHW clips)
    decoded by a plain PyAV loop and by ``streambuf.video.clips`` on the same cores:
    in one process pinned to one core (pipeline iterated in-process, 1 lane thread), and
    with 2 processes on all cores (plain loops in ``DataLoader(num_workers=2)`` workers vs
    ``Loader(num_workers=2)``: both move the batches to the main process; a pool of plain
    loops that moves nothing is recorded beside them, for the cost of the transfer).
(b) **Random 16-frame clips** (2 per video): ``clips()`` + ``Loader`` against a map-style
    Dataset whose ``__getitem__`` opens the file and decodes from the start up to the clip,
    under ``DataLoader(prefetch_factor=1, 2, 4, 8)``, same workers, same batch size, the
    very same clips (the Dataset gets the frame indices streambuf's sampler draws).

Repeats are interleaved (every variant once per round, the order rotated) and medians
quoted: these machines are shared and noisy. Writes ``video_clips.json``.

    python -m benchmarks.video_clips [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import streambuf as sb
import streambuf.video as sv
from benchmarks._video_baselines import PlainWindows, ReopenEachItem, plain_decode_windows
from benchmarks._video_data import make_videos


@dataclass(frozen=True)
class Config:
    width: int = 640
    height: int = 360
    fps: int = 25
    seconds: float = 10.0
    keyint: int = 25
    size: int = 224  # output width = height
    distinct: int = 4  # videos encoded; the others are copies
    decode_videos: int = 16  # (a)
    clip_videos: int = 32  # (b)
    clips_per_video: int = 2
    frames_per_clip: int = 16
    batch: int = 4
    workers: int = 2
    repeats: int = 3
    prefetch_factors: tuple[int, ...] = (1, 2, 4, 8)


FULL = Config()
QUICK = replace(FULL, decode_videos=4, clip_videos=8, repeats=2, distinct=2)
TINY = replace(  # the smoke test: proves it runs, measures nothing
    FULL,
    width=160,
    height=96,
    seconds=2.0,
    size=32,
    distinct=1,
    decode_videos=2,
    clip_videos=2,
    repeats=1,
    prefetch_factors=(1, 2),
)


def _timed(fn: Callable[[], int]) -> float:
    """Units per second of ``fn()`` (which returns how many units it delivered)."""
    t0 = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t0)


def _interleaved(variants: dict[str, Callable[[], int]], repeats: int) -> dict[str, list[float]]:
    names = list(variants)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for k in range(len(names)):
            name = names[(k + r) % len(names)]  # rotate: no variant always goes first
            rates[name].append(_timed(variants[name]))
    return rates


# -- (a) decode overhead -----------------------------------------------------------------
def _pipeline_frames(paths: list[str], cfg: Config) -> int:
    pipe = sv.clips(
        paths,
        sampler=sv.every_frame_windows(cfg.frames_per_clip),
        width=cfg.size,
        height=cfg.size,
        shuffle_videos=False,
        threads=1,  # one core: one decoding thread, as the plain loop
    )
    return sum(int(c.data.shape[0]) for c in pipe)


def _loader_frames(paths: list[str], cfg: Config) -> int:
    pipe = sv.clips(
        paths,
        sampler=sv.every_frame_windows(cfg.frames_per_clip),
        width=cfg.size,
        height=cfg.size,
        shuffle_videos=False,
    ).batch(cfg.batch)
    loader = sb.Loader(pipe, num_workers=cfg.workers, max_batches=8, max_bytes="512MiB")
    return sum(int(b.data.shape[0] * b.data.shape[1]) for b in loader)


def _pool_frames(paths: list[str], cfg: Config) -> int:
    parts = [paths[w :: cfg.workers] for w in range(cfg.workers)]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(cfg.workers) as pool:
        counts = pool.starmap(
            plain_decode_windows, [(p, cfg.frames_per_clip, cfg.size) for p in parts]
        )
    return sum(counts)


def _plain_loader_frames(paths: list[str], cfg: Config) -> int:
    """Plain PyAV loops in DataLoader workers, clips batched to the main process: the
    same work as ``Loader`` (decode, convert, move the batches) without streambuf."""
    from torch.utils.data import DataLoader

    dl = DataLoader(
        PlainWindows(paths, cfg.frames_per_clip, cfg.size),
        batch_size=cfg.batch,
        num_workers=cfg.workers,
    )
    return sum(int(b.shape[0] * b.shape[1]) for b in dl)


def decode_overhead(paths: list[str], cfg: Config) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no hidden intra-op threads on either side
    cpus = sorted(os.sched_getaffinity(0))
    try:
        os.sched_setaffinity(0, {cpus[-1]})  # this thread; threads made now inherit it
        try:
            one = _interleaved(
                {
                    "plain": lambda: plain_decode_windows(paths, cfg.frames_per_clip, cfg.size),
                    "streambuf": lambda: _pipeline_frames(paths, cfg),
                },
                cfg.repeats,
            )
        finally:
            os.sched_setaffinity(0, cpus)
        multi = _interleaved(
            {
                "plain": lambda: _plain_loader_frames(paths, cfg),
                "streambuf": lambda: _loader_frames(paths, cfg),
                "pool": lambda: _pool_frames(paths, cfg),
            },
            cfg.repeats,
        )
    finally:
        torch.set_num_threads(threads)
    out = {}
    for key, rates, label in (
        ("one_core", one, "1 core: plain loop vs clips() in-process"),
        ("all_cores", multi, f"{len(cpus)} cores: DataLoader of plain loops vs Loader"),
    ):
        p, s = statistics.median(rates["plain"]), statistics.median(rates["streambuf"])
        out[key] = {
            "label": label,
            "plain_frames_per_s": rates["plain"],
            "streambuf_frames_per_s": rates["streambuf"],
            "plain_median": p,
            "streambuf_median": s,
            "overhead": p / s - 1.0,  # extra time per frame, relative to the plain loop
        }
        if "pool" in rates:  # plain loops that move nothing to the main process
            out[key]["pool_no_transfer_median"] = statistics.median(rates["pool"])
    return out


# -- (b) random clips ----------------------------------------------------------------------
def _sampler(cfg: Config) -> Any:
    return sv.clips_at_random_indices(
        num_clips=cfg.clips_per_video, num_frames_per_clip=cfg.frames_per_clip
    )


def _same_clips(paths: list[str], cfg: Config) -> list[tuple[str, list[int]]]:
    """The clips streambuf draws with seed 0, epoch 0 (video i: generator (0, 0, i))."""
    sampler, items = _sampler(cfg), []
    for i, p in enumerate(paths):
        for idx in sampler.sample(sv.probe(p), sv.sampler_rng(0, 0, i)):
            items.append((p, idx))
    return items


def _streambuf_clips(paths: list[str], cfg: Config) -> int:
    pipe = sv.clips(paths, sampler=_sampler(cfg), width=cfg.size, height=cfg.size, seed=0)
    loader = sb.Loader(
        pipe.batch(cfg.batch), num_workers=cfg.workers, max_batches=8, max_bytes="512MiB"
    )
    return sum(int(b.data.shape[0]) for b in loader)


def _dataloader_clips(ds: ReopenEachItem, cfg: Config, pf: int) -> int:
    dl = DataLoader(
        ds,
        batch_size=cfg.batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=cfg.workers,
        prefetch_factor=pf,
    )
    return sum(int(b.shape[0]) for b in dl)


def _check_same_frames(paths: list[str], cfg: Config, ds: ReopenEachItem) -> bool:
    first = sorted(
        sv.decode_clips(paths[0], sampler=_sampler(cfg), width=cfg.size, height=cfg.size),
        key=lambda c: int(c.clip_index),
    )
    return all(torch.equal(first[k].data, ds[k]) for k in range(cfg.clips_per_video))


def random_clips(paths: list[str], cfg: Config) -> dict[str, Any]:
    ds = ReopenEachItem(_same_clips(paths, cfg), cfg.size)
    variants: dict[str, Callable[[], int]] = {"streambuf": lambda: _streambuf_clips(paths, cfg)}
    for pf in cfg.prefetch_factors:
        variants[f"DataLoader pf={pf}"] = lambda pf=pf: _dataloader_clips(ds, cfg, pf)
    rates = _interleaved(variants, cfg.repeats)
    medians = {k: statistics.median(v) for k, v in rates.items()}
    best = max((k for k in medians if k != "streambuf"), key=medians.__getitem__)
    return {
        "clips": len(ds),
        "same_frames": _check_same_frames(paths, cfg, ds),
        "clips_per_s": rates,
        "medians": medians,
        "best_dataloader": best,
        "speedup_vs_best": medians["streambuf"] / medians[best],
    }


# -- report --------------------------------------------------------------------------------
def _versions() -> dict[str, Any]:
    import av

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "av": av.__version__,
        "ffmpeg": {k: ".".join(map(str, v)) for k, v in av.library_versions.items()},
        "streambuf": sb.__version__,
    }


def _print(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(
        f"\n(a) decode throughput, frames/s ({cfg['width']}x{cfg['height']} -> "
        f"{cfg['size']}x{cfg['size']}, median of {cfg['repeats']}, interleaved)"
    )
    print(f"{'case':<44}{'plain PyAV':>12}{'streambuf':>12}{'overhead':>10}")
    for r in report["decode"].values():
        print(
            f"{r['label']:<44}{r['plain_median']:>12.0f}{r['streambuf_median']:>12.0f}"
            f"{r['overhead']:>+10.1%}"
        )
    b = report["random_clips"]
    print(
        f"\n(b) random {cfg['frames_per_clip']}-frame clips ({cfg['clips_per_video']} per "
        f"{cfg['seconds']:.0f} s video, {b['clips']} clips), clips/s, {cfg['workers']} workers, "
        f"batch {cfg['batch']} (same frames: {b['same_frames']})"
    )
    print(f"{'loader':<34}{'clips/s':>10}{'streambuf is':>14}")
    for name, med in b["medians"].items():
        ratio = b["medians"]["streambuf"] / med
        note = "" if name == "streambuf" else f"{ratio:.2f}x"
        print(f"{name:<34}{med:>10.1f}{note:>14}")
    print(f"speedup vs best DataLoader ({b['best_dataloader']}): {b['speedup_vs_best']:.2f}x")


def run(
    *, quick: bool = False, out: str | None = None, config: Config | None = None
) -> dict[str, Any]:
    """Run both comparisons; print the table; write ``video_clips.json`` under ``out``."""
    cfg = config or (QUICK if quick else FULL)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="streambuf-video-bench-"))
    try:
        count = max(cfg.decode_videos, cfg.clip_videos)
        paths = make_videos(
            tmp,
            count=count,
            distinct=cfg.distinct,
            seconds=cfg.seconds,
            fps=cfg.fps,
            width=cfg.width,
            height=cfg.height,
            keyint=cfg.keyint,
        )
        made_s = time.perf_counter() - t0
        report: dict[str, Any] = {
            "benchmark": "video_clips",
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "versions": _versions(),
            "config": asdict(cfg),
            "generate_s": made_s,
            "decode": decode_overhead(paths[: cfg.decode_videos], cfg),
            "random_clips": random_clips(paths[: cfg.clip_videos], cfg),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["total_s"] = time.perf_counter() - t0
    _print(report)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "video_clips.json"
        path.write_text(json.dumps(report, indent=2))
        print(f"wrote {path} ({report['total_s']:.0f} s)")
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results")
    a = p.parse_args(argv)
    run(quick=a.quick, out=a.out)


if __name__ == "__main__":
    main()
