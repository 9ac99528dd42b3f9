"""GPU busy fraction and samples/s of real training steps fed by DataLoader or streambuf.

Two workloads, each under ``DataLoader(prefetch_factor=1, 2, 4, 8, pin_memory=True)``
(batches moved with ``.to("cuda", non_blocking=True)``) and under
``streambuf.Loader(device="cuda")`` (pinned copies on a side stream, a few batches
ahead), at equal CPU worker processes:

(a) **seed ladder**: the mission's workload (3x224x224 float32 samples, 10 ms each,
    batch 32, 4 workers, ``persistent_workers``) feeding a ResNet-18-like net (built in
    code), forward + backward + SGD step under bf16 autocast; streambuf with 8 threads
    per worker;
(b) **video**: random 16-frame clips decoded on CPU workers from H.264 videos made here
    (640x360, 1 s GOP, resized to 112x112) feeding a small 3-D conv net; DataLoader over
    the PyAV seek-per-clip Dataset (the strongest PyAV peer of ``bench video``),
    streambuf ``video.clips`` with 2 lanes per worker.

GPU busy fraction = sum of CUDA-event times around each step / wall time of the loop
after a warm-up (the CPU runs at most 2 steps ahead, as a loop logging its loss does);
samples/s over the same span. Needs a CUDA device and a CUDA build of torch; nothing is
downloaded, no interaction; one run takes under 5 minutes on one H200. ``--allow-cpu``
runs a tiny CPU stand-in instead (for tests: it measures nothing about GPUs).

    streambuf bench gpu [--quick] [--out DIR] [--allow-cpu]
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ._benchmark import Benchmark
from ._gpu_models import resnet18_like, video3d
from ._harness import interleaved, measure_configs, summarise
from ._report import Headline, versus
from ._video_data import make_videos
from ._video_peers import SeekPerClip
from .workloads import MapDataset, SampleMaker, loader_stats

NO_CUDA = (
    "streambuf bench gpu: no CUDA device is usable here (torch {torch}, built with CUDA: "
    "{built}). Run it on a GPU machine with a CUDA build of torch (e.g. pip install "
    "torch==2.13.0), or pass --allow-cpu for the CPU stand-in (it measures nothing about GPUs)."
)


def settings(mode: str, *, cuda: bool) -> dict[str, Any]:
    from ..resources import read_limits

    if mode == "tiny" or not cuda:
        return {
            "seed": {
                "shape": [3, 32, 32],
                "latency_s": 0.001,
                "batch": 8,
                "steps": 6,
                "warmup": 1,
                "workers": 2,
                "threads": 2,
                "width": 4,
            },
            "video": {
                "width": 160,
                "height": 96,
                "seconds": 2.0,
                "size": 32,
                "videos": 2,
                "distinct": 1,
                "clips_per_video": 2,
                "frames": 8,
                "batch": 4,
                "warmup": 1,
                "workers": 2,
                "lanes": 2,
                "model_width": 4,
            },
            "pfs": [2],
            "repeats": 1,
        }
    quick = mode == "quick"
    workers = max(2, min(8, math.floor(read_limits().cpus) - 2))
    return {
        "seed": {
            "shape": [3, 224, 224],
            "latency_s": 0.010,
            "batch": 32,
            "warmup": 10,
            "steps": 50 if quick else 100,
            "workers": 4,
            "threads": 8,
            "width": 64,
        },
        "video": {
            "width": 640,
            "height": 360,
            "seconds": 10.0,
            "size": 112,
            "videos": 32 if quick else 64,
            "distinct": 4,
            # 16 clips a video: 512 / 1024 clips, 64 / 128 steps (at 4 a video, 2026-12-04
            # on the H200, a run timed 28 steps in about a second and one row read 182
            # to 811 samples/s between two runs)
            "clips_per_video": 16,
            "frames": 16,
            "batch": 8,
            "warmup": 8,
            "workers": workers,
            "lanes": 2,
            "model_width": 64,
        },
        "pfs": [2, 8] if quick else [1, 2, 4, 8],
        "repeats": 1 if quick else 2,
    }


def train(
    batches: Any,
    model: torch.nn.Module,
    device: torch.device,
    *,
    warmup: int,
    video: bool,
    clip_batches: bool = False,
) -> dict[str, Any]:
    """Iterate ``batches`` through forward/backward/SGD steps; busy fraction and rates.
    ``video``: (B, T, C, H, W) uint8 clips, fed as (B, C, T, H, W) floats; ``clip_batches``:
    the batches are batched ``Clip`` objects (their ``data``)."""
    cuda = device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    spans: list[Any] = []
    busy_cpu = 0.0
    t_start = time.perf_counter()
    samples = timed_samples = steps = 0
    for i, batch in enumerate(batches):
        x = batch.data if clip_batches else batch
        x = x.to(device, non_blocking=True)  # DataLoader: pinned H2D; streambuf: already there
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            t_start, spans, busy_cpu, timed_samples, steps = time.perf_counter(), [], 0.0, 0, 0
        t0 = time.perf_counter()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        inp = x.permute(0, 2, 1, 3, 4).float().div_(255) if video else x
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(inp).float().logsumexp(dim=1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            end.record()
            spans.append((start, end))
            if len(spans) > 2:
                spans[-3][1].synchronize()  # run at most 2 steps ahead
        else:
            busy_cpu += time.perf_counter() - t0
        samples += int(x.shape[0])
        timed_samples += int(x.shape[0])
        steps += 1
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t_start
    busy = sum(s.elapsed_time(e) for s, e in spans) / 1e3 if cuda else busy_cpu
    return {
        "samples": samples,
        "timed_steps": steps,
        "busy_fraction": busy / wall if wall > 0 else float("nan"),
        "samples_per_s": timed_samples / wall if wall > 0 else float("nan"),
        "wall_s": wall,
    }


def _seed_run(cfg: dict[str, Any]) -> dict[str, Any]:
    s, device = cfg["seed"], torch.device(cfg["device"])
    cuda = device.type == "cuda"
    n = (s["steps"] + s["warmup"]) * s["batch"]
    maker = SampleMaker(shape=tuple(s["shape"]), latency_s=s["latency_s"])
    model = resnet18_like(s["width"]).to(device)
    if cuda:  # on CPU, channels_last backward after a torchdata.nodes run crashed torch 2.13
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if cfg["kind"] == "dataloader":
        dl = DataLoader(
            MapDataset(n, maker),
            batch_size=s["batch"],
            num_workers=s["workers"],
            prefetch_factor=cfg["prefetch_factor"],
            pin_memory=cuda,
            persistent_workers=True,
        )
        res = train(dl, model, device, warmup=s["warmup"], video=False)
        del dl
        return {**res, "expected_samples": n}
    import streambuf as sb

    pipe = sb.Pipeline(range(n)).map(maker, threads=s["threads"]).batch(s["batch"])
    batch_bytes = s["batch"] * maker.nbytes
    with sb.Loader(
        pipe,
        num_workers=s["workers"],
        max_batches=2 * s["workers"],
        max_bytes=math.ceil(4 / 3 * 2 * s["workers"] * batch_bytes),
        device=device if cuda else None,
    ) as loader:
        res = train(loader, model, device, warmup=s["warmup"], video=False)
        return {**res, "expected_samples": n, **loader_stats(loader)}


def _video_run(cfg: dict[str, Any]) -> dict[str, Any]:
    v, device = cfg["video"], torch.device(cfg["device"])
    cuda = device.type == "cuda"
    model = video3d(v["model_width"]).to(device)
    clips = cfg["clips"]
    expected = len(clips)
    if cfg["kind"] == "dataloader":
        dl = DataLoader(
            SeekPerClip([tuple(c) for c in clips], v["size"]),
            batch_size=v["batch"],
            shuffle=True,
            num_workers=v["workers"],
            prefetch_factor=cfg["prefetch_factor"],
            pin_memory=cuda,
        )
        return {
            **train(dl, model, device, warmup=v["warmup"], video=True),
            "expected_samples": expected,
        }
    import streambuf as sb
    import streambuf.video as sv

    pipe = sv.clips(
        cfg["paths"],
        sampler=sv.clips_at_random_indices(
            num_clips=v["clips_per_video"], num_frames_per_clip=v["frames"]
        ),
        width=v["size"],
        height=v["size"],
        seed=0,
        threads=v["lanes"],
    ).batch(v["batch"])
    with sb.Loader(
        pipe,
        num_workers=v["workers"],
        max_batches=2 * v["workers"],
        max_bytes="2GiB",
        device=device if cuda else None,
    ) as loader:
        res = train(loader, model, device, warmup=v["warmup"], video=True, clip_batches=True)
        return {**res, "expected_samples": expected, **loader_stats(loader)}


def _configs(
    part: str, s: dict[str, Any], device: str, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    base = {"part": part, "device": device, "seed": s["seed"], "video": s["video"], **extra}
    pin = " pin_memory" if device == "cuda" else ""
    out = [
        dict(base, kind="dataloader", prefetch_factor=k, name=f"{part}: DataLoader pf={k}{pin}")
        for k in s["pfs"]
    ]
    target = "Loader(device='cuda')" if device == "cuda" else "Loader"
    out.append(dict(base, kind="streambuf", name=f"{part}: streambuf {target}"))
    return out


def _measure(mode: str, allow_cpu: bool = False) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    if not cuda and not allow_cpu:
        raise SystemExit(NO_CUDA.format(torch=torch.__version__, built=torch.version.cuda or "no"))
    device = "cuda" if cuda else "cpu"
    s = settings(mode, cuda=cuda)
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    seed_cfgs = _configs("seed", s, device, {})
    keys = ["busy_fraction", "samples_per_s"]
    rows = measure_configs(seed_cfgs, _seed_run, repeats=s["repeats"], label="gpu seed", keys=keys)
    from .video import FULL, same_clips

    v = s["video"]
    vcfg = replace(
        FULL,
        width=v["width"],
        height=v["height"],
        seconds=v["seconds"],
        size=v["size"],
        clips_per_video=v["clips_per_video"],
        frames_per_clip=v["frames"],
    )
    tmp = Path(tempfile.mkdtemp(prefix="streambuf-gpu-bench-"))
    try:
        paths = make_videos(
            tmp,
            count=v["videos"],
            distinct=v["distinct"],
            seconds=v["seconds"],
            fps=30,
            width=v["width"],
            height=v["height"],
            keyint=30,
            preset="ultrafast",
        )
        clips = [list(c) for c in same_clips(paths, vcfg)]
        video_cfgs = _configs("video", s, device, {"paths": paths, "clips": clips})
        vres = interleaved(video_cfgs, _video_run, repeats=s["repeats"], label="gpu video")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for c in video_cfgs:
        c.pop("clips"), c.pop("paths")  # the JSON keeps the settings, not 100s of clip lists
    rows += summarise(video_cfgs, vres, keys)
    return {"device": device, "settings": s, "rows": rows}


def _busy(sb: dict[str, Any], peer: dict[str, Any]) -> str:
    cfg = sb["config"]
    return (
        f"GPU busy {100 * sb['busy_fraction']:.0f}% vs {100 * peer['busy_fraction']:.0f}%, "
        f"{cfg[cfg['part']]['workers']} workers each"
    )


def _headline(report: dict[str, Any]) -> list[Headline | None]:
    cpu = report["device"] != "cuda"
    return [
        versus(
            [r for r in report["rows"] if r["config"]["part"] == part],
            "samples_per_s",
            workload=label + (" (CPU stand-in)" if cpu else ""),
            metric="samples/s",
            how=_busy,
        )
        for part, label in (
            ("seed", "gpu: seed ladder -> ResNet-18-like"),
            ("video", "gpu: video clips -> 3-D conv net"),
        )
    ]


BENCHMARK = Benchmark(
    name="gpu",
    measure=_measure,
    title=lambda r: (
        f"gpu ({r['mode']}) on "
        f"{r['environment']['gpu'] or 'CPU stand-in (measures nothing about GPUs)'}: busy = "
        "CUDA-event time of the steps / wall time"
    ),
    columns=("run", "busy %", "samples/s"),
    table=lambda r: [(x["name"], 100 * x["busy_fraction"], x["samples_per_s"]) for x in r["rows"]],
    headline=_headline,
)
run = BENCHMARK.run
