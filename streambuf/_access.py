"""The built-in ``Access`` kinds of a plain ``Pipeline`` (``streambuf._source``).

* ``ItemAccess``: every source item is a shard of one sample (index 0); fetching it
  again is ``source[i]``.
* ``ExpandAccess``: ``expand(shard)`` yields the shard's samples. A user function can
  only be entered at its start, so resuming at sample ``k`` (or fetching a sample back)
  re-runs it and skips ``k`` samples: cheap when ``expand`` is cheap, and the price of
  not knowing more. ``shards()`` and ``video.clips()`` bring accesses that seek.

Both are read inline (``threaded = False``): in the consumer's thread, one lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = ["ExpandAccess", "ItemAccess"]


class ItemAccess:
    threaded = False

    def __init__(self, source: Sequence[Any]) -> None:
        self.source = source

    def read(self, lane: int, shard: int, /, *, index: int, hint: Any) -> Iterator[tuple]:
        if index == 0:
            yield 0, None, None, self.source[shard]

    def fetch(self, shard: int, wanted: list[tuple[int, Any]], /) -> Iterator[tuple[int, Any]]:
        for index, _ in wanted:
            if index == 0:
                yield 0, self.source[shard]

    def close(self) -> None:
        pass


class ExpandAccess:
    threaded = False

    def __init__(self, source: Sequence[Any], expand: Callable[[Any], Iterable[Any]]) -> None:
        self.source = source
        self.expand = expand

    def read(self, lane: int, shard: int, /, *, index: int, hint: Any) -> Iterator[tuple]:
        for j, sample in enumerate(self.expand(self.source[shard])):
            if j >= index:
                yield j, None, None, sample

    def fetch(self, shard: int, wanted: list[tuple[int, Any]], /) -> Iterator[tuple[int, Any]]:
        want = {index for index, _ in wanted}
        last = max(want, default=-1)
        for j, sample in enumerate(self.expand(self.source[shard])):
            if j > last:
                return
            if j in want:
                yield j, sample

    def close(self) -> None:
        pass
