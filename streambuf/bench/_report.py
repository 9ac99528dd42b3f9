"""The pieces of every benchmark's report: checks on what each run delivered, headline rows
(streambuf against the strongest peer), Markdown tables, JSON and the ladder plot.

A headline row compares streambuf's figure with the *strongest* peer measured in the
same run (the best DataLoader ``prefetch_factor``, ``torchdata.nodes``, webdataset,
PyAV seek-per-clip, torchcodec ... whichever did best), and states its ratio as "how
many times better streambuf is": ``streambuf / peer`` when higher is better,
``peer / streambuf`` when lower is better. A ratio below 1 is a loss, shown as such.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ._deps import require

__all__ = [
    "HEADLINE_COLUMNS",
    "Better",
    "Headline",
    "Ladder",
    "Table",
    "best_peer",
    "check_runs",
    "credit_bound",
    "headline_cells",
    "short_name",
    "versus",
    "write_json",
]

Row = dict[str, Any]
Better = Literal["higher", "lower"]
HEADLINE_COLUMNS = ("workload", "metric", "streambuf", "strongest peer", "peer", "streambuf is")


@dataclass(frozen=True)
class Headline:
    """One row of the headline table (see the module docstring)."""

    workload: str
    metric: str
    better: Better
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


def headline_cells(h: Headline | dict[str, Any]) -> tuple[Any, ...]:
    """A headline row (``Headline`` or its ``as_dict()``) as cells under ``HEADLINE_COLUMNS``."""
    if not isinstance(h, Headline):
        h = Headline(**{k: v for k, v in h.items() if k in Headline.__dataclass_fields__})
    return (
        h.workload,
        f"{h.metric} ({h.better} is better)",
        h.streambuf,
        h.peer,
        h.peer_name,
        f"{h.ratio:.2f}x" + (" (loses)" if h.ratio < 1 else ""),
    )


def short_name(row: Row) -> str:
    """A row's name without its section (``"seed: DataLoader pf=2"`` -> ``"DataLoader pf=2"``)."""
    return str(row["name"]).split(": ", 1)[-1]


def best_peer(rows: Iterable[Row], key: str, *, better: Better = "higher") -> Row:
    """The row with the best ``row[key]`` (NaNs never win)."""
    candidates = [r for r in rows if isinstance(r.get(key), int | float) and r[key] == r[key]]
    if not candidates:
        raise ValueError(f"no peer row has a figure for {key!r}")
    pick = max if better == "higher" else min
    return pick(candidates, key=lambda r: r[key])


def _is_streambuf(row: Row) -> bool:
    return bool(row["kind"] == "streambuf")


def _not_streambuf(row: Row) -> bool:
    return not _is_streambuf(row)


def versus(
    rows: Sequence[Row],
    key: str,
    *,
    workload: str,
    metric: str,
    better: Better = "higher",
    how: str | Callable[[Row, Row], str] = "",
    mine: Callable[[Row], bool] = _is_streambuf,
    peers: Callable[[Row], bool] = _not_streambuf,
    peer_name: Callable[[Row], str] = short_name,
) -> Headline | None:
    """The headline of ``rows`` on ``row[key]``: the first row that is ``mine`` against
    the best of the ``peers`` rows; None where no row is ``mine``. ``how`` may be a
    function of (streambuf's row, the peer's row)."""
    sb = next((r for r in rows if mine(r)), None)
    if sb is None:
        return None
    peer = best_peer([r for r in rows if peers(r)], key, better=better)
    return Headline(
        workload=workload,
        metric=metric,
        better=better,
        streambuf=sb[key],
        peer=peer[key],
        peer_name=peer_name(peer),
        how=how if isinstance(how, str) else how(sb, peer),
    )


def credit_bound(run: dict[str, Any]) -> int:
    """The most credits a streambuf run may hold: ``budget_max_bytes``, and where batches
    were larger than a worker's slice (``oversize`` > 0) the budget's rule for them: each
    worker holds at most its slice or one batch alone (``streambuf.budget``)."""
    limit = int(run["budget_max_bytes"])
    slices, batch = run.get("per_worker_limit_bytes"), run.get("batch_bytes")
    if not run.get("oversize") or not slices or batch is None:
        return limit
    return max(limit, sum(max(int(s), int(batch)) for s in slices))


def check_runs(rows: Sequence[Row]) -> None:
    """Every run delivered what it should: ``samples == expected_samples`` (and as many
    ``distinct_samples`` where counted), and streambuf runs kept their credits within the
    budget (``peak_in_flight_bytes <= credit_bound``).

    Raises:
        RuntimeError: naming each run that did not.
    """
    bad = []
    for row in rows:
        for k, run in enumerate(row["runs"]):
            want, got = run.get("expected_samples"), run.get("samples")
            if want is not None and got != want:
                bad.append(f"{row['name']} run {k}: delivered {got} samples, expected {want}")
            distinct = run.get("distinct_samples", want)
            if want is not None and distinct != want:
                bad.append(f"{row['name']} run {k}: {distinct} distinct samples of {want}")
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


@dataclass(frozen=True)
class Table:
    """A Markdown table under a title line."""

    title: str
    columns: Sequence[str]
    rows: Iterable[Sequence[Any]]

    def show(self) -> str:
        """Print the title and the table; return the table's Markdown."""
        lines = [
            "| " + " | ".join(self.columns) + " |",
            "|" + "|".join("---" for _ in self.columns) + "|",
        ]
        lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in self.rows]
        text = "\n".join(lines)
        print(f"\n{self.title}\n{text}", flush=True)
        return text


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


@dataclass(frozen=True)
class Ladder:
    """A plot of ``rows``: throughput (and memory growth) of the DataLoader rows (kind
    "dataloader") against their ``prefetch_factor``, each other row a labelled line."""

    title: str
    rows: Sequence[Row]
    throughput: str = "batches_per_s"  # the row key plotted
    memory: str | None = None  # a row key in bytes: a second panel, in MiB
    label: Callable[[Row], str] = short_name
    throughput_label: str = "batches/s"

    def draw(self, out: str | None, name: str) -> Path | None:
        """``out/name.png`` (nothing when ``out`` is None or matplotlib is missing)."""
        if not out:
            return None
        try:
            matplotlib = require("matplotlib", purpose="the benchmark plots")
        except ImportError as exc:  # the figures are in the JSON already: say so, do not fail
            print(f"no {name}.png: {exc}", flush=True)
            return None
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ladder = [r for r in self.rows if r["kind"] == "dataloader"]
        others = [r for r in self.rows if r["kind"] != "dataloader"]
        depths = [r["config"]["prefetch_factor"] for r in ladder]
        panels = 2 if self.memory else 1
        fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
        for ax, key, scale in (
            (axes[0][0], self.throughput, 1),
            (axes[0][-1], self.memory, 1 << 20),
        ):
            if key is None:
                continue
            ax.plot(
                depths, [r[key] / scale for r in ladder], "o-", label="DataLoader prefetch_factor=k"
            )
            for k, r in enumerate(others):
                ax.axhline(r[key] / scale, linestyle="--", color=f"C{k + 1}", label=self.label(r))
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)
            ax.set_xlabel("prefetch_factor")
            ax.set_ylabel(
                self.throughput_label if key == self.throughput else "memory growth (MiB)"
            )
            ax.legend(loc="best", fontsize=7)
        fig.suptitle(self.title, fontsize=10)
        fig.tight_layout()
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}", flush=True)
        return path
