"""Output every benchmark shares: checks on what each run delivered, Markdown tables,
JSON, PNG plots and the headline rows (streambuf against the strongest peer).

A headline row compares streambuf's figure with the *strongest* peer measured in the
same run (the best DataLoader ``prefetch_factor``, ``torchdata.nodes``, webdataset,
PyAV seek-per-clip, torchcodec ... whichever did best), and states its ratio as "how
many times better streambuf is": ``streambuf / peer`` when higher is better,
``peer / streambuf`` when lower is better. A ratio below 1 is a loss, shown as such.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ._deps import require

__all__ = [
    "Headline",
    "best_peer",
    "check_runs",
    "headline_table",
    "plot_ladder",
    "print_table",
    "write_json",
]


@dataclass(frozen=True)
class Headline:
    """One row of the headline table (see the module docstring)."""

    workload: str
    metric: str
    better: Literal["higher", "lower"]
    streambuf: float
    peer: float
    peer_name: str
    how: str = ""

    @property
    def ratio(self) -> float:
        num, den = (
            (self.streambuf, self.peer) if self.better == "higher" else (self.peer, self.streambuf)
        )
        return num / den if den and den == den else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def best_peer(
    rows: Iterable[dict[str, Any]], key: str, *, better: Literal["higher", "lower"] = "higher"
) -> dict[str, Any]:
    """The row with the best ``row[key]`` (NaNs never win)."""
    candidates = [r for r in rows if isinstance(r.get(key), int | float) and r[key] == r[key]]
    if not candidates:
        raise ValueError(f"no peer row has a figure for {key!r}")
    pick = max if better == "higher" else min
    return pick(candidates, key=lambda r: r[key])


def credit_bound(run: dict[str, Any]) -> int:
    """The most credits a streambuf run may hold: ``budget_max_bytes``, and where batches
    were larger than a worker's slice (``oversize`` > 0) the budget's rule for them: each
    worker holds at most its slice or one batch alone (``streambuf.budget``)."""
    limit = int(run["budget_max_bytes"])
    slices, batch = run.get("per_worker_limit_bytes"), run.get("batch_bytes")
    if not run.get("oversize") or not slices or batch is None:
        return limit
    return max(limit, sum(max(int(s), int(batch)) for s in slices))


def check_runs(rows: Sequence[dict[str, Any]]) -> None:
    """Every run delivered what it should: ``samples == expected_samples``, and streambuf
    runs kept their credits within the budget (``peak_in_flight_bytes <= credit_bound``).

    Raises:
        RuntimeError: naming each run that did not.
    """
    bad = []
    for row in rows:
        for k, run in enumerate(row["runs"]):
            want, got = run.get("expected_samples"), run.get("samples")
            if want is not None and got != want:
                bad.append(f"{row['name']} run {k}: delivered {got} samples, expected {want}")
            peak, limit = run.get("peak_in_flight_bytes"), run.get("budget_max_bytes")
            if peak is not None and limit is not None and peak > credit_bound(run):
                bad.append(f"{row['name']} run {k}: peak credits {peak} > budget {limit}")
    if bad:
        raise RuntimeError("benchmark runs went wrong:\n  " + "\n  ".join(bad))


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if x != x:
            return "-"
        return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"
    return str(x)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def headline_table(rows: Sequence[Headline | dict[str, Any]]) -> str:
    """The headline rows (``Headline`` or their ``as_dict()``) as a Markdown table (printed)."""
    names = set(Headline.__dataclass_fields__)
    heads = [
        h if isinstance(h, Headline) else Headline(**{k: v for k, v in h.items() if k in names})
        for h in rows
    ]
    return print_table(
        ["workload", "metric", "streambuf", "strongest peer", "peer", "streambuf is"],
        [
            (
                h.workload,
                f"{h.metric} ({h.better} is better)",
                h.streambuf,
                h.peer,
                h.peer_name,
                f"{h.ratio:.2f}x" + (" (loses)" if h.ratio < 1 else ""),
            )
            for h in heads
        ],
    )


def _clean(obj: Any) -> Any:
    """NaN/inf as null: strict JSON readers refuse them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, Headline):
        return _clean(obj.as_dict())
    return obj


def write_json(out: str | None, name: str, report: dict[str, Any]) -> Path | None:
    """``out/name.json`` (nothing when ``out`` is None)."""
    if not out:
        return None
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / f"{name}.json"
    path.write_text(json.dumps(_clean(report), indent=2, default=str))
    print(f"wrote {path}", flush=True)
    return path


def plot_ladder(
    out: str | None,
    name: str,
    *,
    title: str,
    depths: Sequence[float],
    throughput: Sequence[float],
    memory_mib: Sequence[float] | None,
    points: Sequence[tuple[str, float, float | None]],
    throughput_label: str = "batches/s",
) -> Path | None:
    """Throughput (and memory growth) against DataLoader ``prefetch_factor``, with each
    other loader (streambuf, torchdata.nodes, ...) as a labelled horizontal line."""
    if not out:
        return None
    try:
        matplotlib = require("matplotlib", purpose="the benchmark plots")
    except ImportError as exc:  # the figures are in the JSON already: say so, do not fail
        print(f"no {name}.png: {exc}", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if memory_mib is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    ax1 = axes[0][0]
    ax1.plot(depths, throughput, "o-", label="DataLoader prefetch_factor=k")
    if memory_mib is not None:
        axes[0][1].plot(depths, memory_mib, "o-", label="DataLoader prefetch_factor=k")
    for k, (label, thr, mem) in enumerate(points):
        color = f"C{k + 1}"
        ax1.axhline(thr, linestyle="--", color=color, label=label)
        if memory_mib is not None and mem is not None:
            axes[0][1].axhline(mem, linestyle="--", color=color, label=label)
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("prefetch_factor")
        ax.legend(loc="best", fontsize=7)
    ax1.set_ylabel(throughput_label)
    if memory_mib is not None:
        axes[0][1].set_ylabel("memory growth (MiB)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", flush=True)
    return path


def finish(name: str, out: str | None, *, file: str | None = None, **fields: Any) -> dict[str, Any]:
    """Every benchmark's report, in one shape: ``{"benchmark": name, "environment": ...,
    **fields}`` (its mode, rows, headline, table and own settings), written to
    ``out/<file or name>.json`` (when ``out``) and returned."""
    from ._harness import environment

    report = {"benchmark": name, "environment": environment(), **fields}
    write_json(out, file or name, report)
    return report
