"""Before and after: rows of a ``streambuf bench`` module under two git revisions,
interleaved in one run.

On a noisy machine two benchmark runs minutes apart differ by more than most changes
(the 2-core VM: one fixed row of ``bench mixed`` ran 19-26 batches/s in one hour), so a
change is measured against its base side by side: each round runs every row under the
base revision and under the new one (and the ``--ref`` rows, under the new one: a peer
or a fixed count that both are read against), in rotated order, each run in a fresh
process importing the revision's own checkout (a ``git worktree``, removed at the end).
The rows are the module's own configs (taken from the new revision), picked by name.

    python benchmarks/ab_revisions.py --base 14842c6 --bench mixed \\
        --rows "streambuf 4x auto threads" --ref "streambuf 4x4 threads"
    python benchmarks/ab_revisions.py --base HEAD~3 --bench latency \\
        --rows "seed: streambuf 4x auto threads" --ref "seed: torchdata.nodes 32 threads"
    python benchmarks/ab_revisions.py --base HEAD --bench mixed --tiny   # a smoke run
    python benchmarks/ab_revisions.py --base HEAD --patch docs/results/start8/start8.patch \
        --bench mixed --rows "streambuf 4x auto threads"   # an uncommitted variant

``--patch FILE`` applies a ``git diff`` to the new revision's worktree (``git apply``;
one that does not apply stops the run before anything is measured): a variant that was
tried and not kept stays measurable from its patch in ``docs/results/``.

Prints each row's runs under both revisions, the median per-round ratio new/base and,
with ``--ref``, each against the reference row of the same round.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from streambuf.bench._harness import run_config

ROOT = Path(__file__).resolve().parents[1]


def _configs(bench: str, mode: str) -> list[dict[str, Any]]:
    mod = importlib.import_module(f"streambuf.bench.{bench}")
    if bench == "mixed":  # its configs take the calibrated spin count
        from streambuf.bench.workloads import calibrate_spin

        return list(mod.configs(mode, calibrate_spin(mod.CPU_S)))
    return list(mod.configs(mode))


def _worktree(rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_").replace("~", "-").replace("^", "-")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev],
        check=True,
        capture_output=True,
    )
    return path


def _apply(patch: Path, tree: Path) -> None:
    """``git apply`` ``patch`` in ``tree``, or stop naming the patch and git's reason."""
    got = subprocess.run(
        ["git", "-C", str(tree), "apply", str(patch)], capture_output=True, text=True
    )
    if got.returncode:
        why = (got.stderr or got.stdout).strip()
        raise SystemExit(f"--patch {patch} does not apply to the new revision: {why}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--base", required=True, help="the revision before the change")
    parser.add_argument("--new", default="HEAD", help="the revision after it (HEAD)")
    parser.add_argument("--patch", help="a git diff applied to the new revision's worktree")
    parser.add_argument("--bench", default="mixed", help="a streambuf.bench module")
    parser.add_argument("--rows", nargs="+", help="row names (default: the last one)")
    parser.add_argument("--ref", nargs="*", default=[], help="rows run under --new only")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--key", default="batches_per_s")
    parser.add_argument("--tiny", action="store_true", help="the tiny mode's rows, one round")
    parser.add_argument("--timeout-s", type=float, default=600)
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else "full"
    rounds = 1 if args.tiny else args.rounds
    with tempfile.TemporaryDirectory(prefix="streambuf-ab-") as tmp:
        trees: dict[str, Path] = {}
        try:
            for tag, rev in (("base", args.base), ("new", args.new)):
                trees[tag] = _worktree(rev, Path(tmp) / tag)
            if args.patch:
                _apply(Path(args.patch).resolve(), trees["new"])
            by_name = {c["name"]: c for c in _configs(args.bench, mode)}
            names = args.rows or [list(by_name)[-1]]
            missing = [n for n in [*names, *args.ref] if n not in by_name]
            if missing:
                raise SystemExit(f"no such row in bench {args.bench} ({mode}): {missing}")
            jobs = [(n, t) for n in names for t in ("base", "new")] + [(n, "new") for n in args.ref]
            got: dict[tuple[str, str], list[float]] = {job: [] for job in jobs}
            for r in range(rounds):
                for k in range(len(jobs)):
                    name, tag = jobs[(k + r) % len(jobs)]
                    res = run_config(by_name[name], root=str(trees[tag]), timeout_s=args.timeout_s)
                    got[(name, tag)].append(float(res[args.key]))
                    print(f"round {r}: {name} [{tag}] {res[args.key]:.2f}", flush=True)
        finally:
            for path in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                    capture_output=True,
                )
    new_name = args.new + (f" + {args.patch}" if args.patch else "")
    out: dict[str, Any] = {"base": args.base, "new": new_name, "key": args.key, "rows": {}}
    print(f"\n{args.key}: base {args.base}, new {new_name}; medians, runs, per-round ratios")
    for name in names:
        base, new = got[(name, "base")], got[(name, "new")]
        row = {
            "base": base,
            "new": new,
            "new_over_base": statistics.median(a / b for a, b in zip(new, base)),
        }
        line = f"{name}: base {statistics.median(base):.2f} {[round(x, 1) for x in base]}, "
        line += f"new {statistics.median(new):.2f} {[round(x, 1) for x in new]}; "
        line += f"new/base {row['new_over_base']:.2f}"
        for ref in args.ref:
            refs = got[(ref, "new")]
            for tag, runs in (("base", base), ("new", new)):
                row[f"{tag}_over_{ref}"] = statistics.median(a / b for a, b in zip(runs, refs))
            line += (
                f"; x {ref} ({statistics.median(refs):.2f}): base "
                f"{row[f'base_over_{ref}']:.2f}, new {row[f'new_over_{ref}']:.2f}"
            )
        out["rows"][name] = row
        print(line)
    return out


if __name__ == "__main__":
    main()
