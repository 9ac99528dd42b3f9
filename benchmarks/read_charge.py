"""What charging the shard lanes' read buffers to ``max_bytes`` costs and saves over S3.

A worker's lanes hold read buffers: each lane's read block (x2), what it holds of its
next shard (``readahead_bytes``) and, over fsspec, what one grown request brought (up to
``max_request_bytes``, 8 blocks by default). A ``Loader`` charges them to ``max_bytes``
and cuts them where they would pass half of it (docs/design.md, "Budget"): fewer
bytes held, more (smaller) requests. This script reads shards from an S3-compatible
server (moto on loopback) with ``lanes`` 3 and ``"auto"`` (8) at several ``max_bytes``,
each run in a fresh process, and prints samples/s, the charge the Loader made (and the
reads as set) and the rise of the machine's used memory (``AnonPages + Shmem``; the moto
server's own allocations are in it too) over the run.

    python benchmarks/read_charge.py                         # ~2 min on 2 cores
    python benchmarks/read_charge.py --checkout /tmp/old     # another checkout's code
    python benchmarks/read_charge.py --tiny                  # seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def one(urls: list[str], options: dict[str, Any], lanes: Any, max_bytes: int) -> dict[str, Any]:
    """One run: a Loader of 2 workers over ``urls`` (in this process's streambuf)."""
    import time

    import streambuf as sb
    from streambuf.bench import memwatch
    from streambuf.bench._shards import to_tensor

    pipe = (
        sb.shards(urls, lanes=lanes, shuffle_shards=False, storage_options=options)
        .decode({"bin": to_tensor})
        .batch(16)
    )
    as_set = pipe._src.read_bytes(2) if hasattr(pipe._src, "read_bytes") else None
    with memwatch.MemoryWatch() as watch:
        with sb.Loader(
            pipe, num_workers=2, max_batches=8, max_bytes=max_bytes, timeout_s=120
        ) as loader:
            t0 = time.perf_counter()
            n = sum(len(b["__key__"]) for b in loader)
            seconds = time.perf_counter() - t0
            charge = getattr(loader, "read_bytes", None)
    peak = watch.result()
    return {
        "lanes": lanes,
        "max_bytes_mib": max_bytes / MIB,
        "samples": n,
        "samples_per_s": n / seconds,
        "charge_mib_a_worker": None if charge is None else charge / MIB,
        "reads_as_set_mib_a_worker": None if as_set is None else as_set / MIB,
        "memory_rise_mib": peak.rise / MIB,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", default=str(ROOT), help="the streambuf checkout to run")
    ap.add_argument("--budgets", type=int, nargs="+", default=[64, 256, 512], help="MiB")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child run's arguments (JSON)
    a = ap.parse_args(argv)
    if a.one:
        sys.path.insert(0, a.checkout)
        args = json.loads(a.one)
        print(json.dumps(one(**args)))
        return []
    rows: list[dict[str, Any]] = []
    from streambuf.bench._servers import loopback_only, serve
    from streambuf.bench._shards import make_shards, upload

    shards, per, size = (4, 8, 16 << 10) if a.tiny else (24, 64, 64 << 10)
    budgets = [16] if a.tiny else a.budgets
    with loopback_only(), tempfile.TemporaryDirectory(prefix="streambuf-rc-") as tmp:
        make_shards(Path(tmp), shards=shards, per_shard=per, sample_bytes=size)
        with serve("moto") as endpoint:
            options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
            urls = upload(Path(tmp), "streambuf-read-charge", options)
            print(f"{shards} shards x {per} x {size >> 10} KiB over moto, 2 workers, batch 16")
            print(f"checkout: {a.checkout}")
            for r in range(a.rounds):
                for mb in budgets:
                    for lanes in (3, "auto"):
                        args = dict(urls=urls, options=options, lanes=lanes, max_bytes=mb * MIB)
                        out = subprocess.run(
                            [
                                sys.executable,
                                __file__,
                                "--checkout",
                                a.checkout,
                                "--one",
                                json.dumps(args),
                            ],
                            capture_output=True,
                            text=True,
                            timeout=600,
                            cwd=a.checkout,
                        )
                        if out.returncode:
                            print(out.stderr[-2000:])
                            raise SystemExit(out.returncode)
                        row = {"round": r, **json.loads(out.stdout.strip().splitlines()[-1])}
                        print(json.dumps(row))
                        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
