"""Real torch.distributed (gloo, loopback): 2 ranks, each a Loader with 2 workers."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

from tests.pipeline_data import all_samples

pytestmark = pytest.mark.timeout(180)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, equalize, out) -> None:
    try:
        _rank_body(rank, world, port, equalize, out)
    except BaseException as exc:  # report instead of leaving the parent waiting
        out.put((rank, repr(exc), -1, []))
        raise


def _rank_body(rank: int, world: int, port: int, equalize, out) -> None:
    import torch
    import torch.distributed as dist

    from streambuf import Loader, Pipeline
    from tests.pipeline_data import shard_samples, shard_size

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        pipe = (
            Pipeline(
                list(range(7)),
                expand=shard_samples,
                shuffle_shards=True,
                seed=5,
                samples_per_shard=[shard_size(s) for s in range(7)],
                equalize=equalize,
            )
            .shuffle(8)
            .batch(3)
        )
        loader = Loader(pipe, num_workers=2, max_batches=4, max_bytes="1MiB", timeout_s=60)
        ids, steps = [], 0
        for batch in loader:
            ids += [int(x) for x in batch]
            steps += 1
            t = torch.ones(1)
            dist.all_reduce(t)  # a DDP step: hangs if ranks disagree on the batch count
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([steps]))
        out.put((rank, ids, steps, [int(c) for c in counts]))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("equalize", ["pad"])
def test_two_ranks_exactly_once(equalize):
    """Unequal counts (equalize=None) would hang the all_reduce, as in DDP; see
    tests/test_loader.py for exactly-once without equalize."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, equalize, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    assert all(r[2] >= 0 for r in results), results
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    ids = [x for _, got, _, _ in results for x in got]
    assert set(ids) == set(all_samples(7))
    steps = [s for _, _, s, _ in results]
    assert steps[0] == steps[1]
    assert results[0][3] == results[1][3] == steps


def test_two_ranks_exactly_once_drop():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, 2, port, "drop", out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    assert all(r[2] >= 0 for r in results), results
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    ids = [x for _, got, _, _ in results for x in got]
    assert len(ids) == len(set(ids)) and set(ids) <= set(all_samples(7))
    assert results[0][2] == results[1][2]
