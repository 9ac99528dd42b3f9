"""Do chunks and runs pay? The two per-sample remedies of issue 25 measured on the real
mechanisms: the lanes' chunked hand-off (built) and the ledger (runs: not built).

* **Hand-off in chunks**: local tar shards parsed by ``iter_tar_records`` on lane threads
  of the one ``LaneRunner`` into a round-robin ``Window`` (the path of ``shards()`` on
  threads), each lane handing over one sample at a time or chunks of up to ``C``
  (``LaneRunner(chunk=C)``: one reservation, ``commit_many`` and ``get_many`` per run of
  samples, each counted at its size); beside them, the same readers driven in the
  consumer's thread (the inline path).
* **Positions as runs**: the ``Ledger``'s bookkeeping per sample (a ``Rec``, its entry
  issued under the lock, settled by a batch of 32), the most a run-length ledger could
  save.

Interleaved, best of 3, one process; a profiling tool behind the "Per-sample cost"
section of docs/design.md (not one of the ``streambuf bench`` comparisons). Run it on a
quiet machine:

    python -m streambuf.bench._chunk_probe [--shards 24] [--per-shard 64] [--lanes 1 3]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._lanes import LaneRunner
from .._ledger import Ledger, Rec
from ..sizing import nbytes
from ..sources.tar import iter_tar_records
from ..window import Window
from ._shards import make_shards

CHUNKS = (1, 4, 16, 64)


def _records(urls: list[str]) -> Iterator[Any]:
    for url in urls:
        with open(url, "rb") as f:
            for _, _, _, sample in iter_tar_records(f, url=url):
                yield sample


def _threaded(urls: list[str], lanes: int, chunk: int) -> Callable[[], int]:
    """Shard ``i`` on lane ``i % lanes``, handed over in chunks of up to ``chunk`` samples
    (``LaneRunner(chunk=)``, as ``shards()`` lanes do; 1: one by one)."""
    mine = [urls[t::lanes] for t in range(lanes)]

    def run() -> int:
        window: Window[Any] = Window(
            lanes=lanes, max_items=max(64, lanes), max_bytes=256 << 20, order="round_robin"
        )
        works: list[Callable[[], Iterator[Any]]] = [functools.partial(_records, u) for u in mine]
        n = 0
        for _ in LaneRunner(works, window=window, name="probe", sizeof=nbytes, chunk=chunk):
            n += 1
        return n

    return run


def _inline(urls: list[str], lanes: int) -> Callable[[], int]:
    """The same lanes' readers driven round robin in the consumer's thread."""
    mine = [urls[t::lanes] for t in range(lanes)]

    def run() -> int:
        gens = [_records(u) for u in mine]
        n = 0
        while gens:
            for g in list(gens):
                try:
                    next(g)
                except StopIteration:
                    gens.remove(g)
                    continue
                n += 1
        return n

    return run


def ledger_us(samples: int = 100_000, batch: int = 32) -> float:
    """Microseconds per sample of a ``Rec`` issued in the ``Ledger`` and settled by a
    batch (what one ledger entry per run instead of per sample could save, at most)."""
    ledger = Ledger()
    t0 = time.perf_counter()
    members: list[Rec] = []
    for i in range(samples):
        with ledger.lock:
            rec = Rec(i, (0, i), i)
            ledger.issued(i, (0, i), [i, i + 1])
        members.append(rec)
        if len(members) == batch:
            ledger.settle_all(Rec(None, (), -1, members=members))
            members = []
    if len(ledger) > batch:
        raise AssertionError("the ledger kept settled samples")
    return (time.perf_counter() - t0) / samples * 1e6


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=24)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 3])
    args = ap.parse_args(argv)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="streambuf-chunk-probe-") as tmp:
        make_shards(Path(tmp), shards=args.shards, per_shard=args.per_shard, sample_bytes=64 << 10)
        urls = sorted(str(p) for p in Path(tmp).glob("*.tar"))
        n = args.shards * args.per_shard
        rows: dict[str, Callable[[], int]] = {}
        for lanes in args.lanes:
            rows[f"inline, {lanes} lane(s)"] = _inline(urls, lanes)
            for chunk in CHUNKS:
                rows[f"threads, {lanes} lane(s), chunk {chunk}"] = _threaded(urls, lanes, chunk)
        for _ in range(3):
            for name, run in rows.items():
                t0 = time.perf_counter()
                got = run()
                rate = got / (time.perf_counter() - t0)
                if got != n:
                    raise AssertionError(f"{name} read {got} of {n} samples")
                out[name] = max(out.get(name, 0.0), rate)
    print("| tar samples of 64 KiB, one process | samples/s, best of 3 |\n|---|---|")
    for name, rate in out.items():
        print(f"| {name} | {rate:,.0f} |")
    out["ledger us/sample"] = min(ledger_us() for _ in range(3))
    print(f"\nledger: a Rec issued and settled in batches of 32: {out['ledger us/sample']:.2f} us")
    return out


if __name__ == "__main__":
    main()
