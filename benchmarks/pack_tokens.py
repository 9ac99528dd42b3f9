"""Packed sequences per second: streambuf against the loop a user writes.

Data made here: tar shards (WebDataset layout) of tokenized documents (``.npy`` uint16
arrays, 50-4000 tokens), and the same tokens as flat ``uint16`` files. Four readers, each
delivering batches of 8 blocks of 2,048 tokens (int64) through 2 worker processes:

* **tar shards, streambuf**: ``shards().decode().pack(2048).batch(8)`` + ``Loader``;
* **tar shards, a plain packing loop**: an ``IterableDataset`` that splits the shards
  over workers, reads each tar with ``tarfile``, ``np.load``s each document and packs
  with a Python list buffer (what a user writes first) + ``DataLoader(batch_size=8)``;
* **flat files, streambuf**: ``token_files(seq_len=2048).batch(8)`` + ``Loader``;
* **flat files, memmap Dataset**: a map-style ``Dataset`` slicing a ``numpy.memmap``
  (nanoGPT's reader) + ``DataLoader(shuffle=True, batch_size=8)``;
* **flat files, LitData**: the same tokens ``litdata.optimize``d into LitData's chunks
  (before the clock starts), read by ``StreamingDataset(item_loader=TokensLoader(2048),
  shuffle=True)`` + ``StreamingDataLoader``; only where ``litdata`` imports. Its pip
  dependencies pull a CUDA torch: install it beside the CPU wheel with ``pip install
  --no-deps litdata lightning-utilities``. It delivers the stored ``uint16`` tokens
  (the others deliver ``int64``: 4x the bytes through the workers), so it is compared
  with ``token_files(keep_dtype=True)``, which delivers them too.

Each reader runs ``--repeats`` times (3), interleaved with the others and the order
rotated each round; the median is quoted (this machine's run-to-run spread is wide).
Rate from the first batch to the last; ``x peer`` is against the plain reader of the
same data and dtype (the packing loop; the memmap Dataset; LitData).

    python benchmarks/pack_tokens.py            # ~1 minute on 2 cores
    python benchmarks/pack_tokens.py --tiny     # a few seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import streambuf as sb

SEQ = 2048
BATCH = 8
WORKERS = 2


def make_data(root: Path, shards: int, docs: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    tars, flats = [], []
    for s in range(shards):
        tar_path, flat_path = root / f"docs-{s:04d}.tar", root / f"tokens-{s:04d}.bin"
        every = []
        with tarfile.open(tar_path, "w") as tar:
            for d in range(docs):
                tokens = rng.integers(1, 50_000, size=int(rng.integers(50, 4000)), dtype=np.uint16)
                every.append(tokens)
                buf = io.BytesIO()
                np.save(buf, tokens)
                info = tarfile.TarInfo(f"d{s:04d}{d:05d}.npy")
                info.size = buf.tell()
                buf.seek(0)
                tar.addfile(info, buf)
        np.concatenate(every).tofile(flat_path)
        tars.append(str(tar_path))
        flats.append(str(flat_path))
    return tars, flats


class PlainPacking(IterableDataset[dict[str, torch.Tensor]]):
    """The packing loop a user writes: shards split over workers, a list as buffer."""

    def __init__(self, tars: list[str]) -> None:
        self.tars = tars

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        buf: list[int] = []
        for path in self.tars[k::n]:
            with tarfile.open(path) as tar:
                for member in tar:
                    f = tar.extractfile(member)
                    assert f is not None
                    buf.extend(np.load(io.BytesIO(f.read())).tolist())
                    while len(buf) >= SEQ:
                        block, buf = buf[:SEQ], buf[SEQ:]
                        yield {"tokens": torch.tensor(block, dtype=torch.int64)}


class MemmapBlocks(Dataset[dict[str, torch.Tensor]]):
    """nanoGPT's reader: blocks sliced from memory-mapped flat files."""

    def __init__(self, flats: list[str]) -> None:
        self.flats = flats
        self.index = [
            (f, b) for f, p in enumerate(flats) for b in range(Path(p).stat().st_size // 2 // SEQ)
        ]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        f, b = self.index[i]
        mm = np.memmap(self.flats[f], dtype=np.uint16, mode="r")
        return {"tokens": torch.from_numpy(mm[b * SEQ : (b + 1) * SEQ].astype(np.int64))}


def _litdata_tokens(path: str) -> Iterator[torch.Tensor]:
    """One flat file as one item of LitData's token chunks (litdata.optimize's fn)."""
    yield torch.from_numpy(np.fromfile(path, dtype=np.uint16))


def litdata_loader(flats: list[str], root: Path) -> Any:
    """LitData's TokensLoader over the same tokens (None where litdata does not import)."""
    try:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
    except ImportError:
        return None
    out = root / "litdata"
    method = multiprocessing.get_start_method()  # (optimize sets spawn for the process)
    optimize(
        fn=_litdata_tokens,
        inputs=flats,
        output_dir=str(out),
        chunk_size=(SEQ + 1) * 1024,
        item_loader=TokensLoader(),
        num_workers=1,
    )
    multiprocessing.set_start_method(method, force=True)  # the other rows as without it
    ds = StreamingDataset(str(out), item_loader=TokensLoader(block_size=SEQ), shuffle=True)
    return lambda: StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


def rate(loader: Any) -> tuple[float, int]:
    """Blocks per second from the first batch to the last, and the blocks delivered."""
    it = iter(loader)
    first = next(it)
    t0, n = time.perf_counter(), 0
    for batch in it:
        n += len(_tokens(batch))
    assert _tokens(first).shape[1:] == (SEQ,)
    return n / max(time.perf_counter() - t0, 1e-9), n + len(_tokens(first))


def _tokens(batch: Any) -> torch.Tensor:
    return batch["tokens"] if isinstance(batch, dict) else batch  # (LitData: the tensor)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a few seconds: a smoke run")
    p.add_argument("--repeats", type=int, default=3, help="runs of each reader (median)")
    args = p.parse_args(argv)
    shards, docs = (4, 20) if args.tiny else (16, 400)
    if args.tiny:
        args.repeats = 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tars, flats = make_data(Path(tmp), shards, docs)
        kw = {"num_workers": WORKERS, "max_batches": 8, "max_bytes": "256MiB"}
        plain_tar = "tar shards: plain packing loop + DataLoader"
        memmap = "flat files: memmap Dataset + DataLoader"
        lit_name = "flat files (uint16 out): LitData TokensLoader + StreamingDataLoader"
        # reader -> (make the loader, the peer it is compared with)
        runs: dict[str, tuple[Any, str]] = {
            "tar shards: streambuf pack": (
                lambda: sb.Loader(
                    sb.shards(tars, seed=0).decode().pack(SEQ, key="npy").batch(BATCH), **kw
                ),
                plain_tar,
            ),
            plain_tar: (
                lambda: DataLoader(PlainPacking(tars), batch_size=BATCH, num_workers=WORKERS),
                plain_tar,
            ),
            "flat files: streambuf token_files": (
                lambda: sb.Loader(sb.token_files(flats, seq_len=SEQ, seed=0).batch(BATCH), **kw),
                memmap,
            ),
            memmap: (
                lambda: DataLoader(
                    MemmapBlocks(flats), batch_size=BATCH, shuffle=True, num_workers=WORKERS
                ),
                memmap,
            ),
        }
        lit = litdata_loader(flats, Path(tmp))
        if lit is not None:
            runs["flat files (uint16 out): streambuf token_files(keep_dtype=True)"] = (
                lambda: sb.Loader(
                    sb.token_files(flats, seq_len=SEQ, seed=0, keep_dtype=True).batch(BATCH),
                    **kw,
                ),
                lit_name,
            )
            runs[lit_name] = (lit, lit_name)
        got: dict[str, list[tuple[float, int]]] = {name: [] for name in runs}
        names = list(runs)
        for rep in range(args.repeats):  # interleaved, the order rotated each round
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                got[name].append(rate(runs[name][0]()))
        for name, results in got.items():
            rates = sorted(r for r, _ in results)
            rows.append(
                {
                    "reader": name,
                    "blocks_per_s": rates[len(rates) // 2],
                    "blocks": results[0][1],
                    "runs": rates,
                }
            )
    print(
        f"packed blocks of {SEQ} tokens, batches of {BATCH}, {WORKERS} workers; median of "
        f"{args.repeats} interleaved runs"
    )
    print("| reader | blocks/s | blocks | x peer |")
    print("|---|---|---|---|")
    by_name = {r["reader"]: r["blocks_per_s"] for r in rows}
    for r in rows:
        base = by_name[runs[r["reader"]][1]]  # the peer on the same data and dtype
        print(
            f"| {r['reader']} | {r['blocks_per_s']:.0f} | {r['blocks']} | {r['blocks_per_s'] / base:.2f} |"
        )
    if lit is None:
        print("LitData: not installed (pip install --no-deps litdata lightning-utilities)")
    return rows


if __name__ == "__main__":
    main()
