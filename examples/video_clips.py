"""Train a tiny 3-D conv net on video clips decoded by streambuf.

Generates a few short videos (a bright square moving left or right over a textured
background), then trains a classifier of the motion direction from 8-frame clips,
decoded with PyAV in DataLoader workers through ``streambuf.Loader``'s byte budget.
Prints training throughput and the loader's buffer stats.

    python examples/video_clips.py            # 16 videos, 60 steps
    python examples/video_clips.py --small    # a few seconds: 6 tiny videos, 6 steps
"""

from __future__ import annotations

import argparse
import fractions
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import torch
from torch import nn

import streambuf as sb
import streambuf.video as sv


def make_video(path: Path, *, direction: int, size: int, frames: int, seed: int) -> None:
    """H.264 video: a square moving ``direction`` (+1 right, -1 left) over noise."""
    rng = np.random.default_rng(seed)
    background = rng.integers(0, 120, size=(size, size, 3), dtype=np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=12, options={"preset": "ultrafast"})
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            img = background.copy()
            x = (seed * 7 + direction * i * max(size // 16, 1)) % (size - size // 4)
            img[size // 3 : size // 3 + size // 4, x : x + size // 4] = 255
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts, frame.time_base = i, fractions.Fraction(1, 12)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


class Tiny3D(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv3d(3, 8, kernel_size=3, stride=(1, 2, 2), padding=1),
            nn.ReLU(),
            nn.Conv3d(8, 16, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool3d(1),
            nn.Flatten(),
            nn.Linear(16, 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T, H, W) float
        return self.net(x)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--small", action="store_true", help="tiny run for tests")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    n_videos, size, frames, steps = (6, 48, 24, 6) if a.small else (16, 112, 48, 60)
    steps = a.steps or steps
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory(prefix="streambuf-example-") as tmp:
        t0 = time.perf_counter()
        for i in range(n_videos):  # label in the name: left_*.mp4 = 0, right_*.mp4 = 1
            direction = 1 if i % 2 else -1
            name = f"{'right' if direction > 0 else 'left'}_{i:02d}.mp4"
            make_video(Path(tmp) / name, direction=direction, size=size, frames=frames, seed=i)
        print(f"generated {n_videos} videos ({size}x{size}) in {time.perf_counter() - t0:.1f} s")

        pipe = sv.clips(
            f"{tmp}/*.mp4",
            sampler=sv.clips_at_random_indices(num_clips=2, num_frames_per_clip=8),
            layout="CTHW",  # what Conv3d wants: (C, T, H, W), batched to (B, C, T, H, W)
            threads=2,  # videos decoded at once in each worker
        ).batch(4, drop_last=True)
        loader = sb.Loader(pipe, num_workers=a.workers, max_batches=8, max_bytes="64MiB")

        model = Tiny3D()
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        step, clips_seen, t0 = 0, 0, time.perf_counter()
        epoch = 0
        while step < steps:
            loader.set_epoch(epoch)  # new random clips every epoch (seeded)
            for batch in loader:
                x = batch.data.float().div_(255)
                y = torch.tensor([int(Path(s).name.startswith("right")) for s in batch.source])
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                clips_seen += len(y)
                if step % max(steps // 6, 1) == 0 or step == steps:
                    rate = clips_seen / (time.perf_counter() - t0)
                    print(
                        f"epoch {epoch} step {step:3d}  loss {loss.item():.3f}  {rate:6.1f} clips/s"
                    )
                if step == steps:
                    break
            epoch += 1

        st = loader.stats()
        print(
            f"done: {st.batches} batches, {st.bytes / 2**20:.1f} MiB, "
            f"{st.batches_per_s:.1f} batches/s, waited for data {st.wait_fraction:.0%} of the time"
        )
        if st.budget is not None:
            b = st.budget
            print(
                f"buffer: peak in flight {b.peak_in_flight_bytes / 2**20:.1f} MiB of "
                f"{b.max_bytes / 2**20:.0f} MiB for batches (Loader max_bytes 64 MiB, a "
                f"quarter of it for decode lanes), workers waited {b.worker_wait_s:.2f} s"
            )


if __name__ == "__main__":
    main()
