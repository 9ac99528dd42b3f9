"""Building a batch in place: the default collate, without holding the batch twice.

``default_collate`` gathers ``n`` samples and then stacks them: for a moment the batch
exists twice (the samples and the stacked copy). Here each tensor (or numpy array) leaf
of the first sample fixes the shape of a batch buffer allocated once, every sample is
copied into it on arrival and dropped, so the peak is the batch plus one sample. Inside
a DataLoader worker the buffer is allocated in shared memory, as ``default_collate``
does, so sending it to the main process copies nothing.

Plain ``int``, ``float`` and ``bool`` leaves (labels, indices) become a tensor in the
same buffer (int64, float64, bool: ``default_collate``'s dtypes), written at the end from
the gathered values: in a worker they travel in the batch arena's slot with the rest,
not as a tensor of their own (which torch would move to a fresh shared-memory segment,
a file and a descriptor per batch: it halved the batch rate of small batches). Other
leaves (strings, bytes, ...) are gathered in lists and given to ``default_collate`` at
the end, so the result equals ``default_collate`` of the same samples for
tensors/arrays/numbers in nested dicts, lists and tuples. Anything
else falls back to ``default_collate`` of the gathered samples; samples whose structure
or shapes differ within one batch are an error naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["Collator"]


class _Mismatch(Exception):
    pass


# plain values collated into the batch's buffer, with default_collate's dtypes
_SCALARS = {int: torch.int64, float: torch.float64, bool: torch.bool}


def _alloc(elem: torch.Tensor, n: int) -> torch.Tensor:
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None:
        storage = elem._typed_storage()._new_shared(n * elem.numel(), device=elem.device)
        return elem.new(storage).resize_(n, *elem.shape)
    return torch.empty((n, *elem.shape), dtype=elem.dtype, device=elem.device)


def _aligned(n: int) -> int:
    return (n + 63) // 64 * 64


class _Builder:
    """Holds the batch being built for one sample structure.

    Its tensor leaves are laid out together in one slot of the worker's batch arena when
    there is one (``streambuf._arena``), else each in fresh shared memory (in a worker)
    or ordinary memory (in process).
    """

    def __init__(self, first: Any, n: int) -> None:
        self.n = n
        self.count = 0
        self._leaves: list[list[Any]] = []
        self.template = self._plan(first, in_seq=False)
        self._allocate()

    def _plan(self, x: Any, *, in_seq: bool) -> Any:
        if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
            x = torch.from_numpy(x)
        if isinstance(x, torch.Tensor):
            leaf = ["t", x, x.shape, x.dtype]  # the sample stands in until _allocate
            self._leaves.append(leaf)
            return leaf
        dtype = _SCALARS.get(type(x))
        if dtype is not None:  # a tensor leaf of shape (), written from the values at the end
            leaf = ["t", torch.zeros((), dtype=dtype), (), dtype]
            self._leaves.append(leaf)
            return ("s", leaf, type(x), [], in_seq)
        if isinstance(x, dict):
            return ("d", {k: self._plan(v, in_seq=False) for k, v in x.items()})
        if isinstance(x, tuple | list) and not hasattr(x, "_fields"):
            return ("l", [self._plan(v, in_seq=True) for v in x])
        if isinstance(x, int | float | str | bytes | bool):
            return ("v", [], in_seq)
        raise _Mismatch

    def _allocate(self) -> None:
        from . import _arena

        cpu = all(leaf[1].device.type == "cpu" for leaf in self._leaves)
        sizes = [
            _aligned(self.n * leaf[1].numel() * leaf[1].element_size()) for leaf in self._leaves
        ]
        act = _arena.active() if cpu and self._leaves else None
        slot = act[0].allocate(act[1], sum(sizes)) if act is not None else None
        self._slot = (act[0], slot) if act is not None and slot is not None else None
        offset = 0
        for leaf, size in zip(self._leaves, sizes):
            elem = leaf[1]
            if act is not None and slot is not None:
                leaf[1] = act[0].tensor(slot, offset, elem.dtype, (self.n, *elem.shape))
                offset += size
            else:
                leaf[1] = _alloc(elem, self.n)
            leaf.append(leaf[1].unbind(0))  # the rows, as views, made in one call

    def add(self, x: Any) -> None:
        self._add(self.template, x, self.count)
        self.count += 1

    def explain(self, x: Any) -> str:
        """Where ``x`` differs from the batch's first sample (after ``add`` refused it):
        the slow path of an error message, never of a batch."""
        return _differs(self.template, x, "sample")

    def _add(self, plan: Any, x: Any, i: int) -> None:
        kind = plan[0]
        if kind == "t":
            if type(x) is not torch.Tensor:
                if isinstance(x, np.ndarray):
                    x = torch.from_numpy(x)
                if not isinstance(x, torch.Tensor):
                    raise _Mismatch
            if x.shape != plan[2] or x.dtype != plan[3]:
                raise _Mismatch
            plan[4][i].copy_(x)  # row i of the batch (views made once: ``_allocate``)
        elif kind == "d":
            if not isinstance(x, dict) or x.keys() != plan[1].keys():
                raise _Mismatch
            for k, sub in plan[1].items():
                if sub[0] == "v":  # a plain value, gathered here (no call per field)
                    sub[1].append(x[k])
                elif sub[0] == "s":
                    sub[3].append(x[k])
                else:
                    self._add(sub, x[k], i)
        elif kind == "l":
            if not isinstance(x, tuple | list) or len(x) != len(plan[1]):
                raise _Mismatch
            for sub, v in zip(plan[1], x):
                self._add(sub, v, i)
        elif kind == "s":
            plan[3].append(x)
        else:
            plan[1].append(x)

    def result(self) -> Any:
        if self._slot is not None:
            self._slot[0].produced(self._slot[1])
        return self._result(self.template)

    def _result(self, plan: Any) -> Any:
        kind = plan[0]
        if kind == "t":
            return plan[1] if self.count == self.n else plan[1][: self.count]
        if kind == "s":
            values, want = plan[3], plan[2]
            if all(type(v) is want for v in values):
                out = plan[1][1] if self.count == self.n else plan[1][1][: self.count]
                out.copy_(torch.tensor(values, dtype=out.dtype))
                return out
            plan = ("v", values, plan[4])  # mixed types: default_collate's own promotion
        if kind == "d":
            return {k: self._result(v) for k, v in plan[1].items()}
        if kind == "l":  # default_collate turns tuples and lists of samples into lists
            return [self._result(v) for v in plan[1]]
        from torch.utils.data import default_collate

        # default_collate sees a tuple (from zip) inside sequences, a list inside dicts
        leaves: Any = tuple(plan[1]) if plan[2] else plan[1]
        return default_collate(leaves)


def _differs(plan: Any, x: Any, where: str) -> str:
    """The first difference between ``x`` and a ``_Builder`` plan, named by its path."""
    kind = plan[0]
    if kind == "t":
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if not isinstance(x, torch.Tensor):
            return f"{where} is a {type(x).__name__}, the first's a tensor"
        if x.shape != plan[2]:
            return f"{where} has shape {tuple(x.shape)}, the first's {tuple(plan[2])}"
        if x.dtype != plan[3]:
            return f"{where} has dtype {x.dtype}, the first's {plan[3]}"
    elif kind == "d":
        if not isinstance(x, dict):
            return f"{where} is a {type(x).__name__}, the first's a dict"
        if x.keys() != plan[1].keys():
            extra, missing = (
                sorted(map(str, x.keys() - plan[1].keys())),
                sorted(map(str, plan[1].keys() - x.keys())),
            )
            return f"{where} has keys {extra or '-'} more and {missing or '-'} fewer"
        for k, sub in plan[1].items():
            if sub[0] in ("t", "d", "l"):
                got = _differs(sub, x[k], f"{where}[{k!r}]")
                if got:
                    return got
    elif kind == "l":
        if not isinstance(x, tuple | list):
            return f"{where} is a {type(x).__name__}, the first's a sequence"
        if len(x) != len(plan[1]):
            return f"{where} has {len(x)} elements, the first {len(plan[1])}"
        for j, (sub, v) in enumerate(zip(plan[1], x)):
            got = _differs(sub, v, f"{where}[{j}]")
            if got:
                return got
    return ""


class Collator:
    """One batch of at most ``n`` samples: ``add`` each, then ``result()``.

    ``collate=None``: in place, equal to ``default_collate`` (see module docstring);
    otherwise the samples are gathered and ``collate(list)`` is called at the end.
    """

    def __init__(self, n: int, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.n = n
        self.count = 0
        self._collate = collate
        self._builder: _Builder | None = None
        self._held: list[Any] = []

    def add(self, x: Any) -> None:
        if self._collate is None and self.count == 0:
            try:
                self._builder = _Builder(x, self.n)
            except _Mismatch:
                self._builder = None
        if self._builder is not None:
            try:
                self._builder.add(x)
            except _Mismatch:
                raise ValueError(
                    f"batch(): sample {self.count} of the batch differs from its first: "
                    f"{self._builder.explain(x)}; make the samples alike (resize, pad, "
                    "crop in a map before batch()) or pass collate= to batch them your way"
                ) from None
        else:
            self._held.append(x)
        self.count += 1

    def result(self) -> Any:
        if self._builder is not None:
            return self._builder.result()
        if self._collate is not None:
            return self._collate(self._held)
        from torch.utils.data import default_collate

        return default_collate(self._held)
