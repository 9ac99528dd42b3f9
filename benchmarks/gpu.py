"""The GPU run: streambuf's Loader and DevicePrefetcher feeding a real model on CUDA,
against the DataLoader ``prefetch_factor`` ladder with ``pin_memory``, measured as GPU
utilisation and steps per second (``streambuf bench gpu``).

    python benchmarks/gpu.py --quick           # on a machine with a CUDA GPU
    python benchmarks/gpu.py --allow-cpu --tiny  # the CPU stand-in (a smoke run)

Install the CUDA build of torch first (``make TORCH_SPEC='torch==2.13.0' setup``: the
default pin is the CPU wheel).
"""

from __future__ import annotations

import argparse

from streambuf.bench import gpu


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--tiny", action="store_true", help="a smoke run (figures meaningless)")
    parser.add_argument("--allow-cpu", action="store_true", help="run the CPU stand-in")
    parser.add_argument("--out", default="bench-results", help="folder for JSON and plots")
    args = parser.parse_args(argv)
    return gpu.run(quick=args.quick, tiny=args.tiny, out=args.out, allow_cpu=args.allow_cpu)


if __name__ == "__main__":
    main()
