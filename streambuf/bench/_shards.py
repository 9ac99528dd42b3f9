"""Data and baselines of the network benchmark (module level, so workers can pickle them).

* ``make_shards``: tar shards (WebDataset layout) of one ``bin`` field per sample (fixed
  size, so batches stack), and the per-sample index ``(shard name, data offset, size)``
  read from the tar headers, for the map-style baseline.
* ``RangeDataset``: the map-style baseline, one HTTP ``Range`` GET per sample on a
  persistent connection per worker.
* ``wds_sample`` / ``wds_s3_handler``: what the webdataset peer needs: the same fields
  streambuf yields, and an ``s3://`` opener through fsspec/s3fs (webdataset's own is a
  ``pipe:`` to the AWS CLI, which may be absent; a gopen handler is its documented hook).
"""

from __future__ import annotations

import http.client
import io
import tarfile
import urllib.parse
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = [
    "Index",
    "RangeDataset",
    "WdsS3Handler",
    "make_shards",
    "to_tensor",
    "upload",
    "wds_sample",
]

Index = list[tuple[str, int, int]]


def make_shards(root: Path, *, shards: int, per_shard: int, sample_bytes: int) -> Index:
    """Write ``shards`` tar files of ``per_shard`` samples under ``root``; the sample index."""
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


def upload(root: Path, bucket: str, storage_options: dict[str, Any]) -> list[str]:
    """Copy the shards under ``root`` to ``s3://bucket/``; their URLs, sorted."""
    import s3fs

    fs = s3fs.S3FileSystem(**storage_options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    urls = []
    for path in sorted(root.glob("shard-*.tar")):
        fs.put_file(str(path), f"{bucket}/{path.name}")
        urls.append(f"s3://{bucket}/{path.name}")
    return urls


def to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def wds_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """webdataset sample -> the same fields streambuf's pipeline yields."""
    return {"__key__": sample["__key__"], "bin": to_tensor(sample["bin"])}


class WdsS3Handler:
    """A webdataset gopen handler for ``s3://`` through fsspec (picklable: set per worker)."""

    def __init__(self, storage_options: dict[str, Any]) -> None:
        self.storage_options = storage_options

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        import fsspec

        return fsspec.open(url, mode, **self.storage_options).open()

    def install(self, _worker_id: int = 0) -> None:
        """Register this handler (in this process; pass as ``worker_init_fn`` for workers)."""
        import importlib

        # the module, not the function ``webdataset.gopen`` that shadows it
        importlib.import_module("webdataset.gopen").gopen_schemes["s3"] = self


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
            host = u.hostname or "127.0.0.1"
            self._conn = http.client.HTTPConnection(host, u.port, timeout=self.timeout_s)
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
