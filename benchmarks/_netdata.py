"""Data, server and baselines of ``benchmarks.network_shards`` (module level: picklable).

* ``make_dataset``: tar shards of one ``bin`` field per sample (fixed size, so batches
  stack) and the per-sample index ``(shard name, data offset, size)`` read from the tar
  headers, for the map-style baseline.
* ``Server``: ``tests.sources.httpserver.FaultyServer`` in a child process (so its Python
  threads do not share a GIL with the loaders measured), adding ``latency_s`` to every
  request and pacing every connection to ``bandwidth_bps`` (an object store's
  per-stream throughput).
* ``RangeDataset``: the map-style baseline, one HTTP ``Range`` GET per sample on a
  persistent connection per worker.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tarfile
import urllib.parse
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[1]

Index = list[tuple[str, int, int]]


def make_dataset(root: Path, *, shards: int, per_shard: int, sample_bytes: int) -> Index:
    """Write ``shards`` tar files of ``per_shard`` samples; return the sample index."""
    import io

    root.mkdir(parents=True, exist_ok=True)
    index: Index = []
    for s in range(shards):
        name = f"shard-{s:06d}.tar"
        with tarfile.open(root / name, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                data = bytes([(s + i) % 256]) * sample_bytes
                info = tarfile.TarInfo(f"s{s:04d}_{i:06d}.bin")
                info.size, info.mtime = len(data), 1_700_000_000
                tf.addfile(info, io.BytesIO(data))
        with tarfile.open(root / name) as tf:
            index += [(name, m.offset_data, m.size) for m in tf.getmembers()]
    return index


class Server:
    """A FaultyServer in a child process; ``with Server(root, ...) as srv: srv.base_url``."""

    def __init__(self, root: Path, *, latency_s: float, bandwidth_bps: float) -> None:
        self.root, self.latency_s, self.bandwidth_bps = root, latency_s, bandwidth_bps
        self.base_url = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Server:
        cfg = json.dumps([str(self.root), self.latency_s, self.bandwidth_bps])
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._netdata", cfg],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert self._proc.stdout is not None
        self.base_url = self._proc.stdout.readline().strip()
        if not self.base_url.startswith("http://"):
            raise RuntimeError(f"benchmark HTTP server did not start: {self.base_url!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the child exits when its stdin closes
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)


def _serve(cfg: str) -> None:
    from tests.sources.httpserver import FaultyServer

    root, latency_s, bandwidth_bps = json.loads(cfg)
    with FaultyServer(Path(root)) as srv:
        srv.latency_s = latency_s
        srv.bandwidth_bps = bandwidth_bps
        print(srv.base_url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin


def to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def wds_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """webdataset sample -> the same fields streambuf's pipeline yields."""
    return {"__key__": sample["__key__"], "bin": to_tensor(sample["bin"])}


class RangeDataset(Dataset[dict[str, Any]]):
    """Map-style: sample ``i`` is one ``Range: bytes=offset-end`` GET of its tar member."""

    def __init__(self, base_url: str, index: Index, *, timeout_s: float = 30) -> None:
        self.base_url, self.index, self.timeout_s = base_url, index, timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_conn": None}

    def _get(self, path: str, start: int, size: int) -> bytes:
        if self._conn is None:
            u = urllib.parse.urlsplit(self.base_url)
            self._conn = http.client.HTTPConnection(u.hostname, u.port, timeout=self.timeout_s)
        headers = {"Range": f"bytes={start}-{start + size - 1}"}
        self._conn.request("GET", "/" + path, headers=headers)
        resp = self._conn.getresponse()
        data = resp.read()
        if resp.status != 206 or len(data) != size:
            raise OSError(f"GET {path} {start}+{size}: HTTP {resp.status}, {len(data)} bytes")
        return data

    def __getitem__(self, i: int) -> dict[str, Any]:
        name, start, size = self.index[i]
        try:
            data = self._get(name, start, size)
        except (OSError, http.client.HTTPException):
            if self._conn is not None:
                self._conn.close()
            self._conn = None  # one reconnect, then give up
            data = self._get(name, start, size)
        return {"__key__": f"{name}:{i}", "bin": to_tensor(data)}


if __name__ == "__main__":
    _serve(sys.argv[1])
