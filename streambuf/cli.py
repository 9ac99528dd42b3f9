"""Command line: ``streambuf bench NAME [--quick] [--out DIR]`` and ``streambuf tune PIPE``.

The benchmarks ship with the package (``streambuf.bench``): ``streambuf bench latency
--quick`` works after a plain install, from any folder. Their peers and plots are
optional: ``pip install 'streambuf[bench]'``. ``streambuf bench NAME --help`` says what
each one measures and how.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _bench(args: argparse.Namespace) -> int:
    from .bench import load

    options = {"quick": args.quick, "out": args.out}
    if args.name == "gpu":
        options["allow_cpu"] = args.allow_cpu
    try:
        report = load(args.name).run(**options)
    except ImportError as exc:  # an optional peer is missing: say which extra to install
        print(f"streambuf bench {args.name}: {exc}", file=sys.stderr)
        return 2
    return 1 if report.get("errors") else 0


def _workers(text: str) -> int | str:
    """``--num-workers``: an int, or "auto"."""
    return text if text == "auto" else int(text)


def _tune(args: argparse.Namespace) -> int:
    from .tune import NothingToTune, check_options, load_pipeline, tune

    try:
        check_options(
            num_workers=args.num_workers,
            seconds=args.seconds,
            batches=args.batches,
            memory_fraction=args.memory_fraction,
        )
    except (TypeError, ValueError) as exc:
        print(f"streambuf tune: {exc}", file=sys.stderr)
        return 2
    try:
        tune(
            load_pipeline(args.pipeline),
            num_workers=args.num_workers,
            batches=args.batches,
            seconds=args.seconds,
            memory_fraction=args.memory_fraction,
        )
    except NothingToTune as exc:
        print(f"streambuf tune: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench import BENCHMARKS, describe

    b = sub.add_parser(
        "bench",
        help="run a benchmark against its strongest peers; print a table, write JSON",
        description="Benchmarks that compare streambuf with the strongest peer a user "
        "would pick, in the same run. Peers and plots: pip install 'streambuf[bench]'.",
    )
    names = b.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, summary in BENCHMARKS.items():
        p = names.add_parser(
            name,
            help=summary,
            description=describe(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--quick", action="store_true", help="smaller sizes, finishes fast")
        p.add_argument("--out", default="bench-results", help="folder for JSON and plots")
        if name == "gpu":
            p.add_argument(
                "--allow-cpu",
                action="store_true",
                help="without CUDA, run a tiny CPU stand-in instead of failing (for tests; "
                "it measures nothing about GPUs)",
            )
        p.set_defaults(func=_bench)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``streambuf`` command."""
    parser = argparse.ArgumentParser(prog="streambuf")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub)
    t = sub.add_parser("tune", help="measure a pipeline at several depths; recommend settings")
    t.add_argument("pipeline", help="MODULE:NAME or FILE.py:NAME (a Pipeline or a function)")
    t.add_argument(
        "--num-workers",
        type=_workers,
        default="auto",
        help="worker processes (default: auto, the count Loader takes by default)",
    )
    t.add_argument("--batches", type=int, default=30, help="batches per trial, at least")
    t.add_argument(
        "--seconds", type=float, default=3.0, help="seconds per trial, at least (default 3)"
    )
    t.add_argument("--memory-fraction", type=float, default=0.25)
    t.set_defaults(func=_tune)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
