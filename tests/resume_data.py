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


def tag(source):
    """Marks a sample with its source (module level: picklable)."""
    return _Tag(source)


class _Tag:
    def __init__(self, source: int) -> None:
        self.source = source

    def __call__(self, x: int) -> int:
        return self.source * 10_000 + int(x)


def mixed_pipe(*, stop="all_exhausted", weights=(0.7, 0.3), sizes=(8, 4), rank=None, world=None):
    from streambuf import mix

    kw = {} if rank is None else {"rank": rank, "world_size": world}
    a = Pipeline(list(range(sizes[0])), expand=shard_samples, shuffle_shards=True, seed=1, **kw)
    b = Pipeline(list(range(sizes[1])), expand=shard_samples, seed=2, **kw)
    return mix([a.map(tag(1), threads=2), b.map(tag(2))], weights=list(weights), seed=9, stop=stop)


def mixed_loader(*, workers=2, stop="all_exhausted", shuffle=5, weights=(0.7, 0.3), sizes=(8, 4)):
    pipe = mixed_pipe(stop=stop, weights=weights, sizes=sizes)
    if shuffle:
        pipe = pipe.shuffle(shuffle)
    return Loader(
        pipe.batch(4),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="2MiB",
        timeout_s=60,
    )


def _double(x):
    return x * 2


def cheap_pipe(*, n_items=4000, threads=4):
    """A cheap map on threads over enough items that ``adaptive`` goes inline mid-epoch
    (and its re-check brings the threads back): resume must not see the difference."""
    return (
        Pipeline(list(range(n_items)), shuffle_shards=True, seed=3)
        .map(_double, threads=threads)
        .shuffle(7)
        .batch(50)
    )
