"""Items/s through ``BoundedBuffer`` against ``queue.Queue``: one producer thread, one consumer.

``queue.Queue(maxsize=64)`` is what a user would otherwise write; ``BoundedBuffer``
bounds bytes as well as items (sizing each item with ``nbytes``), so it costs more per
item: this measures how much. Measured in one run, interleaved (Queue, Buffer, Queue,
Buffer, ...), medians quoted, for plain ints and for 4 KiB tensors, and for ints moved in
runs (``ints_get_many``: the producer calls ``put_many`` with 64 items at a time, the
consumer ``get_many(64)``; ``queue.Queue``, which has no batch calls, moves them one by
one as in the ``ints`` row). With ``max_items=64`` a full buffer makes the two threads
take turns, 64 items a turn: the run also measures one thread ping-pong (a wake and a
wake back), which bounds ``get_many`` at 64 items per ping-pong whatever the buffer does.

    streambuf bench buffer [--quick] [--out DIR]
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ..buffer import BoundedBuffer
from ..errors import BufferClosed
from ._benchmark import Benchmark
from ._report import Headline

_STOP = object()


def _timed(produce: Callable[[], None], consume: Callable[[], int], items: int, what: str) -> float:
    """Items/s through a hand-off: ``produce`` on its own thread, ``consume`` here (it
    returns how many items it took, which must be all ``items``)."""
    th = threading.Thread(target=produce, daemon=True)
    t0 = time.perf_counter()
    th.start()
    n = consume()
    dt = time.perf_counter() - t0
    th.join(10)
    if n != items:
        raise RuntimeError(f"{what} delivered {n} of {items} items")
    return n / dt


def _run_queue(items: list[Any], depth: int) -> float:
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)

    def produce() -> None:
        for x in items:
            q.put(x)
        q.put(_STOP)

    def consume() -> int:
        n = 0
        while q.get() is not _STOP:
            n += 1
        return n

    return _timed(produce, consume, len(items), "queue.Queue")


def _run_buffer(items: list[Any], depth: int) -> float:
    buf: BoundedBuffer[Any] = BoundedBuffer(max_items=depth, max_bytes="1GiB")

    def produce() -> None:
        for x in items:
            buf.put(x)
        buf.close()

    def consume() -> int:
        n = 0
        for _ in buf:
            n += 1
        return n

    return _timed(produce, consume, len(items), "BoundedBuffer")


def _run_buffer_many(items: list[Any], depth: int, chunk: int = 64) -> float:
    buf: BoundedBuffer[Any] = BoundedBuffer(max_items=depth, max_bytes="1GiB")

    def produce() -> None:
        for i in range(0, len(items), chunk):
            buf.put_many(items[i : i + chunk])
        buf.close()

    def consume() -> int:
        n = 0
        while True:
            try:
                n += len(buf.get_many(chunk))
            except BufferClosed:
                return n

    return _timed(produce, consume, len(items), "BoundedBuffer.get_many")


def _run_lean(items: list[Any], depth: int, chunk: int = 64) -> float:
    """The leanest hand-off of runs in Python: a ``deque`` and one ``Condition``, nothing
    sized, nothing counted, no timeouts: the reference ``get_many`` is measured against
    (what a buffer bounded by count alone could reach on this machine)."""
    dq: deque[Any] = deque()
    cv = threading.Condition()
    closed = False

    def produce() -> None:
        nonlocal closed
        for i in range(0, len(items), chunk):
            run = items[i : i + chunk]
            with cv:
                while len(dq) + len(run) > depth:
                    cv.wait(10)
                dq.extend(run)
                cv.notify()
        with cv:
            closed = True
            cv.notify()

    def consume() -> int:
        n = 0
        while True:
            with cv:
                while not dq and not closed:
                    cv.wait(10)
                if not dq:
                    return n
                got = [dq.popleft() for _ in range(min(chunk, len(dq)))]
                cv.notify()
            n += len(got)

    return _timed(produce, consume, len(items), "the lean hand-off")


def _ping_pong_us(rounds: int) -> float:
    """Microseconds for one thread to wake another and be woken back (two lock hand-offs
    and two thread switches): the least a run of ``put_many``/``get_many`` costs when a
    full buffer makes producer and consumer take turns, whatever the items."""
    from _thread import allocate_lock

    a, b = allocate_lock(), allocate_lock()
    a.acquire()
    b.acquire()

    def other() -> None:
        for _ in range(rounds):
            if not a.acquire(timeout=10):
                return
            b.release()

    th = threading.Thread(target=other, daemon=True)
    th.start()
    t0 = time.perf_counter()
    for _ in range(rounds):
        a.release()
        if not b.acquire(timeout=10):
            raise RuntimeError("the ping-pong thread stopped answering")
    dt = time.perf_counter() - t0
    th.join(10)
    return dt / rounds * 1e6


def _measure(mode: str) -> dict[str, Any]:
    n_small = {"tiny": 5_000, "quick": 20_000, "full": 200_000}[mode]
    n_tensor = {"tiny": 1_280, "quick": 5_000, "full": 50_000}[mode]
    repeats = {"tiny": 1, "quick": 3, "full": 5}[mode]
    cases: dict[str, list[Any]] = {
        "ints": [int(i) for i in range(n_small)],
        "tensors_4KiB": [torch.empty(1024) for _ in range(64)] * (n_tensor // 64),
    }
    cases["ints_get_many"] = cases["ints"]
    results: dict[str, Any] = {}
    for name, items in cases.items():
        run_buffer = _run_buffer_many if name.endswith("get_many") else _run_buffer
        q_rates, b_rates = [], []
        for _ in range(repeats):
            q_rates.append(_run_queue(items, 64))
            b_rates.append(run_buffer(items, 64))
        q_med, b_med = statistics.median(q_rates), statistics.median(b_rates)
        results[name] = {
            "items": len(items),
            "queue_items_per_s": q_rates,
            "buffer_items_per_s": b_rates,
            "queue_median": q_med,
            "buffer_median": b_med,
            "ratio": b_med / q_med,
        }
    # a full buffer of 64 makes producer and consumer take turns: one ping-pong per run of
    # 64 items at best, so ``get_many`` cannot pass 64 / ping-pong items/s on this machine
    cycle = statistics.median(_ping_pong_us(n_small // 20) for _ in range(repeats))
    ceiling = 64 / (cycle * 1e-6)
    many = results["ints_get_many"]
    lean = [_run_lean(cases["ints"], 64) for _ in range(repeats)]
    many["lean_items_per_s"] = lean
    many["lean_median"] = statistics.median(lean)
    many["lean_ratio"] = many["lean_median"] / many["queue_median"]
    many["ping_pong_us"] = cycle
    many["ceiling_items_per_s"] = ceiling
    many["ceiling_ratio"] = ceiling / many["queue_median"]
    return {"repeats": repeats, "results": results}


BENCHMARK = Benchmark(
    name="buffer",
    measure=_measure,
    title=lambda r: f"buffer ({r['mode']}): one producer thread, one consumer, depth 64",
    columns=("items", "queue.Queue items/s", "BoundedBuffer items/s", "ratio"),
    table=lambda r: (
        [(k, x["queue_median"], x["buffer_median"], x["ratio"]) for k, x in r["results"].items()]
        + [
            (
                "reference: ints 64 at a time through a deque and a Condition (nothing sized)",
                x["queue_median"],
                x["lean_median"],
                x["lean_ratio"],
            )
            for k, x in r["results"].items()
            if "lean_median" in x
        ]
    ),
    headline=lambda r: [
        Headline(
            workload=f"buffer hand-over ({name})",
            metric="items/s",
            better="higher",
            streambuf=x["buffer_median"],
            peer=x["queue_median"],
            peer_name="queue.Queue(maxsize=64)",
            how=(
                "one producer and one consumer thread; BoundedBuffer also sizes every item"
                + (
                    f"; put_many/get_many, 64 at a time (a thread ping-pong takes "
                    f"{x['ping_pong_us']:.0f} us here: at most {x['ceiling_ratio']:.1f}x "
                    "the queue with no work at all; a deque and a Condition, nothing "
                    f"sized or counted: {x['lean_ratio']:.2f}x)"
                    if name.endswith("get_many")
                    else ""
                )
            ),
        )
        for name, x in r["results"].items()
    ],
)
run = BENCHMARK.run
