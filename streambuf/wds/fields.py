"""The sample verbs WebDataset users type, as picklable per-sample functions.

Same names and semantics as webdataset's (``webdataset.filters``):

* ``ToTuple("jpg;png", "cls")``: the tuple of those fields; ``"a;b"`` takes the first
  alternative present; one string with spaces (``"jpg cls"``) is split. A missing field
  is an error (``missing_is_error=True``), or None; a None value is an error when
  ``none_is_error`` (default: ``missing_is_error``).
* ``Rename(image="jpg;png", label="cls")``: new name = old name (alternatives as above);
  with ``keep=True`` (default) the other fields stay (every alternative named is
  removed), with ``keep=False`` only the renamed ones; a missing field is an error.
* ``MapDict(jpg=fn, cls=fn2)``: ``sample[k] = fn(sample[k])`` on a copy of the sample; a
  missing field is an error; an exception from ``fn`` keeps its type (a note names the
  field and sample) or, under ``on_error="skip"``, skips the sample.

(``select(predicate)`` is ``Pipeline.filter``.) Errors are ``ShardError`` naming the
stage, the sample key, its shard, the fields it has and the fix; under
``on_error="skip"`` the sample is skipped, counted and logged instead (``_guard``).
They hold no state of their own, so a pipeline resumes through them like through any
map stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._failures import OnError
from ..errors import add_note
from ..stages import describe
from ._guard import SampleFn, _Skipped

__all__ = ["MapDict", "Rename", "ToTuple"]

_MISSING = object()


def _alternatives(spec: Any, *, what: str) -> tuple[str, ...]:
    if isinstance(spec, str):
        names = tuple(spec.split(";"))
    elif isinstance(spec, list | tuple) and all(isinstance(x, str) for x in spec):
        names = tuple(spec)
    else:
        raise TypeError(f"{what}: {spec!r} must be a field name, 'a;b' or a list of names")
    if not names or any(not n or " " in n for n in names):
        raise ValueError(f"{what}: {spec!r} must name fields, like 'jpg;png' (no blanks)")
    return names


def _first(sample: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in sample:
            return sample[name]
    return _MISSING


def _fields(sample: Any) -> str:
    return ", ".join(repr(k) for k in sample) if isinstance(sample, Mapping) else "not a dict"


class ToTuple(SampleFn):
    """``sample -> tuple`` of fields (see the module docstring)."""

    stage = "to_tuple"

    def __init__(
        self,
        *fields: str | list[str],
        missing_is_error: bool = True,
        none_is_error: bool | None = None,
        on_error: OnError = "raise",
        max_failures: int | None = None,
    ) -> None:
        super().__init__(on_error=on_error, max_failures=max_failures)
        if len(fields) == 1 and isinstance(fields[0], str) and " " in fields[0]:
            fields = tuple(fields[0].split())
        if not fields:
            raise ValueError("to_tuple() needs at least one field, like to_tuple('jpg', 'cls')")
        self.fields = tuple(_alternatives(f, what="to_tuple") for f in fields)
        self.missing_is_error = bool(missing_is_error)
        self.none_is_error = self.missing_is_error if none_is_error is None else none_is_error
        self.__name__ = "to_tuple(" + ", ".join(repr(";".join(f)) for f in self.fields) + ")"

    def __call__(self, sample: Mapping[str, Any], /) -> tuple[Any, ...] | _Skipped:
        if not isinstance(sample, Mapping):
            return self.fail({}, f"to_tuple got a {type(sample).__name__}, not a dict sample")
        out = []
        for names in self.fields:
            value = _first(sample, names)
            if value is _MISSING:
                if self.missing_is_error:
                    return self.fail(
                        sample,
                        f"no field {';'.join(names)!r} (it has {_fields(sample)})",
                        fix="name a field the samples have, add alternatives ('jpg;png'), "
                        "or pass missing_is_error=False to get None",
                    )
                value = None
            if value is None and self.none_is_error:
                return self.fail(
                    sample,
                    f"field {';'.join(names)!r} is None",
                    fix="pass none_is_error=False to accept None",
                )
            out.append(value)
        return tuple(out)


class Rename(SampleFn):
    """Rename fields: ``Rename(new="old;alt", ...)`` (see the module docstring)."""

    stage = "rename"

    def __init__(
        self,
        *,
        keep: bool = True,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        **mapping: str | list[str],
    ) -> None:
        super().__init__(on_error=on_error, max_failures=max_failures)
        if not mapping:
            raise ValueError("rename() needs new=old pairs, like rename(image='jpg;png')")
        self.mapping = {new: _alternatives(old, what="rename") for new, old in mapping.items()}
        self.keep = bool(keep)
        self.__name__ = "rename(" + ", ".join(self.mapping) + ")"

    def __call__(self, sample: Mapping[str, Any], /) -> dict[str, Any] | _Skipped:
        if not isinstance(sample, Mapping):
            return self.fail({}, f"rename got a {type(sample).__name__}, not a dict sample")
        renamed = {}
        for new, names in self.mapping.items():
            value = _first(sample, names)
            if value is _MISSING:
                return self.fail(
                    sample,
                    f"rename {new}=: no field {';'.join(names)!r} (it has {_fields(sample)})",
                    fix="name a field the samples have, or add alternatives ('jpg;png')",
                )
            renamed[new] = value
        if not self.keep:
            return renamed
        dropped = {name for names in self.mapping.values() for name in names}
        out = {k: v for k, v in sample.items() if k not in dropped}
        out.update(renamed)
        return out


class MapDict(SampleFn):
    """Apply a function per field: ``MapDict(jpg=fn, ...)`` (see the module docstring)."""

    stage = "map_dict"

    def __init__(
        self,
        *,
        on_error: OnError = "raise",
        max_failures: int | None = None,
        **fns: Callable[[Any], Any],
    ) -> None:
        super().__init__(on_error=on_error, max_failures=max_failures)
        if not fns:
            raise ValueError("map_dict() needs field=fn pairs, like map_dict(jpg=transform)")
        for name, fn in fns.items():
            if not callable(fn):
                raise TypeError(f"map_dict({name}=...): {fn!r} is not callable")
        self.fns = dict(fns)
        self.__name__ = "map_dict(" + ", ".join(self.fns) + ")"

    def __call__(self, sample: Mapping[str, Any], /) -> dict[str, Any] | _Skipped:
        if not isinstance(sample, Mapping):
            return self.fail({}, f"map_dict got a {type(sample).__name__}, not a dict sample")
        out = dict(sample)
        for name, fn in self.fns.items():
            if name not in out:
                return self.fail(
                    sample,
                    f"map_dict {name}=: no field {name!r} (it has {_fields(sample)})",
                    fix="name a field the samples have (rename() first if they differ)",
                )
            try:
                out[name] = fn(out[name])
            except Exception as exc:
                if self.on_error == "raise":  # the user's error keeps its type
                    add_note(exc, f"streambuf: raised by map_dict {name}= on {describe(sample)}")
                    raise
                return self.fail(sample, f"map_dict {name}= failed on field {name!r}", cause=exc)
        return out
