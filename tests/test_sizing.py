from __future__ import annotations

import dataclasses
import sys

import numpy as np
import torch

from streambuf import nbytes


def test_tensor_counts_storage():
    t = torch.zeros(1000, dtype=torch.float32)
    assert nbytes(t) == 4000
    assert nbytes(t[:10]) == 4000  # a view keeps the whole storage alive


def test_tensor_views_of_one_storage_count_once():
    t = torch.zeros(1000, dtype=torch.float64)
    assert nbytes([t[:10], t[10:], t]) == 8000
    assert nbytes({"a": t, "b": t.view(10, 100)}) == 8000 + nbytes("a") + nbytes("b")
    # two separate calls count independently
    assert nbytes(t) + nbytes(t) == 16000


def test_two_storages_count_twice():
    assert nbytes((torch.zeros(10), torch.zeros(10))) == 80


def test_numpy_buffer_and_views():
    a = np.zeros((100, 10), dtype=np.int16)
    assert nbytes(a) == 2000
    assert nbytes(a[:5]) == 2000
    assert nbytes([a, a[1:], a.T]) == 2000
    assert nbytes(np.float32(1.0)) == 4


def test_numpy_view_of_foreign_buffer():
    raw = bytes(400)
    a = np.frombuffer(raw, dtype=np.uint8)
    assert nbytes(a) == 400


def test_bytes_like_and_scalars():
    assert nbytes(b"abc") == 3
    assert nbytes(bytearray(10)) == 10
    buf = bytearray(100)
    assert nbytes(memoryview(buf)) == 100
    assert nbytes([memoryview(buf), memoryview(buf)[10:]]) == 100
    assert nbytes("héllo") == sys.getsizeof("héllo")
    assert nbytes(3) == sys.getsizeof(3)
    assert nbytes(2.5) == sys.getsizeof(2.5)
    assert nbytes(None) == sys.getsizeof(None)


def test_containers_recurse():
    t = torch.zeros(16, dtype=torch.uint8)
    assert nbytes([t, (b"xy", {b"k": t.clone()})]) == 16 + 2 + 1 + 16
    assert nbytes({b"a", b"bc"}) == 3
    assert nbytes(frozenset([b"a"])) == 1


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    meta: dict


def test_dataclass_recurse():
    s = Sample(torch.zeros(10, dtype=torch.uint8), 1, {b"x": b"yy"})
    assert nbytes(s) == 10 + sys.getsizeof(1) + 3


class Blob:
    def __init__(self, n: int) -> None:
        self.n = n


class SubBlob(Blob):
    pass


def test_register_custom_type_and_subclass():
    nbytes.register(Blob)(lambda b: b.n)
    try:
        assert nbytes(Blob(123)) == 123
        assert nbytes(SubBlob(7)) == 7
        assert nbytes([Blob(1), Blob(2)]) == 3
        # a lambda registered: the package's nbytes still pickles (by name), so
        # anything holding it still reaches spawned workers
        import pickle

        assert pickle.loads(pickle.dumps(nbytes)) is nbytes
    finally:
        nbytes._registry.pop(Blob, None)
        nbytes._cache.clear()
        nbytes._reset_exact()


class Weird:
    def __sizeof__(self):
        raise RuntimeError("no size")


def test_unknown_types_never_raise():
    class Plain:
        pass

    assert nbytes(Plain()) == sys.getsizeof(Plain())
    assert nbytes(Weird()) > 0


def test_exact_type_table_gives_the_generic_numbers():
    """``nbytes.exact`` (what ``nbytes`` and ``BoundedBuffer`` use for exact built-in
    types and tensors) gives what the generic dispatch gives."""
    from streambuf.sizing import _NBytes, _size

    reg = _NBytes()
    t = torch.zeros(256)
    values = [0, 1, -1, 2**30, 2**64, 10**40, True, False, 2.5, 1j, None]
    values += ["", "abc", "héllo", "\u20ac" * 9, "\U0001f600" * 3, b"", b"abc", bytearray(9)]
    values += [t, t[:3], torch.zeros(0), torch.zeros(3, dtype=torch.int8)]
    for x in values:
        assert reg(x) == _size(x, set(), reg), x
        assert reg(x) == reg(x)  # the second call, after the table learned tensors
    assert torch.Tensor in reg.exact
    assert reg(t) == 1024 and reg(t[:3]) == 1024
    for x in [0, 10**40, 2.5, None, True, "héllo"]:
        assert reg(x) == sys.getsizeof(x)
    reg.register(torch.Tensor)(lambda _: 7)  # a registered sizer wins over the table
    assert torch.Tensor not in reg.exact and reg(t) == 7
