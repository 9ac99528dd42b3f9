"""GPU busy fraction: a real train step fed by DataLoader(prefetch_factor=k) or streambuf.

The train step is real GPU work: a small conv net, forward and backward, on batches of
uint8 images (3 x 160 x 160, 64 per batch, ~4.7 MiB) that take ``latency_s`` each to
"load" (sleep: I/O or decode). GPU busy fraction = the sum of CUDA-event times around
each step / wall time of the loop (after a warm-up). DataLoader runs with pin_memory and
``.to(device, non_blocking=True)``; streambuf with ``Loader(device="cuda")`` (pinned
copies on a side stream, a few batches ahead). Same workers for both; interleaved
repeats, medians. Finishes in under 5 minutes on a GPU machine.

Without CUDA it runs on the CPU (``--allow-cpu``; used by the smoke test) and reports
the share of wall time spent in the step instead.

    python -m benchmarks.gpu [--quick] [--out DIR] [--allow-cpu]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import streambuf as sb
from benchmarks._harness import environment, interleaved, median, print_table, write_json
from benchmarks._workloads import SampleMaker


class ImageMaker(SampleMaker):
    """A uint8 image after ``latency_s`` (the same for both loaders)."""

    def __call__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        if self.latency_s:
            time.sleep(self.latency_s)
        side = int((self.sample_bytes // 3) ** 0.5)
        return torch.full((3, side, side), i % 251, dtype=torch.uint8)


class Images(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, n: int, maker: ImageMaker) -> None:
        self.n, self.maker = n, maker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.maker(i)


def make_model(device: torch.device, width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    ).to(device)


def one_run(cfg: dict[str, Any]) -> dict[str, Any]:
    device = torch.device(cfg["device"])
    maker = ImageMaker(sample_bytes=cfg["sample_bytes"], latency_s=cfg["latency_s"])
    n = cfg["steps"] * cfg["batch_size"]
    cuda = device.type == "cuda"
    if cfg["kind"] == "dataloader":
        dl = DataLoader(
            Images(n, maker),
            batch_size=cfg["batch_size"],
            num_workers=cfg["workers"],
            prefetch_factor=cfg["prefetch_factor"],
            pin_memory=cuda,
        )
        batches: Any = (b.to(device, non_blocking=True) for b in dl)
    else:
        pipe = sb.Pipeline(range(n)).map(maker, threads=cfg["threads"]).batch(cfg["batch_size"])
        batches = sb.Loader(
            pipe,
            num_workers=cfg["workers"],
            max_batches=cfg["max_batches"],
            max_bytes=cfg["max_bytes"],
            device=device if cuda else None,
        )
    model = make_model(device, cfg["width"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    busy, t_start, steps = 0.0, None, 0
    for i, x in enumerate(batches):
        if i == cfg["warmup"]:
            if cuda:
                torch.cuda.synchronize()
            t_start, busy, steps = time.perf_counter(), 0.0, 0
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        loss = model(x.float().div_(255)).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            end.record()
            end.synchronize()
            busy += start.elapsed_time(end) / 1e3
        else:
            busy += time.perf_counter() - t0
        steps += 1
    wall = time.perf_counter() - (t_start or time.perf_counter())
    return {"busy_fraction": busy / wall if wall > 0 else float("nan"), "steps_per_s": steps / wall}


def configs(*, quick: bool, tiny: bool, device: str) -> list[dict[str, Any]]:
    cuda = device == "cuda"
    base = {
        "device": device,
        "sample_bytes": (3 * 32 * 32) if tiny else 3 * 160 * 160,
        "latency_s": 0.002 if tiny else 0.005,
        "batch_size": 8 if tiny else 64,
        "steps": 8 if tiny else (60 if quick else 150),
        "warmup": 2 if tiny else 10,
        "workers": 2 if (tiny or not cuda) else 8,
        "width": 8 if tiny else 64,
    }
    pfs = [2] if tiny else [1, 2, 4, 8]
    out = [dict(base, kind="dataloader", prefetch_factor=k, name=f"DataLoader pf={k}") for k in pfs]
    out.append(
        dict(
            base,
            kind="streambuf",
            threads=16,
            max_batches=4 * base["workers"],
            max_bytes="1GiB",
            name="streambuf device prefetch",
        )
    )
    return out


def run(
    *, quick: bool = False, out: str | None = None, tiny: bool = False, allow_cpu: bool = False
) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    if not cuda and not allow_cpu:
        raise SystemExit("no CUDA device here; pass --allow-cpu to run the CPU stand-in")
    device = "cuda" if cuda else "cpu"
    cfgs = configs(quick=quick, tiny=tiny, device=device)
    repeats = 1 if (quick or tiny) else 2
    results = interleaved(cfgs, one_run, repeats=repeats, label="gpu")
    rows = [
        {
            "name": cfg["name"],
            "config": cfg,
            "runs": runs,
            "busy_fraction": median(runs, "busy_fraction"),
            "steps_per_s": median(runs, "steps_per_s"),
        }
        for cfg, runs in zip(cfgs, results)
    ]
    env = environment()
    if cuda:
        env["gpu"] = torch.cuda.get_device_name(0)
    print(f"\ngpu busy fraction on {env.get('gpu', 'CPU (stand-in)')}")
    text = print_table(
        ["run", "busy %", "steps/s"],
        [(r["name"], 100 * r["busy_fraction"], r["steps_per_s"]) for r in rows],
    )
    report = {"benchmark": "gpu", "environment": env, "device": device, "rows": rows, "table": text}
    write_json(out, "gpu", report)
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench-results")
    p.add_argument("--allow-cpu", action="store_true")
    a = p.parse_args(argv)
    run(quick=a.quick, out=a.out, allow_cpu=a.allow_cpu)


if __name__ == "__main__":
    main()
