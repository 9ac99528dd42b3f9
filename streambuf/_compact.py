"""``StrList``: a read-only list of strings in two flat buffers (copy-on-write safe).

A list of 100,000 URL strings is 100,000 Python objects. A forked DataLoader worker
shares their pages with its parent, but every time it reads one it writes the object's
reference count, so the page is copied: over an epoch each worker ends up with its own
copy of the whole list (pytorch/pytorch#13246). ``StrList`` keeps the UTF-8 bytes of all
strings in one ``bytes`` object and their offsets in a numpy array: reading builds a new
``str`` and touches no shared object, so shared pages stay shared; pickled (spawn), it is
two buffers, not 100,000 objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["IndexedStrList", "StrList"]


class StrList(Sequence[str]):
    """The strings of ``items``, compact and immutable (see the module docstring)."""

    def __init__(self, items: Iterable[str]) -> None:
        encoded = [s.encode("utf-8", "surrogateescape") for s in items]
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self._offsets[1:])
        self._blob = b"".join(encoded)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"StrList index {i} out of range for {n} items")
        a, b = int(self._offsets[i]), int(self._offsets[i + 1])
        return self._blob[a:b].decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:3])
        return f"StrList([{head}{', ...' if len(self) > 3 else ''}] ({len(self)} items))"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._blob, self._offsets))


def _rebuild(blob: bytes, offsets: np.ndarray) -> StrList:
    out = StrList.__new__(StrList)
    out._blob, out._offsets = blob, offsets
    return out


class IndexedStrList(Sequence[tuple[int, str]]):
    """``(i, strings[i])`` pairs over a ``StrList`` (a video pipeline's shards)."""

    def __init__(self, strings: StrList) -> None:
        self.strings = strings

    def __len__(self) -> int:
        return len(self.strings)

    def __getitem__(self, i: int) -> tuple[int, str]:  # type: ignore[override]
        if i < 0:
            i += len(self)
        return i, self.strings[i]
