"""Where the time goes reading local tar shards in one process: ``streambuf.shards`` against
``webdataset.WebDataset`` on the network benchmark's shards (WebDataset layout, one 64 KiB
``bin`` field per sample), no DataLoader, no batching.

Prints samples/s of each reader over the same files (interleaved, best of 3): shards()
as it runs by default (inline, ``adaptive``) and on its lane threads, webdataset, and the
two tar parsers alone; then a cProfile of the lane-thread read sorted by own time, the
lane threads included (each thread
profiled on its own, the statistics summed). A profiling tool behind the ``network
local disk`` headline row (not one of the ``streambuf bench`` comparisons); run it on a
quiet machine:

    python -m streambuf.bench._tar_profile [--shards 24] [--per-shard 32]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streambuf as sb

from ._shards import make_shards, to_tensor, wds_sample


def _streambuf(urls: list[str], lanes: int, adaptive: bool = True) -> Callable[[], int]:
    pipe = sb.shards(urls, lanes=lanes, shuffle_shards=False, adaptive=adaptive)
    pipe = pipe.decode({"bin": to_tensor})
    return lambda: sum(1 for _ in pipe)


def _parser(urls: list[str]) -> Callable[[], int]:
    """The tar parser alone: records of each file, as the lanes read them."""
    from streambuf.io import open_stream
    from streambuf.sources.tar import iter_tar_records

    def run() -> int:
        n = 0
        for url in urls:
            with open_stream(url) as f:
                n += sum(1 for _ in iter_tar_records(f, url=url))
        return n

    return run


def _wds_parser(urls: list[str]) -> Callable[[], int] | None:
    """webdataset's parser alone: ``tar_file_iterator`` grouped by ``group_by_keys``."""
    try:
        import webdataset.tariterators as tar
    except ImportError:
        return None

    def run() -> int:
        n = 0
        for url in urls:
            with open(url, "rb") as f:
                members = (dict(m, __url__=url) for m in tar.tar_file_iterator(f))
                n += sum(1 for _ in tar.group_by_keys(members))
        return n

    return run


def _webdataset(urls: list[str]) -> Callable[[], int] | None:
    try:
        import webdataset as wds
    except ImportError:
        return None
    ds = wds.WebDataset(urls, shardshuffle=False).map(wds_sample)
    return lambda: sum(1 for _ in ds)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=24)
    ap.add_argument("--per-shard", type=int, default=32)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="streambuf-tar-profile-") as tmp:
        make_shards(Path(tmp), shards=args.shards, per_shard=args.per_shard, sample_bytes=64 << 10)
        urls = sorted(str(p) for p in Path(tmp).glob("*.tar"))
        n = args.shards * args.per_shard
        readers: dict[str, Callable[[], int] | None] = {
            "streambuf shards(lanes=3) (adaptive: inline)": _streambuf(urls, 3),
            "streambuf shards(lanes=1, adaptive=False)": _streambuf(urls, 1, False),
            "streambuf shards(lanes=3, adaptive=False)": _streambuf(urls, 3, False),
            "webdataset": _webdataset(urls),
            "parser alone: streambuf iter_tar_records": _parser(urls),
            "parser alone: webdataset tar_file_iterator + group_by_keys": _wds_parser(urls),
        }
        best: dict[str, float] = {}
        for _ in range(3):
            for name, run in readers.items():
                if run is None:
                    continue
                t0 = time.perf_counter()
                got = run()
                rate = got / (time.perf_counter() - t0)
                assert got == n, f"{name} read {got} of {n} samples"
                best[name] = max(best.get(name, 0.0), rate)
        print("| reader (one process, local files) | samples/s, best of 3 |\n|---|---|")
        for name, rate in best.items():
            print(f"| {name} | {rate:,.0f} |")
        run1 = readers["streambuf shards(lanes=1, adaptive=False)"]
        assert run1 is not None
        profiles = [cProfile.Profile()]

        def start(*_: Any) -> None:  # first event in a new thread: profile it too
            sys.setprofile(None)
            profiles.append(cProfile.Profile())
            profiles[-1].enable()

        threading.setprofile(start)
        profiles[0].enable()
        try:
            run1()
        finally:
            profiles[0].disable()
            threading.setprofile(None)
    print("\ncProfile, streambuf shards(lanes=1, adaptive=False), every thread, by own time:")
    stats: Any = pstats.Stats(*profiles)
    stats.sort_stats("tottime").print_stats(12)
    return best


if __name__ == "__main__":
    main()
