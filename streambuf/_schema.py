"""A small checker of plain data (JSON-like) against a declared shape.

A spec is an object with ``check(value, path, env)``; it returns None or raises
``ValueError(f"{path}: expected {what}, got {value!r}")``, where ``path`` is the Python
expression of the bad field (``state["workers"][1]["source"]["lanes"][0]``). Bounds may
name an entry of ``env`` (a dict of ints derived from the data being checked, e.g. the
shard count) instead of a number. Nothing here knows what a streambuf state is
(``streambuf._state_schema`` declares it).

Invariant: ``check`` accepts a value only if every field it reaches has the declared
type and range; bool is never accepted as an int.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "Bool",
    "Choice",
    "Dict",
    "Int",
    "Lazy",
    "List",
    "Lit",
    "MapOf",
    "OneOf",
    "Opt",
    "Scoped",
    "Spec",
    "Str",
    "fail",
]

Env = Mapping[str, int]
Bound = int | str | None


def fail(path: str, what: str, value: Any) -> ValueError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ValueError(f"{path}: expected {what}, got {shown}")


class Spec:
    what = "a value"

    def check(self, value: Any, path: str, env: Env) -> None:
        raise NotImplementedError


class Int(Spec):
    """An int in ``[lo, hi)`` (``hi`` exclusive; a str bound is looked up in ``env``)."""

    def __init__(self, lo: Bound = None, hi: Bound = None) -> None:
        self.lo, self.hi = lo, hi

    def _bounds(self, env: Env) -> tuple[int | None, int | None]:
        lo = env[self.lo] if isinstance(self.lo, str) else self.lo
        hi = env[self.hi] if isinstance(self.hi, str) else self.hi
        return lo, hi

    def describe(self, env: Env) -> str:
        lo, hi = self._bounds(env)
        if lo is not None and hi is not None:
            return f"an int in [{lo}, {hi})"
        if lo is not None:
            return f"an int >= {lo}"
        return f"an int < {hi}" if hi is not None else "an int"

    def check(self, value: Any, path: str, env: Env) -> None:
        lo, hi = self._bounds(env)
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (lo is not None and value < lo)
            or (hi is not None and value >= hi)
        ):
            raise fail(path, self.describe(env), value)


class Bool(Spec):
    what = "true or false"

    def check(self, value: Any, path: str, env: Env) -> None:
        if not isinstance(value, bool):
            raise fail(path, self.what, value)


class Str(Spec):
    what = "a string"

    def check(self, value: Any, path: str, env: Env) -> None:
        if not isinstance(value, str):
            raise fail(path, self.what, value)


class Lit(Spec):
    """Exactly ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def check(self, value: Any, path: str, env: Env) -> None:
        if value is None and self.value is None:
            return
        if type(value) is not type(self.value) or value != self.value:
            raise fail(path, repr(self.value), value)


class Choice(Spec):
    """One of ``values`` (compared with their type: ``True`` is not ``1``)."""

    def __init__(self, *values: Any) -> None:
        self.values = values

    def check(self, value: Any, path: str, env: Env) -> None:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise fail(path, " or ".join(repr(v) for v in self.values), value)


class Scoped(Spec):
    """``spec`` checked with ``env`` updated by ``overrides`` (e.g. a nested pipeline's
    bounds)."""

    def __init__(self, spec: Spec, **overrides: int) -> None:
        self.spec, self.overrides = spec, overrides

    def check(self, value: Any, path: str, env: Env) -> None:
        self.spec.check(value, path, {**env, **self.overrides})


class Anything(Spec):
    """Any value (a user's own state: only its owner knows its shape)."""

    what = "any value"

    def check(self, value: Any, path: str, env: Env) -> None:
        return None


class Opt(Spec):
    """None or ``spec``."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def check(self, value: Any, path: str, env: Env) -> None:
        if value is not None:
            self.spec.check(value, path, env)


class OneOf(Spec):
    """The first of ``specs`` whose ``accepts(value)`` is true checks it (``accepts``: a
    cheap shape test, so the error is the one of the intended alternative)."""

    def __init__(self, what: str, *alternatives: tuple[Callable[[Any], bool], Spec]) -> None:
        self.what, self.alternatives = what, alternatives

    def check(self, value: Any, path: str, env: Env) -> None:
        for accepts, spec in self.alternatives:
            if accepts(value):
                spec.check(value, path, env)
                return
        raise fail(path, self.what, value)


class List(Spec):
    """A list of ``item`` (``items``: per-position specs for the first elements);
    length in ``[min_len, max_len]`` (``length``: exactly that, a str from ``env``)."""

    def __init__(
        self,
        item: Spec | None = None,
        *,
        items: Sequence[Spec] = (),
        min_len: int = 0,
        max_len: int | None = None,
        length: Bound = None,
    ) -> None:
        self.item, self.items = item, tuple(items)
        self.min_len, self.max_len, self.length = min_len, max_len, length

    def check(self, value: Any, path: str, env: Env) -> None:
        if not isinstance(value, list):
            raise fail(path, "a list", value)
        n = len(value)
        want = env[self.length] if isinstance(self.length, str) else self.length
        if want is not None and n != want:
            raise fail(path, f"a list of {want} entries", value)
        hi = self.max_len if self.max_len is not None else (None if self.item else len(self.items))
        if n < self.min_len or (hi is not None and n > hi):
            what = f"{self.min_len}" + (f"..{hi}" if hi != self.min_len else "")
            raise fail(path, f"a list of {what} entries", value)
        for i, v in enumerate(value):
            spec = self.items[i] if i < len(self.items) else self.item
            assert spec is not None
            spec.check(v, f"{path}[{i}]", env)


class Dict(Spec):
    """A dict with exactly ``fields`` (key -> spec) and, optionally, ``optional`` ones."""

    def __init__(self, fields: Mapping[str, Spec], optional: Mapping[str, Spec] = {}) -> None:
        self.fields, self.optional = dict(fields), dict(optional)

    def check(self, value: Any, path: str, env: Env) -> None:
        if not isinstance(value, dict):
            raise fail(path, "a dict", value)
        for key, spec in self.fields.items():
            if key not in value:
                raise ValueError(f"{path}: the key {key!r} is missing")
            spec.check(value[key], f"{path}[{key!r}]", env)
        for key, spec in self.optional.items():
            if key in value:
                spec.check(value[key], f"{path}[{key!r}]", env)
        extra = sorted(str(k) for k in value if k not in self.fields and k not in self.optional)
        if extra:
            raise ValueError(f"{path}: unexpected keys {extra}")


class MapOf(Spec):
    """A dict whose keys are decimal ints (as str) checked by ``key``, values by ``value``."""

    def __init__(self, key: Int, value: Spec) -> None:
        self.key, self.value = key, value

    def check(self, value: Any, path: str, env: Env) -> None:
        if not isinstance(value, dict):
            raise fail(path, "a dict", value)
        for k, v in value.items():
            if not isinstance(k, str) or not k.isdecimal() or not k.isascii():
                raise ValueError(f"{path}: key {k!r}: expected a decimal int as a string")
            self.key.check(int(k), f"{path} key {k!r}", env)
            self.value.check(v, f"{path}[{k!r}]", env)


class Lazy(Spec):
    """A spec built on first use (for recursive shapes)."""

    def __init__(self, make: Callable[[], Spec]) -> None:
        self.make = make
        self.spec: Spec | None = None

    def check(self, value: Any, path: str, env: Env) -> None:
        if self.spec is None:
            self.spec = self.make()
        self.spec.check(value, path, env)
