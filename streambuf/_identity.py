"""Shard identities in a saved state: which shard a saved position refers to.

A state's positions are ``(shard index, sample index)`` in the *saved* pipeline's list.
To resume against a list that was rebuilt (reordered, moved to another folder or bucket,
signed again, extended), each shard index must be mapped to the same shard in the new
list. A shard's **identity** is its *name*: the last path component of its path or URL,
with a URL's query string and fragment dropped (so ``.../train-000001.tar?X-Amz-...``
re-signed, or the same files copied to another folder, keep their identity). Size and
ETag are not part of it: knowing them would cost a stat or a request per shard.

Where several shards of one list share a name (``en/000.tar`` and ``fr/000.tar``), each
of them is identified by as many trailing path components as tell them apart
(``shard_names``); a saved identity matches a current one when either is the other's
trailing path, and must match exactly one.

Only pipelines whose items are shard references have names: a ``reader=`` or
``expand=`` pipeline over strings or paths (``sb.shards``, ``sb.video.clips``,
``Pipeline(paths, expand=...)``). Any other list (plain items, ints, objects) is
identified by its *count* alone (the Source's ``names()`` is None: ``SequenceSource.names``).

Names are stored compactly (``encode_names``): a run of numbered names
``train-000000.tar .. train-099999.tar`` (step +1 or -1, same zero padding) is one entry
``[prefix, suffix, width, start, step, count]``; anything else is the literal name. The
encoding is canonical (equal lists <=> equal encodings) and computed once per pipeline
(cached), so ``state_dict()`` only adds a reference to it.

``remap(saved, current)`` is the rule for a changed list (docs/design.md):

* the same names in the same order (duplicates allowed): positions as saved (None);
* otherwise every saved name must match exactly one shard of the new list (the same
  identity, or one that is the other's trailing path), and no two saved names the same
  one: the old -> new index list; the new list may hold *more* shards (appended:
  read in the rest of the epoch);
* a saved shard missing from the new list (removed or replaced), or a name that is not
  unique where it must be mapped: ``ValueError`` naming the shards.
"""

from __future__ import annotations

import os
import re
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["decode_names", "encode_names", "remap", "shard_name", "shard_names", "state_names"]

_NUMBERED = re.compile(r"^(.*?)([0-9]+)([^0-9]*)$", re.DOTALL)
_CACHE: weakref.WeakKeyDictionary[Any, list[Any] | None] = weakref.WeakKeyDictionary()


def shard_name(item: Any) -> str | None:
    """The identity of one shard reference (see the module docstring), or None."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int):
        item = item[1]  # a video pipeline's (index, url)
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if isinstance(item, bytes):
        item = item.decode("utf-8", "surrogateescape")
    if not isinstance(item, str):
        return None
    if "://" in item:  # a URL: its query string and fragment are not its identity
        item = item.split("#", 1)[0].split("?", 1)[0]
    return item.rstrip("/").rsplit("/", 1)[-1]


def _components(item: Any) -> list[str] | None:
    """The path components of one shard reference (a URL's scheme, host, query string
    and fragment dropped), or None when it is not one."""
    if shard_name(item) is None:
        return None
    if isinstance(item, tuple):
        item = item[1]
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if isinstance(item, bytes):
        item = item.decode("utf-8", "surrogateescape")
    if "://" in item:
        item = item.split("#", 1)[0].split("?", 1)[0].split("://", 1)[1]
        item = item.split("/", 1)[1] if "/" in item else ""
    return [c for c in item.rstrip("/").split("/") if c] or [shard_name(item) or ""]


def shard_names(items: Sequence[Any]) -> list[str] | None:
    """Each shard's identity in a list (None: not a list of shard references): its name
    (``shard_name``), or, where several shards of the list share a name (``en/000.tar``,
    ``fr/000.tar``), as many of the last path components as tell them apart (the whole
    path where none does: the same file listed twice). The same files in another folder
    keep their identities; each group of equal names is extended on its own, so a shard
    added elsewhere in the list does not change the others'."""
    parts = [_components(x) for x in items]
    if any(p is None for p in parts):
        return None
    comps: list[list[str]] = parts  # type: ignore[assignment]
    names = [c[-1] for c in comps]
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        groups.setdefault(n, []).append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        longest = max(len(comps[i]) for i in members)
        for k in range(2, longest + 1):
            tails = ["/".join(comps[i][-k:]) for i in members]
            if len(set(tails)) == len(tails) or k == longest:
                for i, t in zip(members, tails):
                    names[i] = t
                break
    return names


def _same_shard(saved: str, now: str) -> bool:
    """Two identities name the same shard when one is the other's trailing path."""
    return saved == now or saved.endswith("/" + now) or now.endswith("/" + saved)


def state_names(pipe: Any) -> list[Any] | None:
    """The encoded names of ``pipe``'s shards (None: identified by count; its Source
    says, ``streambuf._contracts.Source.names``), computed once per pipeline object;
    callers must not modify the list."""
    try:
        return _CACHE[pipe]
    except KeyError:
        names = pipe._src.names()
        out = encode_names(names) if names is not None else None
        _CACHE[pipe] = out
        return out


def encode_names(names: Sequence[str]) -> list[Any]:
    """Runs of numbered names as ``[prefix, suffix, width, start, step, count]``, other
    names literal; canonical (greedy, left to right)."""
    out: list[Any] = []
    run: list[Any] | None = None
    for name in names:
        m = _NUMBERED.match(name)
        if m is None:
            out.append(name)
            run = None
            continue
        prefix, digits, suffix = m.groups()
        num, width = int(digits), len(digits)
        if run is not None and (run[0], run[1], run[2]) == (prefix, suffix, width):
            step = num - run[3] if run[5] == 1 else run[4]
            if step in (1, -1) and num == run[3] + step * run[5]:
                run[4], run[5] = step, run[5] + 1
                continue
        run = [prefix, suffix, width, num, 1, 1]
        out.append(run)
    return out


def decode_names(encoded: Sequence[Any]) -> list[str]:
    """The names ``encode_names`` encoded (validated states only)."""
    out: list[str] = []
    for entry in encoded:
        if isinstance(entry, str):
            out.append(entry)
            continue
        prefix, suffix, width, start, step, count = entry
        out.extend(f"{prefix}{str(start + step * i).zfill(width)}{suffix}" for i in range(count))
    return out


def _listed(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def remap(saved: Sequence[Any] | None, saved_count: int, pipe: Any) -> list[int] | None:
    """Old shard index -> new shard index, or None when positions stay as saved; raises
    ``ValueError`` naming the shards when the lists cannot be matched (module docstring)."""
    current = state_names(pipe)
    count = pipe.num_shards()
    if saved is None or current is None:
        if saved is None and current is None and saved_count == count:
            return None
        if saved is not None or current is not None:
            raise ValueError(
                "this state was saved by a different pipeline: one of the two identifies "
                "its shards by name (paths or URLs) and the other by count (items)"
            )
        raise ValueError(
            f"this state was saved by a different pipeline: it had {saved_count} shards "
            f"(items), this one has {count}; items are identified by their count only"
        )
    if list(saved) == current:
        return None
    old, new = decode_names(saved), decode_names(current)
    if len(old) != saved_count:
        raise ValueError(
            f"state['names'] lists {len(old)} shards, state['shards'] is {saved_count}"
        )
    if old == new:
        return None
    by_name: dict[str, list[int]] = {}
    for j, n in enumerate(new):
        by_name.setdefault(n.rsplit("/", 1)[-1], []).append(j)
    found = [
        [j for j in by_name.get(n.rsplit("/", 1)[-1], ()) if _same_shard(n, new[j])] for n in old
    ]
    missing = [n for n, f in zip(old, found) if not f]
    if missing:
        raise ValueError(
            f"{len(missing)} shard(s) of the saved run are not in this pipeline's list: "
            f"{_listed(missing)}; removed or replaced shards cannot be resumed (their "
            "progress would be lost or other data delivered in their place): restore them, "
            "or start the epoch without load_state_dict()"
        )
    taken = Counter(j for f in found for j in f)
    ambiguous = sorted({n for n, f in zip(old, found) if len(f) > 1 or taken[f[0]] > 1})
    if ambiguous:
        raise ValueError(
            f"the shard list changed and these names are not unique, so the saved "
            f"positions cannot be mapped to shards: {_listed(ambiguous)}; shards are "
            "identified by name (last path component, query string dropped): keep the "
            "saved order, or give the shards unique names"
        )
    return [f[0] for f in found]
