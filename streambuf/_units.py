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
import numbers
import re
from collections.abc import Collection
from fractions import Fraction
from typing import Any

__all__ = [
    "MAX_BYTES",
    "check_bool",
    "check_choice",
    "check_int",
    "check_optional_seconds",
    "check_seconds",
    "check_size",
    "check_weight",
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


def _is_integer(value: Any) -> bool:
    """An int (numpy's integers too), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def parse_bytes(value: int | str, *, name: str = "max_bytes", allow_zero: bool = False) -> int:
    """Return ``value`` as an int of bytes (> 0, or >= 0 with ``allow_zero``); accepts
    ints and strings like "4GiB" or "1.5MiB" that name a whole number of bytes.

    A float is refused, even an integral one (``1.9`` bytes is a mistake, and ``4e9``
    reads as bytes only by luck): pass an int or a string with a unit.

    Raises:
        TypeError: not an int or a string (a float, a bool, None...).
        ValueError: unparsable, unknown unit, not a whole number of bytes, out of range,
            or larger than ``MAX_BYTES`` (the message names ``name``).
    """
    if isinstance(value, str):
        m = _RE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"{name}={value!r} is not a byte size; use an int or e.g. '512MiB', '4GiB', '1GB'"
            )
        exact = Fraction(m.group(1)) * _UNITS[unit]
        if exact.denominator != 1:
            raise ValueError(
                f"{name}={value!r} is not a whole number of bytes ({float(exact)}); use an "
                "int or a string like '512MiB'"
            )
        out = int(exact)
    elif _is_integer(value):
        out = int(value)
    elif isinstance(value, float):
        raise TypeError(
            f"{name}={value!r} is a float; a byte size is an int (e.g. {name}=1 << 30) or a "
            "string with a unit (e.g. '1GiB', '4GB')"
        )
    else:
        raise TypeError(f"{name}={value!r} must be an int or a string like '512MiB'")
    if out < 0 or (out == 0 and not allow_zero):
        raise ValueError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")
    if out > MAX_BYTES:
        raise ValueError(f"{name}={value!r} is too large: at most {MAX_BYTES} bytes (2**62 - 1)")
    return out


def parse_optional_bytes(value: int | str | None, *, name: str) -> int | None:
    """``parse_bytes``, with None passed through (no bound)."""
    return None if value is None else parse_bytes(value, name=name)


def check_size(value: Any, *, name: str = "sizeof") -> int:
    """A size in bytes a function returned (``sizeof(item)``): an int in
    ``[0, MAX_BYTES]``; anything else (negative, a float, a bool, 2**70) would corrupt the
    byte accounting, so it is an error naming ``name`` and the value. Cheap on the
    common path (called once per item)."""
    if type(value) is int and 0 <= value <= MAX_BYTES:
        return value
    if not _is_integer(value):
        raise TypeError(
            f"{name} returned {value!r} ({type(value).__name__}); it must return an int "
            "number of bytes"
        )
    if not 0 <= value <= MAX_BYTES:
        raise ValueError(
            f"{name} returned {value!r}; a size must be an int in [0, {MAX_BYTES}] bytes"
        )
    return int(value)


def check_weight(value: Any, *, name: str) -> float:
    """A finite number > 0 (a weight, a rate): not a bool, not a string."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} must be a positive number, not a {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name}={value!r} must be a positive, finite number")
    return number


def parse_count(value: int, *, name: str) -> int:
    """Return ``value`` if it is an int >= 1, else raise with a message naming ``name``."""
    return check_int(value, name=name, minimum=1)


MAX_THREADS_PER_STAGE = 1024  # threads (lanes) one stage may run in one process


def check_count_or_auto(value: Any, *, name: str) -> int | str:
    """``value``: a thread or lane count, an int in ``[1, MAX_THREADS_PER_STAGE]``, or
    ``"auto"`` (chosen at run time)."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        raise ValueError(f"{name}={value!r} must be an int >= 1 or 'auto'")
    return check_thread_count(value, name=name)


def check_thread_count(value: Any, *, name: str) -> int:
    """A count of threads or lanes of one stage in one process: an int in ``[1,
    MAX_THREADS_PER_STAGE]`` (each is a thread and a slot of the stage's window, made
    when the stage starts)."""
    count = parse_count(value, name=name)
    if count > MAX_THREADS_PER_STAGE:
        raise ValueError(
            f"{name}={value!r}: at most {MAX_THREADS_PER_STAGE} for one stage in one process "
            "(each is a thread, or a lane, and a slot of the stage's window, made when it "
            "starts); for more at once, use more workers (Loader num_workers=)"
        )
    return count


def check_nbytes(value: Any, *, name: str) -> int:
    """A byte count passed to a call (``reserve(nbytes)``): an int (numpy's integers
    too, never a bool) in ``[0, MAX_BYTES]``, as a Python int."""
    if type(value) is int and 0 <= value <= MAX_BYTES:
        return value
    if not _is_integer(value):
        raise TypeError(f"{name}={value!r} must be an int number of bytes")
    if not 0 <= value <= MAX_BYTES:
        raise ValueError(f"{name}={value!r} must be in [0, {MAX_BYTES}] bytes")
    return int(value)


def _as_python(value: Any, kind: str) -> str:
    """The hint for a number of the asked kind but not Python's type (numpy's): a Python
    one is asked for, because an option's value may reach a state saved as JSON."""
    asked = numbers.Integral if kind == "int" else numbers.Real
    if isinstance(value, asked) and not isinstance(value, bool | int | float):
        return f" (a Python {kind}: {kind}(x) of this {type(value).__name__})"
    return ""


def check_int(value: Any, *, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An int (not a bool) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        least = f" >= {minimum}" if minimum > -(1 << 63) else ""
        raise TypeError(f"{name}={value!r} must be an int{least}{_as_python(value, 'int')}")
    if value < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value!r} must be <= {maximum}")
    return value


def check_seconds(value: Any, *, name: str, allow_zero: bool = False) -> float:
    """A finite number of seconds > 0 (>= 0 with ``allow_zero``)."""
    if not _is_real(value):
        raise TypeError(f"{name}={value!r} must be a number of seconds{_as_python(value, 'float')}")
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


def check_callable(value: Any, *, name: str, optional: bool = False) -> Any:
    """A callable (or None, with ``optional``): refused when the object is built, not
    at its first call on a background thread."""
    if (value is None and optional) or callable(value):
        return value
    raise TypeError(f"{name}={value!r} must be callable" + (" or None" if optional else ""))


def check_choice(value: Any, *, name: str, choices: Collection[Any]) -> Any:
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}={value!r} must be one of {options}")
    return value
