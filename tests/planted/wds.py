"""The webdataset-compatibility planted bugs (decoders, formats, verbs): ``tests/planted``
gathers them with the others (``python tests/mutants.py wds`` for these alone). Each one must
make the test files named beside it fail. No mutant lifts a size bound outright: a gzip
bomb inflating to 10 GiB would take the machine with it, not fail a test."""

from __future__ import annotations

from tests.planted._mutant import planted

COMPAT = "tests/sources/test_wds_compat.py"
FORMATS = "tests/sources/test_formats.py"
FIELDS = "tests/sources/test_fields.py"
D = "streambuf/wds/decoders.py"
F = "streambuf/wds/formats.py"


_m = planted("wds")


MUTANTS = [
    _m(
        "gz fields not counted at their inflated size against max_sample_bytes",
        D,
        "room.take(sample=len(data), decoded=decoded)",
        "room.take(sample=0 if decoded else len(data), decoded=decoded)",
        FORMATS,
    ),
    _m(
        "gunzip stops after the first gzip member",
        F,
        "        if not tail:\n            return",
        "        if True:\n            return",
        FORMATS,
    ),
    _m(
        "npz arrays not counted before they are read",
        F,
        "total += math.prod(int(d) for d in shape) * dtype.itemsize",
        "total += 0",
        FORMATS,
    ),
    _m(
        "tenbin words read big-endian",
        F,
        'words = struct.unpack(f"<{len(header) // 8}q", header)',
        'words = struct.unpack(f">{len(header) // 8}q", header)',
        FORMATS,
        COMPAT,
    ),
    _m(
        "float image specs not scaled to [0, 1]",
        "streambuf/wds/images.py",
        "arr = arr.astype(np.float32) / 255.0",
        "arr = arr.astype(np.float32)",
        COMPAT,
    ),
    _m(
        "to_tuple takes the last alternative present",
        "streambuf/wds/fields.py",
        "    for name in names:\n        if name in sample:",
        "    for name in reversed(names):\n        if name in sample:",
        FIELDS,
    ),
    _m(
        "rename keeps the old fields",
        "streambuf/wds/fields.py",
        "out = {k: v for k, v in sample.items() if k not in dropped}",
        "out = dict(sample)",
        FIELDS,
    ),
    _m(
        "map_dict changes the caller's sample",
        "streambuf/wds/fields.py",
        "out = dict(sample)\n        for name, fn in self.fns.items():",
        "out = sample  # type: ignore[assignment]\n        for name, fn in self.fns.items():",
        FIELDS,
    ),
]
