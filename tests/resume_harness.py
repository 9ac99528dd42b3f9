"""The suite's view of the public save/load harness (``streambuf.testing``): the same
functions with this suite's sample identities (``ids_of``: tensor ints, WebDataset keys,
clip sources and indices) as the default, and ``counted_once``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from streambuf import testing

Ids = Callable[[Any], list[Any]]


def ids_of(batch: Any) -> list[Any]:
    """Sample identities of a batch: ints of a tensor, keys of WebDataset samples, or
    (source, clip index) of clips."""
    if isinstance(batch, dict) and "__key__" in batch:
        return list(batch["__key__"])
    data = getattr(batch, "clip_index", None)
    if data is not None:
        return list(zip(batch.source, [int(i) for i in data]))
    return [int(x) for x in batch]


# the public harness with this suite's ids as the default (keyword ``ids=`` overrides)
roundtrip = testing.roundtrip
epoch_batches = functools.partial(testing.epoch_batches, ids=ids_of)
save_after = functools.partial(testing.save_after, ids=ids_of)
resume_and_finish = functools.partial(testing.resume_and_finish, ids=ids_of)
resume_in_fresh_process = functools.partial(testing.resume_in_fresh_process, ids=ids_of)
check_save_load = functools.partial(testing.check_save_load, ids=ids_of)


def counted_once(delivered: Sequence[Any], expected: Sequence[Any]) -> None:
    """Every expected sample exactly once (no loss, no duplicate), with counts shown."""
    from collections import Counter

    c = Counter(delivered)
    dups = sorted((k, v) for k, v in c.items() if v > 1)
    missing = sorted(set(expected) - set(c))
    extra = sorted(set(c) - set(expected))
    assert not dups and not missing and not extra, (
        f"{len(delivered)} delivered for {len(expected)}: duplicates {dups[:10]}, "
        f"missing {missing[:10]}, unexpected {extra[:10]}"
    )
