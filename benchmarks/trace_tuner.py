"""What ``threads="auto"`` decided, worker by worker: one row of ``streambuf bench
mixed`` (or ``latency``) run once, with every check's measurements written down.

A run's throughput says how ``"auto"`` did, not why. This runs one row in this process
(its Loader workers are forked, so they inherit the recording) and prints, per worker,
each change of count with the rates the check measured at each count, the noise it
measured (``ThreadTuner.noise``), whether the CPUs were busy and the most threads kept
so far. Worker 0 leads (``streambuf._tuner.Lead``): the others follow its count and
record nothing of their own while it runs. The traces quoted in docs/design.md ("Noise",
"Inline is count 0") were made this way.

    python benchmarks/trace_tuner.py                          # the mixed row, 4 workers
    python benchmarks/trace_tuner.py --row "cpu-bound: streambuf 4x auto threads"
    python benchmarks/trace_tuner.py --bench latency --row "seed: streambuf 4x auto threads"
    python benchmarks/trace_tuner.py --tiny --batches 40      # seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import importlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streambuf.bench.workloads import calibrate_spin, run_loader


def _configs(bench: str, mode: str) -> dict[str, dict[str, Any]]:
    mod = importlib.import_module(f"streambuf.bench.{bench}")
    if bench == "mixed":  # its configs take the calibrated spin count
        got = mod.configs(mode, calibrate_spin(mod.CPU_S))
    else:
        got = mod.configs(mode)
    return {c["name"]: c for c in got}


def _record(where: Path) -> Callable[[], None]:
    """Patch ``ThreadTuner`` so that each change and each decision is appended to a
    file per process under ``where`` (workers forked after this inherit it); returns
    what undoes the patch (call it before ``where`` goes: a later run in this process,
    a test's, must not write there)."""
    tuner_mod = importlib.import_module("streambuf._tuner")
    cls = tuner_mod.ThreadTuner
    t0 = time.perf_counter()

    def log(text: str) -> None:
        with open(where / f"{os.getpid()}.log", "a") as f:
            print(f"{time.perf_counter() - t0:7.2f} s  {text}", file=f)

    def rates(t: Any) -> str:
        return ", ".join(f"{c}: {r:.0f}" for c, r in sorted(t._rates.items()))

    set_count, choose = cls._set, cls._choose

    def _set(self: Any, count: int) -> int:
        step = "the check's choice" if getattr(self, "_choosing", False) else self._dir
        log(f"{self.count} -> {count}  ({step}; items/s {rates(self)})")
        return set_count(self, count)

    def _choose(self: Any) -> int | None:
        self._choosing = True
        try:
            got = choose(self)
        finally:
            self._choosing = False
        log(
            f"kept {self.count} (the check began at {self._from}): items/s {rates(self)}, "
            f"noise {self.noise:.2f}, calls on a core {self.on_core:.2f}, waiting for one "
            f"{self.waited:.2f}, CPUs {self.cores:.2f}, contended {self.contended}, "
            f"most kept {self._high}"
        )
        return got

    cls._set, cls._choose = _set, _choose  # type: ignore[method-assign]

    def undo() -> None:
        cls._set, cls._choose = set_count, choose  # type: ignore[method-assign]

    return undo


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--bench", default="mixed", choices=("mixed", "latency"))
    parser.add_argument("--row", default=None, help="a row name (default: the auto row)")
    parser.add_argument("--tiny", action="store_true", help="the tiny mode's rows")
    parser.add_argument("--batches", type=int, default=None, help="in place of the row's")
    args = parser.parse_args(argv)
    configs = _configs(args.bench, "tiny" if args.tiny else "full")
    name = args.row or next(n for n, c in configs.items() if c.get("threads") == "auto")
    if name not in configs:
        raise SystemExit(f"no such row {name!r}; rows: {sorted(configs)}")
    with tempfile.TemporaryDirectory(prefix="streambuf-trace-") as tmp:
        where = Path(tmp)
        undo = _record(where)
        try:
            cfg = configs[name]
            report = run_loader(cfg if args.batches is None else dict(cfg, batches=args.batches))
        finally:
            undo()
        traces = {p.stem: p.read_text().splitlines() for p in sorted(where.glob("*.log"))}
    print(f"{name}: {report['batches_per_s']:.1f} batches/s")
    print(f"threads over the workers (s, count): {report.get('threads_over_time')}")
    for pid, lines in traces.items():
        print(f"\nprocess {pid}: {len(lines)} lines")
        for line in lines:
            print("  " + line)
    return {"row": name, "report": report, "traces": traces}


if __name__ == "__main__":
    main()
