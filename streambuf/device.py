"""``DevicePrefetcher``: copy batches to the GPU ahead of the consumer, on a side stream.

For each batch: tensors are pinned (unless already pinned), copied with
``non_blocking=True`` on a dedicated CUDA stream, and an event is recorded. The consumer
gets a batch only after its stream waits on that event, and every tensor is marked with
``record_stream`` on the consumer's stream, so the caching allocator never reuses its
memory while the consumer's kernels may still read it. At most ``depth`` batches (and
``max_bytes`` bytes, oversize rule as everywhere) are on the device ahead of the user.

``device="cpu"`` (or any non-CUDA device) passes batches through (``.to(device)`` for
non-CPU devices), so code can be written once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ._units import parse_bytes, parse_count
from .sizing import nbytes

__all__ = ["DevicePrefetcher", "check_device", "map_tensors"]


def check_device(value: Any, *, name: str = "device") -> torch.device | None:
    """``value`` as a ``torch.device`` this process can use, or None (no device).

    Checked when the object is built, not at the first batch: an unknown name, or an
    accelerator that is not there (``"cuda"`` on a machine without CUDA, ``"cuda:3"``
    with two GPUs) raises ``ValueError`` naming the option and what this machine has.
    ``"cpu"`` is always accepted.

    Raises:
        TypeError: not a str, ``torch.device`` or None.
        ValueError: unknown device, or not available here.
    """
    if value is None:
        return None
    if not isinstance(value, str | torch.device):
        raise TypeError(f"{name}={value!r} must be a str like 'cuda', a torch.device or None")
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name}={value!r} is not a device torch knows: {exc}") from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"{name}={value!r} but CUDA is not available in this process "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); pass "
                f"{name}='cpu' or None, or install a CUDA build of torch on a GPU machine"
            )
        if dev.index is not None and dev.index >= count:
            raise ValueError(
                f"{name}={value!r} but this machine has {count} CUDA device(s) "
                f"(cuda:0..cuda:{count - 1})"
            )
        return dev
    backend = getattr(torch, dev.type, None)  # torch.mps, torch.xpu, ...
    available = getattr(backend, "is_available", None)
    if callable(available) and not available():
        raise ValueError(f"{name}={value!r} but {dev.type} is not available in this process")
    return dev


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor in nested dicts/lists/tuples/dataclasses."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)
    return obj


class DevicePrefetcher:
    """Iterate ``batches`` with each one already on ``device``.

    Args:
        batches: an iterable of batches (tensors in nested containers).
        device: "cuda", "cuda:1", torch.device, or "cpu".
        depth: batches copied ahead of the consumer (>= 1).
        max_bytes: device bytes ahead at most (None: no byte bound beyond depth).
        pin: pin host tensors before copying (needed for asynchronous copies).
    """

    def __init__(
        self,
        batches: Iterable[Any],
        /,
        *,
        device: str | torch.device,
        depth: int = 2,
        max_bytes: int | str | None = None,
        pin: bool = True,
    ) -> None:
        self._batches = batches
        checked = check_device(device, name="device")
        if checked is None:
            raise TypeError("device= is required (e.g. 'cuda')")
        self.device = checked
        self.depth = parse_count(depth, name="depth")
        self.max_bytes = None if max_bytes is None else parse_bytes(max_bytes)
        self.pin = pin
        self.copied = 0

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            if self.device.type == "cpu":
                yield from self._batches
            else:
                for b in self._batches:
                    yield map_tensors(b, lambda t: t.to(self.device))
            return
        yield from self._cuda()

    def _cuda(self) -> Iterator[Any]:
        side = torch.cuda.Stream(device=self.device)
        ahead: deque[tuple[Any, torch.cuda.Event, int]] = deque()
        held = 0

        def copy(t: torch.Tensor) -> torch.Tensor:
            if self.pin and t.device.type == "cpu" and not t.is_pinned():
                t = t.pin_memory()
            return t.to(self.device, non_blocking=True)

        def hand_over(entry: tuple[Any, torch.cuda.Event, int]) -> Any:
            batch, event, _ = entry
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)

            def mark(t: torch.Tensor) -> torch.Tensor:
                t.record_stream(current)
                return t

            map_tensors(batch, mark)
            return batch

        for batch in self._batches:
            with torch.cuda.stream(side):
                on_device = map_tensors(batch, copy)
                event = torch.cuda.Event()
                event.record(side)
            size = nbytes(on_device)
            ahead.append((on_device, event, size))
            held += size
            self.copied += 1
            while len(ahead) > self.depth or (
                self.max_bytes is not None and held > self.max_bytes and len(ahead) > 1
            ):
                entry = ahead.popleft()
                held -= entry[2]
                yield hand_over(entry)
        while ahead:
            entry = ahead.popleft()
            held -= entry[2]
            yield hand_over(entry)
