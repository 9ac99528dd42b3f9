"""Small ``Iterator -> Iterator`` stages: map (threads), filter, shuffle, batch, prefetch.

Each is a plain generator function: the data argument positional-only, options
keyword-only. They hold no state between calls, so a pipeline is a list of them; every
bounded stage states what it may hold.

* ``map_items``: with ``threads > 1`` runs ``fn`` on a thread pool through a
  ``Prefetcher`` (bounded by ``max_items`` and ``max_bytes`` of *results*); ordered by
  default. This is where latency-bound work gets concurrency without more processes.
* ``shuffle_items``: a reservoir of at most ``buffer_items`` items and ``max_bytes`` bytes;
  when either bound is reached one random item leaves. Seeded: the output order is a
  function of the input order and the seed.
* ``batch_items``: lists of ``n`` items passed to ``collate`` (``default_collate`` unless
  given); the last short batch is kept unless ``drop_last``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._collate import batch_in_place
from ._units import parse_bytes, parse_count
from .errors import add_note
from .prefetch import Prefetcher
from .sizing import nbytes

__all__ = [
    "batch_items",
    "describe",
    "filter_items",
    "flatten_items",
    "map_items",
    "prefetch_items",
    "shuffle_items",
]


def describe(item: Any) -> str:
    """A short description of an item for error notes: its shard/key when it has one."""
    if isinstance(item, dict):
        url, key = item.get("__url__"), item.get("__key__")
        if url is not None or key is not None:
            return f"sample {key!r} of shard {url!r}"
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def _stage_name(kind: str, fn: Callable[..., Any]) -> str:
    return f"{kind}({getattr(fn, '__name__', type(fn).__name__)})"


def map_items(
    it: Iterable[Any],
    fn: Callable[[Any], Any],
    /,
    *,
    threads: int = 1,
    ordered: bool = True,
    max_items: int | None = None,
    max_bytes: int | str = "256MiB",
) -> Iterator[Any]:
    """Yield ``fn(x)`` for each ``x``; with ``threads > 1`` on a bounded thread pool.

    Args:
        threads: worker threads; 1 runs inline (no thread, no buffer).
        ordered: keep input order (True) or yield results as they finish.
        max_items: results held ahead at most, including those being made; default
            ``threads`` (one per thread: each thread makes its next result only once
            its previous one was taken).
        max_bytes: bytes of results held ahead at most.

    Raises:
        Whatever ``fn`` raises, with a note naming the stage and the item.
    """
    name = _stage_name("map", fn)
    threads = parse_count(threads, name="threads")
    if threads == 1:
        for x in it:
            try:
                yield fn(x)
            except Exception as exc:
                add_note(exc, f"streambuf: raised in stage {name!r} on {describe(x)}")
                raise
        return

    def call(x: Any) -> Any:
        try:
            return fn(x)
        except Exception as exc:
            add_note(exc, f"streambuf: raised in stage {name!r} on {describe(x)}")
            raise

    depth = max_items if max_items is not None else threads
    with Prefetcher(
        it,
        max_items=max(depth, threads),
        max_bytes=max_bytes,
        threads=threads,
        fn=call,
        ordered=ordered,
        name=name,
    ) as pf:
        yield from pf


def flatten_items(it: Iterable[Iterable[Any]], /) -> Iterator[Any]:
    """Yield the elements of each item, in order."""
    for x in it:
        yield from x


def filter_items(it: Iterable[Any], fn: Callable[[Any], bool], /) -> Iterator[Any]:
    """Yield the items for which ``fn(item)`` is true."""
    name = _stage_name("filter", fn)
    for x in it:
        try:
            keep = fn(x)
        except Exception as exc:
            add_note(exc, f"streambuf: raised in stage {name!r} on {describe(x)}")
            raise
        if keep:
            yield x


def shuffle_items(
    it: Iterable[Any],
    buffer_items: int,
    /,
    *,
    max_bytes: int | str | None = None,
    seed: int = 0,
    sizeof: Callable[[Any], int] = nbytes,
) -> Iterator[Any]:
    """Bounded shuffle: hold up to ``buffer_items`` items (and ``max_bytes``), emit randomly.

    Deterministic for a given input order and ``seed``.
    """
    parse_count(buffer_items, name="buffer_items")
    limit = parse_bytes(max_bytes) if max_bytes is not None else None
    rng = random.Random(seed)
    pool: list[Any] = []
    sizes: list[int] = []
    held = 0
    for x in it:
        size = sizeof(x) if limit is not None else 0
        pool.append(x)
        sizes.append(size)
        held += size
        while pool and (len(pool) >= buffer_items or (limit is not None and held > limit)):
            i = rng.randrange(len(pool))
            pool[i], pool[-1] = pool[-1], pool[i]
            sizes[i], sizes[-1] = sizes[-1], sizes[i]
            held -= sizes.pop()
            yield pool.pop()
    rng.shuffle(pool)
    yield from pool


def batch_items(
    it: Iterable[Any],
    n: int,
    /,
    *,
    collate: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
) -> Iterator[Any]:
    """Group items into lists of ``n`` and yield ``collate(list)``.

    Without ``collate``, batches equal ``default_collate``'s but are built in place
    (``streambuf._collate``): the batch is never held twice.
    """
    parse_count(n, name="batch_size")
    if collate is None:
        yield from batch_in_place(it, n, drop_last=drop_last)
        return
    batch: list[Any] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield collate(batch)
            batch = []
    if batch and not drop_last:
        yield collate(batch)


def prefetch_items(
    it: Iterable[Any], /, *, max_items: int, max_bytes: int | str, threads: int = 1
) -> Iterator[Any]:
    """Run the upstream stages ahead on a background thread, bounded by items and bytes."""
    pf: Prefetcher[Any]
    with Prefetcher(it, max_items=max_items, max_bytes=max_bytes, threads=threads) as pf:
        yield from pf
