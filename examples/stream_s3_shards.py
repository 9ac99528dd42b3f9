"""Stream WebDataset shards from S3 with streambuf: lanes, decode, shuffle, batch, Loader.

With no arguments it starts an S3-compatible server itself (moto, on 127.0.0.1), writes a
few demo shards into a bucket and reads them back, checking that every sample arrives
exactly once. Against your own endpoint (MinIO, Ceph, AWS...), credentials come from the
environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or any source botocore reads):

    python examples/stream_s3_shards.py
    python examples/stream_s3_shards.py --endpoint http://127.0.0.1:9000 --bucket demo
    python examples/stream_s3_shards.py --endpoint https://s3.amazonaws.com --bucket data \\
        --shards "train/shard-{000000..000127}.tar"      # read existing shards, no upload

Needs: pip install "streambuf[remote]" (and moto[server] for the local server).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import tarfile
import time
from typing import Any

import numpy as np

import streambuf as sb
from streambuf.sources import shard_stats

DEMO_SHARDS, DEMO_SAMPLES = 6, 40


def start_moto() -> tuple[Any, str]:
    """An S3-compatible server on 127.0.0.1 (any free port); returns (server, endpoint)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def demo_shard(shard: int) -> bytes:
    """A tar shard in WebDataset layout: key.npy (a float32 vector), key.cls, key.json."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for i in range(DEMO_SAMPLES):
            key = f"s{shard:03d}_{i:05d}"
            vec = io.BytesIO()
            np.save(vec, np.full(256, shard * 1000 + i, dtype=np.float32))
            fields = {
                "npy": vec.getvalue(),
                "cls": str(i % 10).encode(),
                "json": json.dumps({"shard": shard, "index": i}).encode(),
            }
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def upload_demo(bucket: str, storage_options: dict[str, Any]) -> str:
    """Write the demo shards to ``s3://bucket/demo/``; returns their spec."""
    import s3fs

    fs = s3fs.S3FileSystem(**storage_options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for s in range(DEMO_SHARDS):
        fs.pipe(f"{bucket}/demo/shard-{s:06d}.tar", demo_shard(s))
    return f"demo/shard-{{000000..{DEMO_SHARDS - 1:06d}}}.tar"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--endpoint", help="S3 endpoint URL (default: start a local moto server)")
    p.add_argument("--bucket", default="streambuf-demo")
    p.add_argument("--shards", help="shard spec inside the bucket (default: upload demo shards)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lanes", type=int, default=3)
    a = p.parse_args(argv)

    server = None
    if a.endpoint is None:
        server, endpoint = start_moto()
        options: dict[str, Any] = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    else:
        options = {"endpoint_url": a.endpoint}  # credentials: botocore's usual sources
    try:
        spec = a.shards or upload_demo(a.bucket, options)
        pipe = (
            sb.shards(f"s3://{a.bucket}/{spec}", lanes=a.lanes, storage_options=options)
            .decode()  # npy -> ndarray, cls -> int, json -> dict
            .shuffle(64)
            .batch(16)
        )
        loader = sb.Loader(pipe, num_workers=a.workers, max_batches=8, max_bytes="256MiB")
        t0 = time.perf_counter()
        keys: list[str] = []
        for batch in loader:
            keys += batch["__key__"]
        seconds = time.perf_counter() - t0
        totals = shard_stats(pipe)
        print(f"{len(keys)} samples in {seconds:.2f} s from {totals.shards_done} shard reads")
        print(
            f"io: {totals.io.requests} requests, {totals.io.retries} retries, "
            f"{totals.io.bytes / 1e6:.1f} MB; skipped shards: {totals.shards_skipped}"
        )
        budget = loader.stats().budget
        if budget is not None:
            print(f"peak bytes in flight {budget.peak_in_flight_bytes} <= {budget.max_bytes}")
        if a.shards is None:
            want = DEMO_SHARDS * DEMO_SAMPLES
            if len(keys) != want or len(set(keys)) != want:
                print(f"FAILED: expected {want} distinct samples")
                return 1
            print("ok: every sample exactly once")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
