"""Checkpoint and resume, as a DDP job would, on tar shards it makes itself.

Two ranks (simulated with ``rank=``/``world_size=``; under torchrun leave them out and
they come from ``torch.distributed``) each train for a while and save their Loader's
state to ``ckpt/data-rank<r>.json``. The job is then "preempted" and restarted with
THREE ranks: each loads the list of all saved states and finishes the epoch. Every
sample of the epoch is seen exactly once, across both runs.

    python examples/checkpoint_resume.py
"""

from __future__ import annotations

import collections
import glob
import io
import json
import os
import tarfile
import tempfile

import streambuf as sb


def make_shards(folder: str, shards: int = 6, per_shard: int = 16) -> str:
    for s in range(shards):
        with tarfile.open(os.path.join(folder, f"train-{s:04d}.tar"), "w") as tf:
            for i in range(per_shard):
                data = f"{s}-{i}".encode()
                info = tarfile.TarInfo(f"{s:04d}_{i:04d}.txt")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return os.path.join(folder, "train-{0000.." + f"{shards - 1:04d}" + "}.tar")


def loader_for(spec: str, rank: int, world: int) -> sb.Loader:
    pipe = (
        sb.shards(spec, lanes=2, samples_per_shard=16, rank=rank, world_size=world)
        .decode()
        .shuffle(8)
        .batch(4, collate=list)
    )
    return sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="64MiB")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = make_shards(tmp)
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        seen: list[str] = []
        for rank in range(2):  # the first run: 2 ranks, preempted after 5 steps
            loader = loader_for(spec, rank, 2)
            for step, batch in enumerate(loader):
                seen += [s["txt"] for s in batch]
                if step == 4:
                    with open(os.path.join(ckpt, f"data-rank{rank}.json"), "w") as f:
                        json.dump(loader.state_dict(), f)
                    break
            loader.close()
        first = len(seen)
        saved = sorted(glob.glob(os.path.join(ckpt, "data-rank*.json")))
        states = [json.load(open(p)) for p in saved]
        for rank in range(3):  # the restart: 3 ranks share what is left
            loader = loader_for(spec, rank, 3)
            loader.load_state_dict(states)
            seen += [s["txt"] for batch in loader for s in batch]
        counts = collections.Counter(seen)
        assert len(counts) == 6 * 16 and set(counts.values()) == {1}, counts
        print(
            f"{first} samples before the preemption (2 ranks), {len(seen) - first} after "
            f"(3 ranks): all {len(counts)} exactly once; state size "
            f"{max(os.path.getsize(p) for p in saved)} bytes"
        )


if __name__ == "__main__":
    main()
