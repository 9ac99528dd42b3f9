"""Command line: ``streambuf bench NAME [--quick] [--out DIR]`` and ``streambuf tune PIPE``.

Benchmarks live in the source checkout's ``benchmarks/`` folder (they need test data
generators and comparison baselines that are not part of the library), so ``bench`` is
run from the repository root.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main"]

BENCHMARKS = {
    "buffer": "benchmarks.buffer_overhead",
    "gpu": "benchmarks.gpu",
    "bursty": "benchmarks.bursty",
    "latency": "benchmarks.latency",
    "memory": "benchmarks.memory",
    "network": "benchmarks.network_shards",
    "stall": "benchmarks.stall",
    "video": "benchmarks.video_clips",
}


def _bench(args: argparse.Namespace) -> int:
    modname = BENCHMARKS[args.name]
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("benchmarks"):
            print(
                f"streambuf bench {args.name}: cannot import {modname}; run it from the "
                "root of a streambuf source checkout (the benchmarks/ folder)",
                file=sys.stderr,
            )
            return 2
        raise
    mod.run(quick=args.quick, out=args.out)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from .tune import load_pipeline, tune

    tune(
        load_pipeline(args.pipeline),
        num_workers=args.num_workers,
        batches=args.batches,
        memory_fraction=args.memory_fraction,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``streambuf`` command."""
    parser = argparse.ArgumentParser(prog="streambuf")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="run a benchmark, print a table, write JSON")
    b.add_argument("name", choices=sorted(BENCHMARKS))
    b.add_argument("--quick", action="store_true", help="small sizes, finishes fast")
    b.add_argument("--out", default="bench-results", help="folder for JSON and plots")
    b.set_defaults(func=_bench)
    t = sub.add_parser("tune", help="measure a pipeline at several depths; recommend settings")
    t.add_argument("pipeline", help="MODULE:NAME or FILE.py:NAME (a Pipeline or a function)")
    t.add_argument("--num-workers", type=int, default=2)
    t.add_argument("--batches", type=int, default=30, help="batches per trial")
    t.add_argument("--memory-fraction", type=float, default=0.25)
    t.set_defaults(func=_tune)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
