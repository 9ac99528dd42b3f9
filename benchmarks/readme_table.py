"""Reproduce the README's benchmark tables on this machine: every shipped benchmark
(``streambuf bench all``), each against its strongest peer in the same run, on data it
makes itself; prints the headline table and writes JSON (every raw figure and the
machine) and plots under ``--out``.

    python benchmarks/readme_table.py --quick    # several minutes per benchmark
    python benchmarks/readme_table.py            # the README's settings (longer)
    python benchmarks/readme_table.py --only latency network

Peers and plots need ``pip install 'streambuf[bench]'`` (``make setup`` installs them).
"""

from __future__ import annotations

import argparse

from streambuf.bench import all as bench_all


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller runs")
    parser.add_argument("--tiny", action="store_true", help="a smoke run (figures meaningless)")
    parser.add_argument("--out", default="bench-results", help="folder for JSON and plots")
    parser.add_argument("--only", nargs="*", default=None, help="benchmark names to run")
    args = parser.parse_args(argv)
    names = tuple(args.only) if args.only else bench_all.ORDER
    unknown = sorted(set(names) - set(bench_all.ORDER))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; choose from {list(bench_all.ORDER)}")
    return bench_all.run(quick=args.quick, tiny=args.tiny, out=args.out, names=names)


if __name__ == "__main__":
    main()
