"""Parsing and validation of option values, shared by every public signature.

Every option of ``Loader``, ``Pipeline`` and its stages, ``shards()`` and
``video.clips()`` is checked when the object is built, never later in a worker: a bad
value raises ``TypeError`` (wrong kind: a string where a number belongs, a bool where an
int belongs) or ``ValueError`` (out of range, ``nan``/``inf``, a byte size that does not
fit in the signed 64-bit counters the budgets live in), and the message names the
argument, the value and what to pass instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

__all__ = [
    "MAX_BYTES",
    "check_bool",
    "check_choice",
    "check_int",
    "check_optional_seconds",
    "check_seconds",
    "parse_bytes",
    "parse_count",
    "parse_optional_bytes",
]

#: the largest byte size any bound accepts (budgets are signed 64-bit shared counters)
MAX_BYTES = (1 << 62) - 1

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


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_bytes(value: int | float | str, *, name: str = "max_bytes") -> int:
    """Return ``value`` as a positive int of bytes; accepts ints and strings like "4GiB".

    Raises:
        TypeError: not an int, a float or a string.
        ValueError: unparsable, unknown unit, ``nan``/``inf``, not > 0, or larger than
            ``MAX_BYTES`` (the message names ``name``).
    """
    if isinstance(value, str):
        m = _RE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"{name}={value!r} is not a byte size; use an int or e.g. '512MiB', '4GiB', '1GB'"
            )
        number: float = float(m.group(1)) * _UNITS[unit]
    elif _is_real(value):
        number = value
    else:
        raise TypeError(f"{name}={value!r} must be an int or a string like '512MiB'")
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r} must be a finite byte size like 1 << 30 or '1GiB'")
    out = int(number)
    if out <= 0:
        raise ValueError(f"{name}={value!r} must be > 0")
    if out > MAX_BYTES:
        raise ValueError(f"{name}={value!r} is too large: at most {MAX_BYTES} bytes (2**62 - 1)")
    return out


def parse_optional_bytes(value: int | str | None, *, name: str) -> int | None:
    """``parse_bytes``, with None passed through (no bound)."""
    return None if value is None else parse_bytes(value, name=name)


def parse_count(value: int, *, name: str) -> int:
    """Return ``value`` if it is an int >= 1, else raise with a message naming ``name``."""
    return check_int(value, name=name, minimum=1)


def check_int(value: Any, *, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An int (not a bool) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value!r} must be <= {maximum}")
    return value


def check_seconds(value: Any, *, name: str, allow_zero: bool = False) -> float:
    """A finite number of seconds > 0 (>= 0 with ``allow_zero``)."""
    if not _is_real(value):
        raise TypeError(f"{name}={value!r} must be a number of seconds")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number of seconds")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")
    return float(value)


def check_optional_seconds(value: Any, *, name: str, allow_zero: bool = False) -> float | None:
    """``check_seconds``, or None (no limit)."""
    if value is None:
        return None
    try:
        return check_seconds(value, name=name, allow_zero=allow_zero)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (or None for no limit)") from None


def check_bool(value: Any, *, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be True or False")
    return value


def check_choice(value: Any, *, name: str, choices: Collection[Any]) -> Any:
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}={value!r} must be one of {options}")
    return value
