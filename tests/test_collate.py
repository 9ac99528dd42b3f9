from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from streambuf.stages import batch_items


def assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


SAMPLES = {
    "tensor": [torch.full((2, 3), i) for i in range(7)],
    "ndarray": [np.full((4,), i, dtype=np.float32) for i in range(7)],
    "ints": list(range(7)),
    "nested": [
        {"a": torch.full((2,), i), "b": i, "c": (np.ones(2) * i, f"x{i}"), "d": [float(i)]}
        for i in range(7)
    ],
    "scalars": [
        {"label": i, "w": i / 3, "keep": i % 2 == 0, "pair": (i, -i / 2), "name": f"s{i}"}
        for i in range(7)
    ],
    "floats": [i * 0.25 for i in range(7)],
    "bools": [i % 3 == 0 for i in range(7)],
    "int then float": [1, 2.5, 3, 4, 5.5, 6, 7],  # (default_collate's own promotion)
    "int then bool": [{"v": 1}, {"v": True}, {"v": 3}, {"v": 4}, {"v": 5}, {"v": 6}, {"v": 7}],
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("drop_last", [False, True])
def test_equals_default_collate(name, drop_last):
    items = SAMPLES[name]
    got = list(batch_items(items, 3, drop_last=drop_last))
    stop = 6 if drop_last else 7
    expected = [default_collate(items[i : min(i + 3, stop)]) for i in range(0, stop, 3)]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_same(g, e)


def test_mismatched_shapes_raise_clear_error():
    """The error says which sample, where in it and what differs (it said only "differ
    in structure, shape or dtype")."""
    with pytest.raises(
        ValueError, match=r"sample 1 .* sample has shape \(3,\), the first's \(2,\)"
    ):
        list(batch_items([torch.zeros(2), torch.zeros(3)], 2))
    a = {"image": torch.zeros(3, 4, 4), "label": 1, "parts": [torch.zeros(2)]}
    cases = [
        (dict(a, image=torch.zeros(3, 5, 4)), r"sample\['image'\] has shape \(3, 5, 4\)"),
        (dict(a, image=torch.zeros(3, 4, 4, dtype=torch.float64)), r"dtype torch.float64"),
        ({"image": a["image"], "label": 2}, r"keys - more and \['parts'\] fewer"),
        (dict(a, parts=[torch.zeros(2), torch.zeros(2)]), r"sample\['parts'\] has 2 elements"),
        (dict(a, parts=[torch.zeros(1)]), r"sample\['parts'\]\[0\] has shape \(1,\)"),
        (dict(a, image="x.jpg"), r"sample\['image'\] is a str, the first's a tensor"),
    ]
    for b, match in cases:
        with pytest.raises(ValueError, match=match):
            list(batch_items([a, a, b], 3))


def test_unknown_leaf_falls_back_to_default_collate():
    class Obj:
        pass

    items = [{"o": Obj()} for _ in range(2)]
    with pytest.raises(TypeError):  # default_collate's own error for such leaves
        list(batch_items(items, 2))
    assert list(batch_items(items, 2, collate=lambda b: len(b))) == [2]
