"""``Prefetcher``: a drop-in for ``torchdata.nodes.Prefetcher`` whose depth is bounded by
bytes as well as items.

One thread pulls from the source ahead of the consumer, reserving room for each item
before it pulls it, so the item being pulled counts too: ``max_items=k`` holds what
``prefetch_factor=k`` holds, at most ``max_bytes`` of it. Mechanism and state:
``streambuf.nodes._run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torchdata.nodes import BaseNode

from ..sizing import nbytes
from .map import _ThreadedNode

__all__ = ["Prefetcher"]

T = TypeVar("T")


class Prefetcher(_ThreadedNode[T]):
    """Prefetch ``source`` on a background thread into a byte- and count-bounded buffer.

    Args:
        source: the upstream node.
        max_items: items held at most, including the one being pulled (>= 1).
        max_bytes: bytes held at most (int or "1GiB"); an item larger than this is
            admitted alone and counted in ``stats().oversize``.
        sizeof: bytes of one item; ``streambuf.nbytes`` by default.
        join_timeout_s: how long ``reset``/``shutdown`` wait for the thread.

    State: the source's state as of the last item returned; prefetched items are pulled
    again on resume.
    """

    def __init__(
        self,
        source: BaseNode[T],
        /,
        *,
        max_items: int,
        max_bytes: int | str,
        sizeof: Callable[[Any], int] = nbytes,
        join_timeout_s: float = 1.0,
    ) -> None:
        super().__init__(
            source,
            None,
            threads=1,
            in_order=True,
            max_items=max_items,
            max_bytes=max_bytes,
            sizeof=sizeof,
            name="Prefetcher",
            join_timeout_s=join_timeout_s,
        )
