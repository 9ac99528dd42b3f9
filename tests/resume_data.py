"""Loader factories for the checkpoint tests (module level: a spawned process builds
the same loader from the same arguments)."""

from __future__ import annotations

from streambuf import Loader, Pipeline
from tests.pipeline_data import shard_samples, shard_size, sleepy

N_SHARDS = 8


def plain_pipe(*, equalize=None, rank=None, world=None, shuffle=6, threads=3, batch=3, n=N_SHARDS):
    kw = {} if rank is None else {"rank": rank, "world_size": world}
    pipe = Pipeline(
        list(range(n)),
        expand=shard_samples,
        shuffle_shards=True,
        seed=11,
        samples_per_shard=[shard_size(s) for s in range(n)],
        equalize=equalize,
        **kw,
    ).map(sleepy, threads=threads)
    if shuffle:
        pipe = pipe.shuffle(shuffle)
    return pipe.batch(batch)


def plain_loader(
    *,
    workers=2,
    persistent=False,
    mp_context=None,
    equalize=None,
    rank=None,
    world=None,
    in_order=True,
    n=N_SHARDS,
):
    pipe = plain_pipe(equalize=equalize, rank=rank, world=world, n=n)
    return Loader(
        pipe,
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="2MiB",
        persistent_workers=persistent,
        multiprocessing_context=mp_context,
        in_order=in_order,
        timeout_s=60,
    )
