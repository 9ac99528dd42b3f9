"""Real torch.distributed (gloo, loopback): 2 ranks, each a Loader with 2 workers."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

from streambuf import Pipeline
from tests.helpers import merged_batches
from tests.pipeline_data import all_samples, ids_of, shard_samples, shard_size

pytestmark = pytest.mark.timeout(180)


def make_pipe(equalize, **rank_world):
    return (
        Pipeline(
            list(range(7)),
            expand=shard_samples,
            shuffle_shards=True,
            seed=5,
            samples_per_shard=[shard_size(s) for s in range(7)],
            equalize=equalize,
            **rank_world,
        )
        .shuffle(8)
        .batch(3)
    )


def reference(equalize, rank, world=2):
    pipe = make_pipe(equalize, rank=rank, world_size=world)
    return [ids_of(b) for b in merged_batches(pipe, rank=rank, world=world, workers=2)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, equalize, out, early=False) -> None:
    try:
        _rank_body(rank, world, port, equalize, out, early)
    except BaseException as exc:  # report instead of leaving the parent waiting
        out.put((rank, repr(exc), -1, []))
        raise


def _rank_body(rank: int, world: int, port: int, equalize, out, early: bool) -> None:
    import torch
    import torch.distributed as dist

    from streambuf import Loader

    if early:  # built before the process group exists: must still shard per rank
        pipe = make_pipe(equalize)
        loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=60)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        if not early:
            pipe = make_pipe(equalize)
            loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=60)
        ids, steps = [], 0
        for batch in loader:
            ids.append([int(x) for x in batch])
            steps += 1
            t = torch.ones(1)
            dist.all_reduce(t)  # a DDP step: hangs if ranks disagree on the batch count
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([steps]))
        out.put((rank, ids, steps, [int(c) for c in counts]))
    finally:
        dist.destroy_process_group()


def run_ranks(equalize, early=False):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, port, equalize, out, early)) for r in range(2)
    ]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    assert all(r[2] >= 0 for r in results), results
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("equalize", ["pad", "drop"])
def test_two_ranks_equal_counts_and_exact_data(equalize):
    """Unequal counts (equalize=None) would hang the all_reduce, as in DDP. Each real
    rank's batches equal the in-process reference for that rank (whose exact equalize
    contents tests/test_sharding.py checks); pad covers every sample, drop none twice."""
    results = run_ranks(equalize)
    for rank, batches, steps, counts in results:
        assert batches == reference(equalize, rank), rank
        assert counts == [results[0][2], results[1][2]] and steps == len(batches)
    assert results[0][2] == results[1][2]
    ids = [x for _, batches, _, _ in results for b in batches for x in b]
    if equalize == "pad":
        assert set(ids) == set(all_samples(7))
    else:
        assert len(ids) == len(set(ids)) and set(ids) <= set(all_samples(7))


def test_loader_built_before_init_process_group_shards_per_rank():
    """The Loader (and its Pipeline) built before init_process_group: rank and world size
    are read when the iteration starts, so each rank reads only its share."""
    results = run_ranks("pad", early=True)
    for rank, batches, _, _ in results:
        assert batches == reference("pad", rank), rank
    ids = [x for _, batches, _, _ in results for b in batches for x in b]
    assert set(ids) == set(all_samples(7))
    assert len(ids) < 2 * len(all_samples(7))  # not every rank reading everything


def _elastic_rank(rank, world, port, states, out):
    try:
        import torch.distributed as dist

        from tests.resume_data import plain_loader

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        try:
            loader = plain_loader(workers=2)  # rank and world from torch.distributed
            loader.load_state_dict(states)
            ids = [x for b in loader for x in ids_of(b)]
            gathered: list = [None] * world
            dist.all_gather_object(gathered, ids)
            out.put((rank, gathered))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        out.put((rank, repr(exc)))
        raise


def test_elastic_resume_on_real_ranks():
    """3 ranks (simulated) stop mid-epoch and save one state each; 2 real gloo ranks load
    the list and finish the epoch: every sample exactly once over both runs."""
    from tests.resume_data import N_SHARDS, plain_loader
    from tests.resume_harness import counted_once, save_after

    delivered, states = [], []
    for rank in range(3):
        first, state = save_after(plain_loader, {"workers": 2, "rank": rank, "world": 3}, 2)
        delivered += [x for b in first for x in b]
        states.append(state)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_elastic_rank, args=(r, 2, port, states, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted((out.get(timeout=150) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(30)
    assert all(isinstance(g, list) for _, g in results), results
    per_rank = results[0][1]
    assert per_rank == results[1][1] and len(per_rank) == 2
    assert per_rank[0] and per_rank[1], "each new rank takes a share"
    counted_once(delivered + [x for ids in per_rank for x in ids], all_samples(N_SHARDS))
