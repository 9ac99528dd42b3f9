"""Parsing of byte sizes ("512MiB", 1 << 20) shared by every public signature."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str, *, name: str = "max_bytes") -> int:
    """Return ``value`` as a positive int of bytes; accepts ints and strings like "4GiB".

    Raises:
        ValueError: unparsable, unknown unit, or not > 0 (the message names ``name``).
    """
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be an int or a string like '512MiB'")
    if isinstance(value, int | float):
        out = int(value)
    elif isinstance(value, str):
        m = _RE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"{name}={value!r} is not a byte size; use an int or e.g. '512MiB', '4GiB', '1GB'"
            )
        out = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise TypeError(f"{name}={value!r} must be an int or a string like '512MiB'")
    if out <= 0:
        raise ValueError(f"{name}={value!r} must be > 0")
    return out


def parse_count(value: int, *, name: str) -> int:
    """Return ``value`` if it is an int >= 1, else raise with a message naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int >= 1")
    if value < 1:
        raise ValueError(f"{name}={value!r} must be >= 1")
    return value
