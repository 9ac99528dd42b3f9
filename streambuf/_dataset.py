"""Map-style datasets as pipeline sources (``Pipeline(dataset)``, ``Pipeline.from_dataset``).

A map-style dataset (``__len__`` and ``__getitem__``, as a ``torch.utils.data.Dataset``
for a ``DataLoader``) is not a ``collections.abc.Sequence``: iterated, it goes on through
the legacy ``__getitem__`` protocol until an ``IndexError`` that many datasets never
raise, and a one-shot iterable is read whole by every worker. ``DatasetItems`` is the
dataset seen as a ``Sequence`` (its length, each index bounds-checked before
``dataset[i]`` is called), so a pipeline splits its indices over rank x worker like any
list of items: each index ``0 .. len - 1`` read once per epoch over all ranks and
workers, never one past the end, resumable. ``DatasetIndices`` is the same view of the
indices alone, and ``GetItem`` the ``dataset[i]`` a threaded map calls
(``from_dataset(threads=)``). All three pickle with the dataset (to worker processes).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, overload

from torch.utils.data import Dataset, IterableDataset

__all__ = ["DatasetIndices", "DatasetItems", "GetItem", "dataset_length", "is_map_style"]


def is_map_style(source: Any) -> bool:
    """Whether ``Pipeline(source)`` reads ``source`` by index (``DatasetItems``): a
    ``torch.utils.data.Dataset`` with ``__len__`` and ``__getitem__`` that is not an
    ``IterableDataset`` (nor a ``Sequence`` or ``Mapping``: read as they are). Other
    objects with both are left to iteration: ``x[i]`` is not always the i-th item (a
    ``pandas.Series`` indexes by label, a ``DataFrame`` by column);
    ``Pipeline.from_dataset`` reads any of them by index when asked to."""
    kind = type(source)
    return (
        isinstance(source, Dataset)
        and hasattr(kind, "__len__")
        and hasattr(kind, "__getitem__")
        and not isinstance(source, Sequence | Mapping | IterableDataset)
    )


def check_dataset(dataset: Any) -> None:
    """Refuse what ``Pipeline.from_dataset`` cannot read by index, saying what it needs."""
    if isinstance(dataset, IterableDataset):
        raise TypeError(
            f"from_dataset() needs a map-style dataset (__len__ and __getitem__), got the "
            f"IterableDataset {type(dataset).__name__}; for an iterable use "
            "sb.Pipeline(iterable)"
        )
    if isinstance(dataset, str | bytes | bytearray):
        raise TypeError(
            "from_dataset() needs a map-style dataset (__len__ and __getitem__), not a string"
        )
    missing = [m for m in ("__len__", "__getitem__") if not hasattr(type(dataset), m)]
    if missing:
        raise TypeError(
            f"from_dataset() needs a map-style dataset: an object with __len__ and "
            f"__getitem__ (dataset[i] for i in range(len(dataset))); "
            f"{type(dataset).__name__} has no {' or '.join(missing)}; for an iterable "
            "(a generator, an IterableDataset) use sb.Pipeline(iterable)"
        )
    dataset_length(dataset)


def dataset_length(dataset: Any) -> int:
    """``len(dataset)``, which must be an int >= 0 (``ValueError`` or ``TypeError`` naming
    the dataset otherwise)."""
    try:
        return len(dataset)
    except (TypeError, ValueError, OverflowError) as exc:
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(
            f"len(dataset) must be an int >= 0 for the dataset {type(dataset).__name__}: {exc}"
        ) from exc


def _position(i: Any, n: int) -> int:
    """Index ``i`` of a sequence of ``n`` items as ``0 <= i < n`` (negative from the end),
    or ``IndexError``; ``TypeError`` for what is not an index."""
    if isinstance(i, bool):
        raise TypeError(f"indices must be integers, not bool ({i!r})")
    j = operator.index(i)
    if j < 0:
        j += n
    if not 0 <= j < n:
        raise IndexError(f"index {i} out of range for a dataset of {n} items")
    return j


class DatasetItems(Sequence[Any]):
    """``dataset`` as a ``Sequence``: ``len(dataset)`` items, item ``i`` is ``dataset[i]``
    (``i`` checked against the length first: ``IndexError`` past it, whatever
    ``dataset[i]`` would do; negative indices count from the end; a slice is a list)."""

    def __init__(self, dataset: Any) -> None:
        dataset_length(dataset)
        self.dataset = dataset

    def __len__(self) -> int:
        return dataset_length(self.dataset)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self.dataset[j] for j in range(len(self))[i]]
        return self.dataset[_position(i, len(self))]

    def __repr__(self) -> str:
        return f"DatasetItems({type(self.dataset).__name__}, {len(self)} items)"


class DatasetIndices(Sequence[int]):
    """The indices ``0 .. len(dataset) - 1`` as a ``Sequence`` that follows the dataset's
    length (``from_dataset(threads=)``: ``GetItem`` reads them on a map's threads)."""

    def __init__(self, dataset: Any) -> None:
        dataset_length(dataset)
        self.dataset = dataset

    def __len__(self) -> int:
        return dataset_length(self.dataset)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return list(range(len(self))[i])
        return _position(i, len(self))

    def __repr__(self) -> str:
        return f"DatasetIndices({type(self.dataset).__name__}, {len(self)} items)"


class GetItem:
    """``dataset[i]``: the function ``from_dataset(threads=)`` maps over the indices
    (module level, so it pickles to worker processes with the dataset)."""

    __name__ = "getitem"  # the stage's name in stats and reports: map(getitem)

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, i: int) -> Any:
        return self.dataset[i]

    def __repr__(self) -> str:
        return f"GetItem({type(self.dataset).__name__})"
