"""streambuf.nodes: torchdata's save/load contract for every node, the BaseNode contract
(reset, state nesting, shutdown, garbage collection), errors, and torchdata's Loader."""

from __future__ import annotations

import gc
import json
import pickle
import threading
import time

import pytest
import torch
import torchdata.nodes as tn
from torchdata.nodes import Batcher, IterableWrapper, Loader

import streambuf as sb
from tests.helpers import merged_batches, slot_batches, wait_for_threads
from tests.nodes_data import FACTORIES, Counting, Jitter, ids, pipeline
from tests.nodes_harness import check_save_load

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_thread_leak")]


@pytest.mark.parametrize("midpoint", [0, 7, 32])
@pytest.mark.parametrize("graph", sorted(FACTORIES))
def test_save_load_at_midpoints_over_two_epochs(graph, midpoint):
    factory, ordered = FACTORIES[graph]
    check_save_load(factory(), midpoint, ordered=ordered, key=ids)


def eventually(pred, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# -- state ------------------------------------------------------------------------------
def test_state_is_the_source_state_of_the_last_item_returned():
    node = sb.nodes.ParallelMapper(
        IterableWrapper(range(100)), lambda x: x, threads=4, max_items=8, max_bytes="1MiB"
    )
    got = [next(node) for _ in range(5)]
    assert got == [0, 1, 2, 3, 4]
    assert eventually(lambda: node.source.state_dict()["_num_yielded"] == 5 + 8)  # ran ahead
    assert node.state_dict() == {"source": {"_num_yielded": 5}, "delivered_ahead": []}
    node.shutdown()


def test_out_of_order_state_lists_what_was_delivered_ahead_and_resumes_exactly():
    release = threading.Event()

    def slow_zero(x):
        if x == 0:
            release.wait(10)
        return x

    def make():
        src = IterableWrapper(range(20))
        return sb.nodes.ParallelMapper(src, slow_zero, threads=3, max_bytes="1MiB", in_order=False)

    node = make()
    first = [next(node) for _ in range(4)]  # 0 is held back on its thread
    assert 0 not in first
    state = json.loads(json.dumps(node.state_dict()))
    assert state["source"] == {"_num_yielded": 0}
    assert sorted(state["delivered_ahead"]) == sorted(first)
    release.set()
    node.shutdown()

    resumed = make()
    resumed.reset(state)
    rest = list(resumed)
    assert sorted(first + rest) == list(range(20))
    end = resumed.state_dict()
    assert end == {"source": {"_num_yielded": 20}, "delivered_ahead": []}


def test_a_fresh_graph_resumes_through_torchdata_loader():
    def graph():
        node = Batcher(Counting(100), batch_size=4)
        node = sb.nodes.ParallelMapper(node, Jitter(), threads=4, max_bytes="1MiB")
        return Loader(sb.nodes.Prefetcher(node, max_items=4, max_bytes="1MiB"))

    ref = list(graph())
    loader = graph()
    it = iter(loader)
    head = [next(it) for _ in range(9)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it, loader
    gc.collect()  # torchdata's Loader and its iterator form a cycle: the GC frees the graph
    fresh = graph()
    fresh.load_state_dict(state)
    assert head + list(fresh) == ref


def test_reset_with_a_foreign_state_says_what_it_needs():
    node = sb.nodes.Prefetcher(IterableWrapper(range(3)), max_items=2, max_bytes=64)
    assert next(node) == 0
    with pytest.raises(ValueError, match="delivered_ahead"):
        node.reset({"snapshot": None, "steps_since_snapshot": 0})  # torchdata's format
    assert list(node) == [1, 2]  # the running iteration is untouched


# -- bounds -----------------------------------------------------------------------------
def test_prefetcher_holds_at_most_max_items_including_the_one_being_pulled():
    src = Counting(50)
    node = sb.nodes.Prefetcher(src, max_items=3, max_bytes="1MiB")
    next(node)
    assert eventually(lambda: src.nexts == 1 + 3)  # delivered one; three more pulled
    time.sleep(0.05)
    assert src.nexts == 1 + 3  # and no more
    assert len(list(node)) == 49
    node.shutdown()


def test_byte_bound_limits_the_depth_and_counts_oversize():
    sizes = [100] * 20 + [1000] + [100] * 5  # one item larger than max_bytes
    node = sb.nodes.ParallelMapper(
        IterableWrapper(sizes),
        lambda n: torch.zeros(n, dtype=torch.uint8),
        threads=2,
        max_items=16,
        max_bytes=500,
    )
    out = []
    for t in node:
        out.append(t.numel())
        time.sleep(0.002)
    s = node.stats()
    assert out == sizes
    assert s.oversize >= 1 and s.max_bytes == 500 and s.gets == len(sizes)
    assert s.peak_bytes == 1000  # the big one alone; everything else within 500
    assert sb.nodes.Prefetcher(IterableWrapper([]), max_items=1, max_bytes=8).stats().puts == 0


@pytest.mark.parametrize("in_order", [True, False])
def test_items_being_made_count_against_the_byte_bound(in_order):
    # 100-byte results and room for 250 bytes: once the size is known, at most two are
    # being made or held at once, in order too (one pool, not a share per thread)
    lock, running, peak = threading.Lock(), [0], []

    def make(i):
        with lock:
            running[0] += 1
            if i >= 8:
                peak.append(running[0])
        time.sleep(0.003)
        with lock:
            running[0] -= 1
        return torch.zeros(100, dtype=torch.uint8)

    node = sb.nodes.ParallelMapper(
        IterableWrapper(range(40)),
        make,
        threads=4,
        max_items=8,
        max_bytes=250,
        in_order=in_order,
    )
    assert len(list(node)) == 40
    assert max(peak) == 2
    assert node.stats().peak_bytes <= 250


def slow_head(item: tuple[int, int]) -> tuple[int, int]:
    if item[0] == 0:
        time.sleep(0.3)
    return item


def test_a_head_result_larger_than_its_reservation_is_handed_over():
    # the first result outgrows its reservation (a third of max_bytes) and is larger than
    # max_bytes; it is made last (slow), so later threads have filled the window with
    # results that must come after it: only the hand-off of the head keeps in-order
    # delivery from deadlocking. Slow head, instant others: the window is full whatever
    # the machine's load (a random jitter let it pass now and then without the hand-off).
    sizes = [300] + [10] * 30
    node = sb.nodes.ParallelMapper(
        IterableWrapper(list(enumerate(sizes))),
        slow_head,
        threads=3,
        max_items=3,
        max_bytes=100,
        sizeof=lambda x: x[1],
        join_timeout_s=5.0,
    )
    got = []
    done = threading.Thread(target=lambda: got.extend(node), daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "in-order delivery deadlocked"
    assert [i for i, _ in got] == list(range(31))
    assert node.stats().peak_bytes <= 300


def test_invalid_arguments_say_the_fix():
    src = IterableWrapper(range(3))
    with pytest.raises(ValueError, match="max_items=2 must be >= threads=4"):
        sb.nodes.ParallelMapper(src, ids, threads=4, max_items=2, max_bytes=64)
    with pytest.raises(TypeError, match="IterableWrapper"):
        sb.nodes.Prefetcher(range(3), max_items=2, max_bytes=64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes"):
        sb.nodes.Prefetcher(src, max_items=2, max_bytes="lots")
    with pytest.raises(ValueError, match="sequence"):
        sb.nodes.PipelineNode(sb.Pipeline(iter(range(3))))


# -- errors -----------------------------------------------------------------------------
class Boom(Exception):
    pass


def test_a_map_fn_error_reaches_next_as_the_same_object_with_a_note():
    err = Boom("bad item")
    failed = []

    def fn(x):
        if x == 5 and not failed:  # fails once
            failed.append(x)
            raise err
        return x

    node = sb.nodes.ParallelMapper(IterableWrapper(range(50)), fn, threads=3, max_bytes=4096)
    with pytest.raises(Boom) as info:
        list(Loader(node))
    assert info.value is err
    assert any("ParallelMapper(fn)" in n and "mapping item #5" in n for n in err.__notes__)
    with pytest.raises(Boom):  # and again, not a silent end
        next(node)
    node.reset()  # a reset starts over
    assert list(node) == list(range(50))


def test_a_source_error_and_a_stop_iteration_in_map_fn_keep_their_meaning():
    class Broken(Counting):
        def next(self):
            if self.i == 3:
                raise KeyError("no such shard")
            return super().next()

    node = sb.nodes.Prefetcher(Broken(10), max_items=2, max_bytes=4096)
    with pytest.raises(KeyError) as info:
        list(node)
    assert "pulling from its source" in info.value.__notes__[-1]

    def stops(x):
        raise StopIteration

    node = sb.nodes.ParallelMapper(IterableWrapper(range(5)), stops, threads=2, max_bytes=64)
    with pytest.raises(RuntimeError, match="map_fn raised StopIteration"):
        next(node)


# -- threads ----------------------------------------------------------------------------
def _alive(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


def test_reset_shutdown_and_garbage_collection_stop_the_threads():
    name = "streambuf-ParallelMapper(ids)"
    node = sb.nodes.ParallelMapper(IterableWrapper(range(1000)), ids, threads=4, max_bytes=4096)
    next(node)
    assert _alive(name) == 4
    node.reset()
    next(node)
    assert _alive(name) == 4  # the old four joined, four new ones
    node.shutdown()
    assert _alive(name) == 0
    with pytest.raises(StopIteration):
        next(node)
    node = sb.nodes.ParallelMapper(IterableWrapper(range(1000)), ids, threads=4, max_bytes=4096)
    next(node)
    del node
    gc.collect()
    assert wait_for_threads(name, timeout_s=2.0) == []


def test_a_graph_whose_map_fn_failed_stops_its_threads_when_dropped():
    """The error's traceback holds the node's ``next`` frame, and so the node: the
    finalizer's registry (holding the run) kept it, its threads and its upstream's
    alive for good (2 more threads for each failed graph dropped)."""

    def bad(x):
        if x == 13:
            raise KeyError("boom")
        return x

    for _ in range(2):
        pipe = sb.Pipeline(list(range(40)), seed=1).map(ids, threads=2)
        node = sb.nodes.ParallelMapper(
            sb.nodes.PipelineNode(pipe), bad, threads=3, max_bytes="1MiB"
        )
        with pytest.raises(KeyError):
            list(Loader(node))
        assert _alive("streambuf-ParallelMapper") == 0  # stopped at the error
        del node, pipe
        gc.collect()
    assert wait_for_threads("streambuf", timeout_s=5.0) == []


def test_reset_is_bounded_when_map_fn_is_stuck():
    release = threading.Event()

    def stuck(x):
        if x >= 2:
            release.wait(10)
        return x

    node = sb.nodes.ParallelMapper(
        IterableWrapper(range(100)), stuck, threads=2, max_bytes=4096, join_timeout_s=0.2
    )
    assert [next(node), next(node)] == [0, 1]
    t0 = time.monotonic()
    node.reset()  # the two stuck threads are left to end at their next put
    assert time.monotonic() - t0 < 1.0
    release.set()
    assert list(node) == list(range(100))


def test_nodes_pickle_as_configuration_even_while_running():
    node = sb.nodes.Prefetcher(
        sb.nodes.ParallelMapper(
            sb.nodes.PipelineNode(sb.Pipeline(list(range(30))).batch(3)),
            ids,
            threads=2,
            max_bytes=4096,
        ),
        max_items=2,
        max_bytes=4096,
    )
    first = next(node)
    copy = pickle.loads(pickle.dumps(node))  # e.g. into a spawned DataLoader worker
    assert [first, *node] == [list(range(i, i + 3)) for i in range(0, 30, 3)]
    assert list(copy) == [list(range(i, i + 3)) for i in range(0, 30, 3)]
    assert copy.state_dict()["source"]["source"]["complete"]


# -- torchdata integration --------------------------------------------------------------
def test_mixes_with_torchdata_nodes_and_its_loader():
    node = tn.ParallelMapper(IterableWrapper(range(60)), Jitter(), num_workers=2)
    node = sb.nodes.ParallelMapper(node, Jitter(), threads=3, max_bytes=4096)
    node = tn.Prefetcher(Batcher(node, batch_size=5), prefetch_factor=2)
    loader = Loader(node)
    assert [x for b in loader for x in b] == list(range(60))
    assert [x for b in loader for x in b] == list(range(60))  # a second epoch


def test_streambuf_exports_the_module():
    assert set(sb.nodes.__all__) == {"ParallelMapper", "PipelineNode", "Prefetcher"}
    assert "nodes" not in sb.__all__  # a subpackage, like sb.video
    for name in sb.nodes.__all__:
        assert issubclass(getattr(sb.nodes, name), tn.BaseNode)


# -- PipelineNode -----------------------------------------------------------------------
class NodeDataset(torch.utils.data.IterableDataset):
    """Iterates ``Loader(PipelineNode(pipe))``, built in each DataLoader worker."""

    def __init__(self, pipe):
        self.pipe = pipe

    def __iter__(self):
        return iter(Loader(sb.nodes.PipelineNode(self.pipe)))


def test_pipeline_node_reads_rank_and_world_from_torch_distributed(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    pipe = pipeline(60)
    got = [ids(b) for b in Loader(sb.nodes.PipelineNode(pipe))]
    assert got == [ids(b) for b in slot_batches(pipe, rank=1, world=2, worker=0, workers=1)]
    assert sb.nodes.PipelineNode(pipe).state_dict()["layout"]["world_size"] == 2


def test_pipeline_node_honours_the_dataloader_worker_split():
    pipe = sb.Pipeline(list(range(40))).batch(4)
    dl = torch.utils.data.DataLoader(NodeDataset(pipe), batch_size=None, num_workers=2)
    got = [ids(b) for b in dl]
    assert got == [ids(b) for b in merged_batches(pipe, rank=0, world=1, workers=2)]
    assert sorted(x for b in got for x in b) == list(range(40))


def test_pipeline_node_state_is_the_pipelines_own_format():
    ref = [ids(b) for b in pipeline()]
    node = sb.nodes.PipelineNode(pipeline())
    head = [ids(next(node)) for _ in range(5)]
    state = json.loads(json.dumps(node.state_dict()))
    assert state["kind"] == "streambuf.state" and not state["complete"]
    node.shutdown()
    pipe = pipeline()
    pipe.load_state_dict(state)  # a node's state resumes a plain Pipeline ...
    assert head + [ids(b) for b in pipe] == ref
    pipe = pipeline()
    it = iter(pipe)
    head = [ids(next(it)) for _ in range(3)]
    node = sb.nodes.PipelineNode(pipeline())
    node.reset(pipe.state_dict())  # ... and a Pipeline's state resumes a node
    it.close()
    assert head + [ids(b) for b in node] == ref
    assert node.state_dict()["complete"]


def test_pipeline_node_epochs_come_from_the_pipeline():
    pipe = pipeline()
    node = sb.nodes.PipelineNode(pipe)
    epoch0 = [ids(b) for b in Loader(node)]
    assert [ids(b) for b in Loader(node)] == epoch0  # reset() never advances the epoch
    node.reset()
    next(node)
    mid0 = node.state_dict()
    pipe.set_epoch(1)
    node.reset()
    epoch1 = [ids(b) for b in node]
    assert epoch1 != epoch0  # another shard order, the same samples
    assert sorted(x for b in epoch1 for x in b) == sorted(x for b in epoch0 for x in b)
    node.reset(mid0)  # a state restores its epoch
    assert pipe.epoch == 0
    assert [ids(b) for b in node] == epoch0[1:]


def test_pipeline_node_stops_its_stage_threads_on_shutdown_and_gc():
    pipe = sb.Pipeline(list(range(1000))).map(ids, threads=3).batch(4)
    node = sb.nodes.PipelineNode(pipe)
    next(node)
    assert _alive("streambuf-map") == 3
    node.shutdown()
    assert _alive("streambuf-map") == 0
    node.reset()
    next(node)
    del node
    gc.collect()
    assert wait_for_threads("streambuf-map", timeout_s=2.0) == []
