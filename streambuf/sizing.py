"""``nbytes(obj)``: how many bytes an object holds in memory.

This is what byte budgets count. Rules:

* ``torch.Tensor``: the bytes of its *storage* (a view holds its whole storage alive),
  and within one call each storage is counted once (two views of one tensor in one
  batch count once).
* ``numpy.ndarray``: the bytes of the buffer it owns or views (its ``base`` chain), each
  buffer once per call.
* ``bytes``/``bytearray``/``memoryview``: their length (a memoryview counts the buffer it
  views once); ``str``: ``sys.getsizeof``; numbers and ``None``: ``sys.getsizeof``.
* ``dict``/``list``/``tuple``/``set``/``frozenset`` and dataclasses: the sum of their
  contents (keys too), recursively, without the container's own small overhead.
* Anything else: ``sys.getsizeof(obj)`` (a documented estimate; never raises), or
  whatever was registered with ``nbytes.register(SomeType)(fn)``. A registered ``fn``
  takes ``(obj)`` and returns an int.

Speed: ``nbytes.exact`` maps an object's *exact* type to its sizer for the cheap, common
cases (the scalars, ``str``, ``bytes``, ``bytearray``, and ``torch.Tensor`` once one has
been sized while nothing is registered for it), so those skip the dispatch below; the
numbers are the same. ``BoundedBuffer`` looks items up there directly.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, cast

__all__ = ["nbytes"]

_Sizer = Callable[[Any], int]

_SCALARS = (bool, int, float, complex, type(None))
_BYTES = (bytes, bytearray)


def _getsizeof_exact() -> dict[type, _Sizer]:
    """``sys.getsizeof`` for the exact scalar types and ``str`` (sized so before any
    registry lookup): ``type.__sizeof__`` where it gives the same number (no GC header:
    CPython), many times cheaper than ``getsizeof``'s special-method lookup."""
    table: dict[type, _Sizer] = {}
    for sample in (True, 1, 1.0, 1j, None, "s"):
        cls: type = type(sample)
        direct = cast(_Sizer, cls.__sizeof__)  # unbound: direct(obj)
        same = sys.getsizeof(sample) == direct(sample)
        table[cls] = direct if same else sys.getsizeof
    return table


_EXACT: dict[type, _Sizer] = {**_getsizeof_exact(), bytes: len, bytearray: len}


class _NBytes:
    """Callable registry: ``nbytes(obj)`` and ``nbytes.register(cls)(fn)``."""

    def __init__(self) -> None:
        self._registry: dict[type, _Sizer] = {}
        self._cache: dict[type, _Sizer | None] = {}
        #: exact type -> sizer giving what ``_size`` gives an object of that type alone
        #: (one dict, changed in place: holders of it see ``register``'s changes)
        self.exact: dict[type, _Sizer] = {}
        self._reset_exact()

    def __reduce_ex__(self, protocol: Any) -> Any:
        """The package's ``nbytes`` pickles by name (a spawned worker uses its own, with
        the sizers registered when its modules are imported), so a sizer registered
        here (a lambda, a local function) never makes a pipeline unpicklable."""
        if self is nbytes:
            return "nbytes"
        return super().__reduce_ex__(protocol)

    def _reset_exact(self) -> None:
        self.exact.clear()
        self.exact.update(_EXACT)

    def register(self, cls: type) -> Callable[[_Sizer], _Sizer]:
        """Register ``fn(obj) -> int`` as the size of instances of ``cls`` (and subclasses)."""

        def deco(fn: _Sizer) -> _Sizer:
            self._registry[cls] = fn
            self._cache.clear()
            self._reset_exact()
            return fn

        return deco

    def _lookup(self, cls: type) -> _Sizer | None:
        try:
            return self._cache[cls]
        except KeyError:
            pass
        found: _Sizer | None = None
        for base in cls.__mro__:
            if base in self._registry:
                found = self._registry[base]
                break
        self._cache[cls] = found
        return found

    def __call__(self, obj: Any) -> int:
        """Bytes held by ``obj``; shared storages/buffers inside it are counted once."""
        fast = self.exact.get(type(obj))
        if fast is not None:
            return fast(obj)
        return _size(obj, set(), self)


nbytes = _NBytes()


def _size(obj: Any, seen: set[int], reg: _NBytes) -> int:
    if isinstance(obj, _SCALARS):
        return sys.getsizeof(obj)
    if isinstance(obj, _BYTES):
        return len(obj)
    if isinstance(obj, str):
        return sys.getsizeof(obj)
    custom = reg._lookup(type(obj))
    if custom is not None:
        return int(custom(obj))
    mod = type(obj).__module__
    if mod.startswith("torch"):
        size = _torch_size(obj, seen)
        if size is not None:
            if type(obj).__name__ == "Tensor" and mod == "torch":  # exact torch.Tensor:
                reg.exact.setdefault(type(obj), _one_tensor_size)  # no registry entry
            return size
    if mod.startswith("numpy"):
        size = _numpy_size(obj, seen)
        if size is not None:
            return size
    if isinstance(obj, memoryview):
        key = id(obj.obj) if obj.obj is not None else id(obj)
        if key in seen:
            return 0
        seen.add(key)
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_size(k, seen, reg) + _size(v, seen, reg) for k, v in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return sum(_size(x, seen, reg) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_size(getattr(obj, f.name), seen, reg) for f in dataclasses.fields(obj))
    try:
        return sys.getsizeof(obj)
    except Exception:  # objects whose __sizeof__ is broken still get a size
        return 64


def _torch_size(obj: Any, seen: set[int]) -> int | None:
    import torch

    if not isinstance(obj, torch.Tensor):
        return None
    try:
        storage = obj.untyped_storage()
        key = storage.data_ptr() or id(storage)
        nb = storage.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse/meta tensors have no plain storage
        return obj.element_size() * obj.nelement()
    if key in seen:
        return 0
    seen.add(key)
    return int(nb)


def _one_tensor_size(obj: Any) -> int:
    """``_torch_size`` of a tensor sized alone (nothing seen yet), without the dispatch."""
    try:
        return obj.untyped_storage().nbytes()  # (an int already: no int() per item)
    except (RuntimeError, NotImplementedError):  # as in _torch_size
        return int(obj.element_size() * obj.nelement())


def _numpy_size(obj: Any, seen: set[int]) -> int | None:
    import numpy as np

    if isinstance(obj, np.generic):
        return int(obj.nbytes)
    if not isinstance(obj, np.ndarray):
        return None
    root: Any = obj
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, np.ndarray):
        key, nb = id(root), int(root.nbytes)
    else:  # viewing a foreign buffer (bytes, mmap, tensor): count what this array spans
        key, nb = id(root), int(obj.nbytes)
    if key in seen:
        return 0
    seen.add(key)
    return nb
