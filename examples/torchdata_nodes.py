"""streambuf's byte bounds inside a torchdata.nodes graph, checkpointed and resumed.

    python examples/torchdata_nodes.py

The graph: a sampler over 512 "images" -> streambuf ParallelMapper (16 threads read
them; what is being read or waiting counts against 32 MiB) -> torchdata Batcher and
Mapper(collate) -> streambuf Prefetcher (4 batches, 16 MiB) -> torchdata Loader. Part
way through the epoch the loader's state goes to a JSON file; a fresh graph loads it and
finishes the epoch: every sample exactly once, in the same order as without the stop.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
import torchdata.nodes as tn
from torch.utils.data import DistributedSampler, default_collate

import streambuf as sb

N, BATCH, STOP = 512, 16, 11


def read(i: int) -> dict[str, torch.Tensor | int]:
    time.sleep(0.005)  # a remote read or a decode that releases the GIL
    return {"index": i, "pixels": torch.full((3, 128, 128), i % 256, dtype=torch.uint8)}


def build() -> tuple[tn.Loader, sb.nodes.ParallelMapper, sb.nodes.Prefetcher]:
    # a deterministic shuffle (per epoch), so a resumed sampler replays the same order
    sampler = DistributedSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=0)
    read_node = sb.nodes.ParallelMapper(
        tn.SamplerWrapper(sampler), read, threads=16, max_bytes="32MiB"
    )
    batches = tn.Mapper(tn.Batcher(read_node, batch_size=BATCH), default_collate)
    ahead = sb.nodes.Prefetcher(batches, max_items=4, max_bytes="16MiB")
    return tn.Loader(ahead), read_node, ahead


def main() -> None:
    reference = [b["index"].tolist() for b in build()[0]]

    loader, _, _ = build()
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(STOP)]
    path = Path(tempfile.mkdtemp()) / "loader_state.json"
    path.write_text(json.dumps(loader.state_dict()))  # a checkpoint, as plain JSON
    del it, loader

    loader, read_node, ahead = build()  # a fresh graph, e.g. after a restart
    loader.load_state_dict(json.loads(path.read_text()))
    rest = [b["index"].tolist() for b in loader]
    assert head + rest == reference, "the resumed epoch differs"
    samples = sorted(i for b in head + rest for i in b)
    assert samples == list(range(N)), "lost or repeated samples"
    mib = 1 << 20
    r, p = read_node.stats(), ahead.stats()
    print(
        f"resumed after {STOP} of {len(reference)} batches from {path.stat().st_size} bytes "
        f"of JSON: {len(samples)} samples, each once, in order; peak held "
        f"{r.peak_bytes / mib:.1f}/{r.max_bytes / mib:.0f} MiB (ParallelMapper), "
        f"{p.peak_bytes / mib:.1f}/{p.max_bytes / mib:.0f} MiB (Prefetcher)"
    )


if __name__ == "__main__":
    main()
