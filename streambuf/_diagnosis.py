"""Which stage limits throughput, and the one change most likely to help: ``diagnose``
and ``render`` (``Loader.report()``, ``Pipeline.report()``), from ``StageStats``.

The rule, in order:

1. **The consumer**: after start-up, the training loop waited for data less than
   ``CONSUMER_WAIT`` of its time (a Loader's ``steady_wait_fraction``): batches were
   ready; the data is not what limits it. Without workers (``workers == 0``) the
   ``downstream`` link *is* the loop: named "consumer" when it costs most.
2. Otherwise each link gets a **cost**, the seconds it kept its thread busy: a stage's
   own time in the chain; for a threaded ``map`` its function's wall time divided by
   its threads (its chain time is only the wait for its results, which is someone
   else's cost). The link with the highest cost is named, with advice by kind:
   ``downstream`` (workers waiting to hand batches on: more depth, or the consumer
   side), the source (reading: lanes or workers), a threaded map (waits: more threads;
   computes: more workers or a cheaper function), any other stage (it runs in the
   worker's thread: more workers, or threads if it waits).

"Waits" vs "computes": CPU time below ``WAITS`` of the time it is compared with (a
threaded map's function: its parallel time, wall over threads, since a call's wall time
includes waiting for the GIL and a core; any other link: its own time less the time its
thread waited for a core, CPU sampled).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ._meter import StageStats

__all__ = ["Diagnosis", "diagnose", "render"]

CONSUMER_WAIT = 0.05  # the loop waited less than this share of its time: the consumer
WAITS = 0.5  # a function whose CPU time is below this share of its wall time waits


@dataclass(frozen=True)
class Diagnosis:
    """The stage that limits throughput (``stage``: a ``StageStats.stage`` name, or
    ``"consumer"``), why (``reason``) and the change most likely to help (``advice``)."""

    stage: str
    reason: str
    advice: str

    def __str__(self) -> str:
        return f"bottleneck: {self.stage}: {self.reason}; {self.advice}"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (not on every platform)
        return os.cpu_count() or 1


def _cost(s: StageStats, threads: int) -> float:
    if s.fn_calls:  # a threaded map: its function's time over its threads, but no less
        # than its CPU time over the cores its threads can use (a function that holds
        # the GIL runs one thread at a time: its wall over its threads undercounts it,
        # and the thread that waits for it was named instead)
        n = max(1, threads)
        return max(s.fn_s / n, s.fn_cpu_s / min(n, _cores()))
    if s.stage == "prefetch":  # its own time is the wait for its lanes: someone else's
        return 0.0
    return s.own_s


def diagnose(
    stages: Sequence[StageStats],
    *,
    threads: Sequence[int] | None = None,
    wait_fraction: float | None = None,
    workers: int = 0,
) -> Diagnosis | None:
    """See the module docstring. ``threads[i]``: the threads of ``stages[i]`` (1 when
    not threaded); ``wait_fraction``: the consumer's (None outside a Loader); None
    when nothing was counted yet."""
    if wait_fraction is not None and wait_fraction < CONSUMER_WAIT and any(s.items for s in stages):
        return Diagnosis(
            "consumer",
            f"batches were ready {1 - wait_fraction:.0%} of the time (the loop waited "
            f"{wait_fraction:.1%})",
            "the training step, not the data, limits throughput: nothing to gain here",
        )
    counts = list(threads) if threads is not None else [s.threads for s in stages]
    costs = [_cost(s, counts[i] if i < len(counts) else 1) for i, s in enumerate(stages)]
    if not stages or max(costs) <= 0:
        return None
    i = max(range(len(stages)), key=costs.__getitem__)
    s, n = stages[i], counts[i] if i < len(counts) else 1
    per = s.fn_s / s.fn_calls if s.fn_calls else s.own_per_item_s
    what = f"{per * 1e3:.2f} ms per item" + (f" on {n} threads" if s.fn_calls else "")
    more_workers = f"more workers (num_workers={workers + 1 if workers else 'N'}+)"
    if s.stage == "downstream" and not workers:  # no workers: downstream is the loop
        return Diagnosis(
            "consumer",
            f"the loop's own time between batches ({s.own_s:.1f} s) is the largest",
            "the training step, not the data, limits throughput (with num_workers=0 the "
            "data is read in the loop's process: num_workers > 0 overlaps the two)",
        )
    if s.stage == "downstream":
        return Diagnosis(
            s.stage,
            f"workers spent {s.own_s:.1f} s waiting to hand batches on",
            "the batches in flight are too few for this consumer's pace, or the "
            "transport is slow: raise max_batches / max_bytes (adaptive=True finds the "
            "depth), or pin_memory=False for large batches",
        )
    if s.fn_calls:
        # CPU per second of the stage's parallel time (its wall over its threads): a
        # call's wall time includes waiting for the GIL and a core, not only for I/O
        cpu = min(1.0, s.fn_cpu_s / (s.fn_s / max(1, n))) if s.fn_s else 0.0
    else:
        ran = s.own_s - s.core_wait_s  # (waiting for a busy machine's cores is not I/O)
        cpu = min(1.0, s.cpu_s / ran) if ran > 0 else 0.0
    waits = cpu < WAITS
    how = f"waiting {1 - cpu:.0%} of it (CPU {cpu:.0%})" if waits else f"computing (CPU {cpu:.0%})"
    if s.stage == "source (iterable)":  # every worker reads it whole, keeping its share
        skipped = " (a worker's time per item counts the items it read and skipped)"
        return Diagnosis(
            s.stage,
            f"{what} reading, {how}" + (skipped if workers > 1 else ""),
            "one iterable is read whole by every worker (each keeps every N-th item), so "
            "more workers do not read it faster: make it cheaper, or give Pipeline a list "
            "of shards to split (Pipeline(shards, expand=fn), or a reader) so each worker "
            "reads its own",
        )
    if s.stage.startswith("source"):
        if waits and ("tar" in s.stage or "video" in s.stage or n > 1):
            advice = (
                f"it waits: read more at once: more lanes (lanes=, or 'auto'), or {more_workers}"
            )
        elif waits:
            advice = f"it waits: {more_workers}; make the source cheaper (expand=/reader=)"
        else:
            advice = f"it computes: {more_workers}, or make the source cheaper"
        return Diagnosis(s.stage, f"{what} reading, {how}", advice)
    if s.fn_calls:
        if waits:
            return Diagnosis(
                s.stage,
                f"{what}, {how}",
                "it waits (I/O, a remote call): raise threads= (or threads='auto')",
            )
        return Diagnosis(
            s.stage,
            f"{what}, {how}",
            f"it computes: {more_workers}, or make the function cheaper",
        )
    if waits:
        return Diagnosis(
            s.stage,
            f"{what} in the worker's pipeline thread, {how}",
            "it waits: "
            + (
                f"move the waiting work into a threaded map before it (.map(fn, "
                f"threads='auto')), or {more_workers}"
                if s.stage.split(" ", 1)[0] in ("batch", "filter")
                else f"give it threads (map(fn, threads='auto')), or {more_workers}"
            ),
        )
    return Diagnosis(
        s.stage,
        f"{what} in the worker's pipeline thread, {how}",
        f"it computes: {more_workers}, or make it cheaper",
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render(stages: Sequence[StageStats], diagnosis: Diagnosis | None) -> str:
    """A table in the order data flows, then the conclusion."""
    found = str(diagnosis) if diagnosis is not None else "bottleneck: nothing measured yet"
    return render_table(stages) + "\n\n" + found


def render_table(stages: Sequence[StageStats]) -> str:
    """The stages as a table in the order data flows."""
    lines = [
        "| stage | threads | items | own s | CPU s | core wait s | per item ms | share "
        "| held now, peak | fn wall s | fn CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in stages:
        fn = f"{s.fn_s:.2f} | {s.fn_cpu_s:.2f}" if s.fn_calls else "- | -"
        held = f"{s.held_items} ({_size(s.held_bytes)})" if s.held_items else "-"
        if s.peak_items:
            held += f", peak {s.peak_items} ({_size(s.peak_bytes)})"
        cpu = f"{s.cpu_s:.2f} | {s.core_wait_s:.2f}" if s.stage != "downstream" else "- | -"
        lines.append(
            f"| {s.stage} | {s.threads} | {s.items} | {s.own_s:.2f} | {cpu} | "
            f"{s.own_per_item_s * 1e3:.3f} | {s.share:.0%} | {held} | {fn} |"
        )
    return "\n".join(lines)
