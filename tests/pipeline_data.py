"""Picklable datasets and functions for pipeline/loader tests (spawn needs module level)."""

from __future__ import annotations

import os
import time

import torch


def shard_samples(shard: int) -> list[int]:
    """Shard ``s`` holds samples ``s*100 .. s*100 + size(s) - 1``; sizes vary (3..7)."""
    return [shard * 100 + i for i in range(shard_size(shard))]


def shard_size(shard: int) -> int:
    return 3 + (shard * 7) % 5


def all_samples(n_shards: int) -> list[int]:
    return [x for s in range(n_shards) for x in shard_samples(s)]


def ids_of(batch) -> list[int]:
    return [int(x) for x in batch]


def sleepy(x: int) -> int:
    time.sleep(0.002)
    return x


def big_sample(i: int) -> torch.Tensor:
    """A 1 MiB sample whose first element is its id (touches the memory)."""
    t = torch.ones(1 << 18, dtype=torch.float32)
    t[0] = i
    return t


def fail_on_13(x: int) -> int:
    if x == 13:
        raise ValueError(f"cannot decode sample {x}")
    return x


def slow_in_worker_1(x: int) -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None and info.id == 1:
        time.sleep(0.02)
    return x


def pid_sample(x: int) -> tuple[int, int]:
    return (x, os.getpid())


def mib_sample(i: int) -> torch.Tensor:
    """Exactly 1 MiB (256 Ki float32), first element = id: a batch of one is 1 MiB."""
    t = torch.zeros(1 << 18, dtype=torch.float32)
    t[0] = i
    return t


class KwOnlyError(Exception):
    """An exception torch's ExceptionWrapper cannot rebuild (``cls(message)`` fails)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):
        return (_kw_only_error, (self.args[0], self.code), self.__dict__)


def _kw_only_error(message: str, code: int) -> KwOnlyError:
    return KwOnlyError(message, code=code)


class UnbuildableError(Exception):
    """Pickles in the worker but cannot be rebuilt anywhere (its constructor needs a kw)."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


def raise_on_5(kind: str):
    """A map function raising ``kind`` on sample 5 (module level: spawn pickles it)."""
    return _Raiser(kind)


class _Raiser:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, x: int) -> int:
        if x != 5:
            return x
        import threading

        from streambuf import ShardError

        if self.kind == "value":
            raise ValueError("bad sample 5")
        if self.kind == "key":
            raise KeyError("field 'jpg'")
        if self.kind == "shard":
            raise ShardError("truncated member", stage="tar", source="s3://b/shard-5.tar")
        if self.kind == "kwonly":
            raise KwOnlyError("needs a code", code=7)
        if self.kind == "unbuildable":
            raise UnbuildableError("cannot come back", code=8)
        if self.kind == "unpicklable":
            err = ValueError("holds a lock")
            err.lock = threading.Lock()  # type: ignore[attr-defined]
            raise err
        if self.kind == "fake_worker_error":
            raise RuntimeError("DataLoader worker (pid 1) timed out (my own message)")
        raise AssertionError(self.kind)


def with_lock(x: int):
    """A sample no batch can pickle (a lock inside)."""
    import threading

    return {"x": x, "lock": threading.Lock()}


def quarter_mib(i: int) -> torch.Tensor:
    """A 256 KiB sample filled with its id (content checks survive slot reuse)."""
    return torch.full((1 << 16,), float(i), dtype=torch.float32)


def nap(item: tuple[int, float]) -> int:
    """``(id, seconds)``: sleep that long, return the id (stragglers among quick items)."""
    time.sleep(item[1])
    return item[0]


def mark_then_nap(item: tuple[int, float, str | None]) -> int:
    """``(id, seconds, marker)``: create the file ``marker`` (when given: the test then
    knows this item is being made), sleep, return the id."""
    if item[2] is not None:
        with open(item[2], "a"):
            pass
    time.sleep(item[1])
    return item[0]


def exit_zero_on_5(x: int) -> int:
    """A stage that ends its worker process with code 0 before its end of stream."""
    if x == 5:
        import sys

        sys.exit(0)
    return x


def exit_three_on_5(x: int) -> int:
    if x == 5:
        os._exit(3)
    return x


def segfault_on_5(x: int) -> int:
    if x == 5:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return x


def nap_ids(item: tuple[int, float]) -> int:
    time.sleep(item[1])
    return item[0]


def slow_key(sample: dict) -> str:
    """A tar sample's key after 100 ms (a slow decode)."""
    time.sleep(0.1)
    return sample["__key__"]


class LookupFailed(Exception):
    """A user exception with a keyword-only attribute (torch's wrapper loses both)."""

    def __init__(self, message: str, *, key: int) -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self):
        return (_rebuild_lookup_failed, (str(self), self.key))


def _rebuild_lookup_failed(message: str, key: int) -> LookupFailed:
    return LookupFailed(message, key=key)


def chained_on_3(x: int) -> int:
    """Item 3: ``raise ValueError from LookupFailed`` whose own context is a KeyError;
    item 4: an implicit context only (raised while handling a ZeroDivisionError)."""
    if x == 3:
        try:
            try:
                {}[x]
            except KeyError:
                raise LookupFailed("no such key", key=x) from None
        except LookupFailed as inner:
            inner.add_note("looked in the index")
            raise ValueError(f"cannot read sample {x}") from inner
    if x == 4:
        try:
            x / 0
        except ZeroDivisionError:
            raise RuntimeError("while dividing")  # noqa: B904 (the implicit context is the point)
    return x


class BuiltLog:
    """A stage after ``batch()`` that counts, per worker, the batches built and their
    bytes in shared memory (one writer per slot, no lock): what the workers produced,
    measured outside the budget. Picklable for spawn (shared ctypes travel at start)."""

    def __init__(self, ctx, num_workers: int) -> None:
        self.slots = ctx.RawArray("q", 2 * num_workers)

    def __call__(self, batch):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        w = info.id if info is not None else 0
        self.slots[2 * w] += 1
        self.slots[2 * w + 1] += tensor_bytes(batch)
        return batch

    def totals(self) -> tuple[int, int]:
        s = list(self.slots)
        return sum(s[0::2]), sum(s[1::2])


def tensor_bytes(batch) -> int:
    """Bytes of the tensors in a batch, computed here (element size x count)."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.numel()
    if isinstance(batch, (list, tuple)):
        return sum(tensor_bytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(tensor_bytes(b) for b in batch.values())
    return 0
