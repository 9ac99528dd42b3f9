"""``ShardOptions``: every option of reading tar shards, defined and validated once.

``shards()`` (the public entry point, whose keyword arguments mirror these fields one
for one: a test holds them equal), ``stream_shards()`` and the per-worker reader all pass
this one object along; nothing below re-lists them. Validation happens when it is built,
in the calling process, so a bad value fails at ``shards(...)`` with a message naming
the argument, never later in a worker.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .._failures import FailurePolicy, OnError
from .._units import (
    check_choice,
    check_count_or_auto,
    check_int,
    check_seconds,
    parse_bytes,
    parse_count,
    parse_optional_bytes,
)
from ..buffer import Order

__all__ = ["AUTO_LANES", "ShardOptions"]

# lanes="auto": the lanes a slot reads at once. A constant, not a measurement: the
# round-robin order (and so a resume's cursors) follows from the count, which must not
# depend on timing; whether the lanes run on threads or in the consumer is measured
# (``adaptive``). Eight requests in flight per worker cover 50 ms of latency at
# 4 MB/s per connection for 64 KiB samples (``streambuf bench network``).
AUTO_LANES = 8


@dataclass(frozen=True)
class ShardOptions:
    """How shards are read (see ``streambuf.shards`` for each field's meaning)."""

    lanes: int | str = 3
    max_items: int = 64
    max_bytes: int | str = "256MiB"
    order: Order = "round_robin"
    adaptive: bool = True
    max_concurrent_io: int | None = None
    readahead_bytes: int | str = "1MiB"
    on_error: OnError = "raise"
    max_failures: int | None = None
    storage_options: Mapping[str, Any] | None = None
    retries: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    timeout_s: float = 30.0
    min_rate_bps: float | None = 1024
    rate_window_s: float = 10.0
    block_bytes: int | str = "1MiB"
    max_request_bytes: int | str | None = None
    max_member_bytes: int | str = "1GiB"
    max_sample_bytes: int | str | None = None
    max_shard_bytes: int | str | None = "64GiB"
    cache_dir: str | None = None
    cache_limit: int | str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        check_count_or_auto(self.lanes, name="lanes")
        parse_count(self.max_items, name="max_items")
        put(self, "max_bytes", parse_bytes(self.max_bytes, name="max_bytes"))
        check_choice(self.order, name="order", choices=("round_robin", "first_ready"))
        if not isinstance(self.adaptive, bool):
            raise TypeError(f"adaptive={self.adaptive!r} must be True or False")
        if self.max_concurrent_io is not None:
            parse_count(self.max_concurrent_io, name="max_concurrent_io")
        ra = parse_bytes(self.readahead_bytes, name="readahead_bytes", allow_zero=True)
        put(self, "readahead_bytes", ra)
        FailurePolicy(self.on_error, self.max_failures, stage="shards")  # validates both
        if self.max_failures is not None:
            check_int(self.max_failures, name="max_failures")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise TypeError(f"storage_options={self.storage_options!r} must be a dict or None")
        put(self, "storage_options", dict(self.storage_options) if self.storage_options else None)
        check_int(self.retries, name="retries")
        check_seconds(self.backoff_s, name="backoff_s", allow_zero=True)
        check_seconds(self.max_backoff_s, name="max_backoff_s", allow_zero=True)
        check_seconds(self.timeout_s, name="timeout_s")
        if self.min_rate_bps is not None:
            rate = self.min_rate_bps
            if (
                isinstance(rate, bool)
                or not isinstance(rate, int | float)
                or not math.isfinite(rate)
                or rate < 0
            ):
                raise ValueError(
                    f"min_rate_bps={rate!r} must be bytes per second >= 0 (0 or None: no rule)"
                )
        check_seconds(self.rate_window_s, name="rate_window_s")
        put(self, "block_bytes", parse_bytes(self.block_bytes, name="block_bytes"))
        put(
            self,
            "max_request_bytes",
            parse_optional_bytes(self.max_request_bytes, name="max_request_bytes"),
        )
        put(self, "max_member_bytes", parse_bytes(self.max_member_bytes, name="max_member_bytes"))
        put(
            self,
            "max_sample_bytes",
            parse_optional_bytes(self.max_sample_bytes, name="max_sample_bytes"),
        )
        put(
            self,
            "max_shard_bytes",
            parse_optional_bytes(self.max_shard_bytes, name="max_shard_bytes"),
        )
        cache_dir, cache_limit = check_cache_options(self.cache_dir, self.cache_limit)
        put(self, "cache_dir", cache_dir)
        put(self, "cache_limit", cache_limit)

    @property
    def threads(self) -> str | None:
        """Threads over a slot's lanes: ``"auto"`` (tuned at run time) for
        ``lanes="auto"``, else None (one thread per lane)."""
        return "auto" if self.lanes == "auto" else None

    @property
    def lane_count(self) -> int:
        """Lanes a slot reads at once: ``lanes``, or ``AUTO_LANES`` for ``"auto"``."""
        return AUTO_LANES if self.lanes == "auto" else int(self.lanes)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def pick(cls, kwargs: Mapping[str, Any]) -> ShardOptions:
        """Build from the entries of ``kwargs`` that are options (others are ignored)."""
        return cls(**{k: v for k, v in kwargs.items() if k in cls.names()})

    def transport(self) -> dict[str, Any]:
        """Keyword arguments of ``open_stream`` (without the per-call ones)."""
        return {
            k: getattr(self, k)
            for k in (
                "storage_options",
                "retries",
                "backoff_s",
                "max_backoff_s",
                "timeout_s",
                "block_bytes",
                "max_request_bytes",
                "min_rate_bps",
                "rate_window_s",
            )
        }

    def tar(self) -> dict[str, Any]:
        """Keyword arguments of ``iter_tar_records`` (the untrusted-shard limits)."""
        return {
            "max_member_bytes": self.max_member_bytes,
            "max_sample_bytes": self.max_sample_bytes,
            "max_shard_bytes": self.max_shard_bytes,
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_cache_options(cache_dir: Any, cache_limit: Any) -> tuple[str | None, int | None]:
    """``(cache_dir, cache_limit)`` checked together, for every reader that caches (shards,
    videos): both or neither; the folder usable, the limit a byte size."""
    folder = _check_cache_dir(cache_dir)
    if folder is None:
        if cache_limit is not None:
            raise ValueError(
                f"cache_limit={cache_limit!r} needs cache_dir= (the node-local folder to "
                "cache remote objects in)"
            )
        return None, None
    if cache_limit is None:
        raise ValueError(
            f"cache_dir={cache_dir!r} needs cache_limit=, the most bytes the cache may hold "
            "(e.g. cache_limit='200GiB': what this node's disk can spare; see docs/cache.md)"
        )
    return folder, parse_bytes(cache_limit, name="cache_limit")


def _check_cache_dir(value: Any) -> str | None:
    """``cache_dir`` as a ``str``: an existing writable folder, or one that can be made
    (its nearest existing parent is a writable folder). Nothing is created here."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"cache_dir={value!r} must be a path (str or os.PathLike) or None")
    if not os.fspath(value).strip():
        raise ValueError(
            f"cache_dir={value!r} is empty (it would cache in the working directory); "
            "pass a node-local folder, e.g. cache_dir='/local/scratch/shards', or None"
        )
    path = os.path.abspath(os.fspath(value))
    if "://" in os.fspath(value):
        raise ValueError(f"cache_dir={value!r} must be a local folder, not a URL")
    try:
        import fcntl  # noqa: F401  (the cache's cross-process locks)
    except ImportError:
        raise ValueError("cache_dir= needs fcntl file locks (Linux, macOS)") from None
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"cache_dir={value!r}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(
            f"cache_dir={value!r}: {probe} is not writable by this user; pass a folder you "
            "can write to (node-local disk)"
        )
    return path
