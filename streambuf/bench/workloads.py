"""The synthetic workloads and the three loaders every ladder benchmark compares.

A sample is a float32 tensor of ``shape`` (its first element is its index), made after
``latency_s`` of sleep (I/O or a decode that releases the GIL; log-normal with
``lognormal_sigma`` > 0, or phases of fast and slow samples) and ``cpu_iters`` turns of
a pure-Python loop (work that holds the GIL). Module level, so DataLoader workers pickle
it. The loaders, all fed the same ``SampleMaker``, batch ``batch_size`` samples with
``default_collate``:

* ``"dataloader"``: ``DataLoader`` over a map-style Dataset (the mission's baseline),
  ``num_workers=workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``;
* ``"torchdata"``: ``torchdata.nodes`` in this process, no IPC at all:
  ``IterableWrapper(range(n)) -> ParallelMapper(make, num_workers=threads,
  method="thread") -> Batcher -> Mapper(default_collate) [-> PinMemory] ->
  Prefetcher(prefetch_factor) -> Loader``;
* ``"streambuf"``: ``Pipeline(range(n)).map(make, threads=threads).batch(batch_size)``
  through ``Loader(num_workers=workers, max_batches, max_bytes)``.

``run_loader(cfg)`` iterates one of them and reports steady-state throughput (batches/s
from the first batch to the last: worker start-up excluded for every side), the
consumer's wait, what was delivered, and for streambuf the credit accounting.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

__all__ = ["MapDataset", "SampleMaker", "calibrate_spin", "run_loader", "spin"]


def spin(iterations: int) -> int:
    """Pure-Python work that holds the GIL (no C call releases it)."""
    acc = 0
    for k in range(iterations):
        acc = (acc + k * k) % 1_000_003
    return acc


def calibrate_spin(seconds: float, *, trials: int = 5) -> int:
    """Iterations of ``spin`` that take ``seconds`` on one core here (best of ``trials``)."""
    probe = 20_000
    best = math.inf
    for _ in range(trials):
        t0 = time.perf_counter()
        spin(probe)
        best = min(best, time.perf_counter() - t0)
    return max(1, round(probe * seconds / best))


@dataclass(frozen=True)
class SampleMaker:
    """Makes sample ``i`` (see the module docstring)."""

    shape: tuple[int, ...] = (1,)
    latency_s: float = 0.0
    lognormal_sigma: float = 0.0  # > 0: heavy-tailed latency with median latency_s
    phase_samples: int = 0  # > 0: alternate phases of fast (latency_s) and slow samples
    slow_latency_s: float = 0.0
    cpu_iters: int = 0
    seed: int = 0

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> SampleMaker:
        shape = cfg.get("shape") or [max(1, cfg.get("sample_bytes", 4) // 4)]
        return cls(
            shape=tuple(int(s) for s in shape),
            latency_s=cfg.get("latency_s", 0.0),
            lognormal_sigma=cfg.get("lognormal_sigma", 0.0),
            phase_samples=cfg.get("phase_samples", 0),
            slow_latency_s=cfg.get("slow_latency_s", 0.0),
            cpu_iters=cfg.get("cpu_iters", 0),
        )

    @property
    def nbytes(self) -> int:
        return 4 * math.prod(self.shape)

    def latency(self, i: int) -> float:
        if self.phase_samples > 0:
            slow = (i // self.phase_samples) % 2 == 1
            return self.slow_latency_s if slow else self.latency_s
        if self.lognormal_sigma <= 0:
            return self.latency_s
        rng = random.Random(self.seed * 1_000_003 + i)
        return self.latency_s * math.exp(rng.gauss(0.0, self.lognormal_sigma))

    def __call__(self, i: int) -> torch.Tensor:
        lat = self.latency(i)
        if lat > 0:
            time.sleep(lat)
        if self.cpu_iters:
            spin(self.cpu_iters)
        t = torch.ones(self.shape, dtype=torch.float32)  # touches every page
        t.view(-1)[0] = i
        return t


class MapDataset(Dataset[torch.Tensor]):
    """The map-style baseline: ``__getitem__`` does the same work as the pipeline."""

    def __init__(self, n: int, maker: SampleMaker) -> None:
        self.n = n
        self.maker = maker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.maker(i)


def accelerator_available() -> bool:
    """Whether pinning memory means anything here (DataLoader warns and ignores it if not)."""
    return torch.cuda.is_available()


@dataclass
class _Built:
    loader: Iterable[Any]
    info: dict[str, Any] = field(default_factory=dict)
    close: Any = None


def _dataloader(cfg: dict[str, Any], n: int, maker: SampleMaker) -> _Built:
    pin = bool(cfg.get("pin_memory")) and accelerator_available()
    dl = DataLoader(
        MapDataset(n, maker),
        batch_size=cfg["batch_size"],
        num_workers=cfg["workers"],
        prefetch_factor=cfg["prefetch_factor"],
        pin_memory=pin,
        persistent_workers=bool(cfg.get("persistent_workers")) and cfg["workers"] > 0,
    )

    def close() -> None:
        it = getattr(dl, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    return _Built(dl, {"pin_memory_effective": pin}, close)


def _torchdata(cfg: dict[str, Any], n: int, maker: SampleMaker) -> _Built:
    import torchdata.nodes as tn

    pin = bool(cfg.get("pin_memory")) and accelerator_available()
    node: Any = tn.IterableWrapper(range(n))
    node = tn.ParallelMapper(
        node,
        maker,
        num_workers=cfg["threads"],
        method="thread",
        in_order=cfg.get("in_order", True),
        max_concurrent=cfg.get("max_concurrent"),
    )
    node = tn.Batcher(node, batch_size=cfg["batch_size"], drop_last=False)
    node = tn.Mapper(node, default_collate)
    if pin:
        node = tn.PinMemory(node)
    node = tn.Prefetcher(node, prefetch_factor=cfg.get("prefetch_factor", 2))
    loader = tn.Loader(node)
    return _Built(loader, {"pin_memory_effective": pin})  # its threads end with the data


def _streambuf(cfg: dict[str, Any], n: int, maker: SampleMaker) -> _Built:
    import streambuf as sb

    pipe = (
        sb.Pipeline(range(n))
        .map(
            maker,
            threads=cfg["threads"],
            ordered=cfg.get("ordered", True),
            adaptive=cfg.get("adaptive", True),
            max_items=cfg.get("map_max_items"),  # None: the default, two a thread
        )
        .batch(cfg["batch_size"])
    )
    if cfg.get("stage_stats") is False:  # the ablation: no per-stage time accounting
        pipe._meter = None
    loader = sb.Loader(
        pipe,
        num_workers=cfg["workers"],
        max_batches=cfg["max_batches"],
        max_bytes=cfg["max_bytes"],
        in_order=cfg.get("in_order", True),
        adaptive=cfg.get("adaptive", True),
        pin_memory=bool(cfg.get("pin_memory")) and accelerator_available(),
        persistent_workers=bool(cfg.get("persistent_workers")) and cfg["workers"] > 0,
    )
    return _Built(loader, {}, loader.close)


def _defaults(cfg: dict[str, Any], n: int, maker: SampleMaker) -> _Built:
    """streambuf as a new user writes it: the map-style Dataset brought in one line
    (``from_dataset``, ``threads="auto"``) and a ``Loader`` at its defaults (the
    workers, the batch count and the byte budget chosen from the machine)."""
    import streambuf as sb

    pipe = sb.Pipeline.from_dataset(MapDataset(n, maker), threads="auto").batch(cfg["batch_size"])
    loader = sb.Loader(
        pipe,
        pin_memory=bool(cfg.get("pin_memory")) and accelerator_available(),
        persistent_workers=bool(cfg.get("persistent_workers")),
    )
    return _Built(loader, {"num_workers": loader.num_workers}, loader.close)


_BUILDERS = {
    "dataloader": _dataloader,
    "torchdata": _torchdata,
    "streambuf": _streambuf,
    "defaults": _defaults,
}


def loader_stats(loader: Any) -> dict[str, Any]:
    """A streambuf Loader's credit accounting, flat, for the JSON and the checks."""
    st = loader.stats()
    out: dict[str, Any] = {"final_depth": st.depth, "wait_s": st.wait_s}
    b = st.budget
    if b is not None:
        out.update(
            peak_in_flight_bytes=b.peak_in_flight_bytes,
            peak_in_flight_batches=b.peak_in_flight_batches,
            peak_batch_bytes_held=b.peak_batch_bytes_held,
            budget_max_bytes=b.max_bytes,
            budget_max_batches=b.max_batches,
            per_worker_limit_bytes=list(b.per_worker_limit_bytes),
            oversize=b.oversize,
        )
    out["tuner_decisions"] = [d.as_dict() for d in st.decisions]
    # the threaded map's most items held (made or being made), summed over the workers
    maps = [s.peak_items for s in st.stages if s.stage.startswith("map(")]
    if maps:
        out["map_peak_items"] = max(maps)
    return out


def chosen_threads(counts: list[tuple[float, int]]) -> tuple[int, float] | None:
    """The count ``threads="auto"`` settled on (the one sampled most often; the epoch's
    tail, where workers finish one by one, is short) and when it was first reached;
    None without samples."""
    if not counts:
        return None
    values = [c for _, c in counts]
    mode = max(set(values), key=lambda v: (values.count(v), v))
    return mode, next(t for t, c in counts if c == mode)


def run_loader(cfg: dict[str, Any]) -> dict[str, Any]:
    """Iterate the loader ``cfg`` describes once; the report (see the module docstring).

    ``cfg["ablate"] == "lead"`` (an ablation, in a process of its own): every worker's
    ``threads="auto"`` climbs alone (no ``Lead``: worker 0 does not decide for all); the
    patch reaches the workers by fork (the Loader's default context on Linux).
    """
    if cfg.get("ablate") == "lead":
        import streambuf.stages as stages

        stages._thread_lead = lambda counters: None
    maker = SampleMaker.from_config(cfg)
    n = cfg["batches"] * cfg["batch_size"]
    t_build = time.perf_counter()
    built = _BUILDERS[cfg["kind"]](cfg, n, maker)
    step_s = cfg.get("step_s", 0.0)
    times: list[float] = []
    waits: list[float] = []
    seen = 0
    # threads="auto": (seconds since the build, threads over all workers): batch 1, 9, ...
    threads: list[tuple[float, int]] = []
    tuned = (cfg["kind"] == "streambuf" and cfg.get("threads") == "auto") or cfg[
        "kind"
    ] == "defaults"
    try:
        t_req = time.perf_counter()
        for batch in built.loader:
            t_got = time.perf_counter()
            waits.append(t_got - t_req)
            times.append(t_got)
            seen += int(batch.shape[0])
            if tuned and len(times) % 8 == 1:
                pipe = built.loader.pipeline  # type: ignore[attr-defined]
                total = sum(t.threads for t in pipe.stats().threads)
                if total:  # 0: the workers' stages ended (the epoch's tail)
                    threads.append((round(t_got - t_build, 2), total))
            if step_s:
                time.sleep(step_s)  # a train step: releases the GIL, as CUDA launches do
            t_req = time.perf_counter()
        end = time.perf_counter()
        extra = loader_stats(built.loader) if cfg["kind"] in ("streambuf", "defaults") else {}
    finally:
        if built.close is not None:
            built.close()
    steady = times[-1] - times[0] if len(times) > 1 else float("nan")
    settled = _settled(cfg, times, t_build, chosen_threads(threads)) if tuned else {}
    tail = _tail(cfg, times, t_build, threads)
    return {
        "samples": seen,
        "expected_samples": n,
        "batches": len(times),
        "batches_per_s": (len(times) - 1) / steady if steady > 0 else float("nan"),
        "samples_per_s": (len(times) - 1) * cfg["batch_size"] / steady
        if steady > 0
        else float("nan"),
        "wait_fraction": sum(waits[1:]) / max(1e-9, end - times[0]) if times else float("nan"),
        "first_batch_s": times[0] - t_build if times else float("nan"),
        "total_s": end - t_build,
        "sample_bytes": maker.nbytes,
        "batch_bytes": maker.nbytes * cfg["batch_size"],
        **built.info,
        **extra,
        **(
            {"threads_over_time": threads, "threads_chosen": chosen_threads(threads)}
            if tuned
            else {}
        ),
        **settled,
        **tail,
    }


def _tail(
    cfg: dict[str, Any], times: list[float], t_build: float, counts: list[tuple[float, int]]
) -> dict[str, Any]:
    """The rate over the last three quarters of the batches (``tail_batches_per_s``): a
    run of a few seconds spends a large part of itself starting (workers, buffers, the
    climb of ``threads="auto"``), and the first-to-last rate mixes that in. With
    ``threads="auto"``, ``tail_threads`` is the mean of the counts sampled in that span
    (the count changes while it re-checks: the rate is what that mean delivered)."""
    if len(times) < 8:
        return {}
    start = times[len(times) // 4]
    span = times[-1] - start
    if span <= 0:
        return {}
    out: dict[str, Any] = {"tail_batches_per_s": (len(times) - 1 - len(times) // 4) / span}
    inside = [c for t, c in counts if t_build + t >= start]
    if inside:
        out["tail_threads"] = sum(inside) / len(inside)
    return out


def _settled(
    cfg: dict[str, Any], times: list[float], t_build: float, chosen: tuple[int, float] | None
) -> dict[str, Any]:
    """``threads="auto"`` on a waiting map: the rate from when the count it settled on was
    first reached to the end, and its share of the ceiling ``threads / latency`` for that
    count (the issue's "efficiency at the count it chose"); {} without a latency."""
    latency = float(cfg.get("latency_s") or 0.0)
    if chosen is None or latency <= 0:
        return {}
    after = [t for t in times if t >= t_build + chosen[1]]
    if len(after) < 2 or after[-1] <= after[0]:
        return {}
    rate = (len(after) - 1) / (after[-1] - after[0])
    ceiling = chosen[0] / latency / cfg["batch_size"]
    return {
        "settled_batches_per_s": rate,
        "settled_batches": len(after),
        "efficiency": rate / ceiling,
    }
