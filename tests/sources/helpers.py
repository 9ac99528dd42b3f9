"""Shard builders shared by the source tests (deterministic content)."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def make_samples(
    shard: int, n: int, *, payload: int = 1000, random_payload: bool = True
) -> list[dict[str, bytes]]:
    """``n`` samples for shard ``shard``: key ``s{shard:03d}/{i:05d}``, fields txt/cls/bin
    (``bin``: ``payload`` random bytes, or the byte ``i % 256`` repeated, which is faster)."""
    rng = random.Random(shard)
    out = []
    for i in range(n):
        key = f"s{shard:03d}/{i:05d}"
        out.append(
            {
                "__key__": key.encode(),
                "txt": f"sample {key}".encode(),
                "cls": str(i % 10).encode(),
                "bin": rng.randbytes(payload) if random_payload else bytes([i % 256]) * payload,
            }
        )
    return out


def write_tar(
    path: Path,
    samples: Iterable[Mapping[str, bytes]],
    *,
    gz: bool = False,
    fmt: int = tarfile.USTAR_FORMAT,
) -> Path:
    """Write samples as ``key.field`` members with tarfile (sorted fields, like webdataset)."""
    with tarfile.open(path, "w:gz" if gz else "w", format=fmt) as tf:
        for sample in samples:
            key = sample["__key__"].decode()
            for name in sorted(k for k in sample if not k.startswith("__")):
                add_member(tf, f"{key}.{name}", sample[name])
    return path


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mtime = 1_700_000_000
    tf.addfile(ti, io.BytesIO(data))


def make_shards(
    root: Path, count: int, per_shard: int, *, payload: int = 1000, random_payload: bool = True
) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    return [
        write_tar(
            root / f"shard-{s:06d}.tar",
            make_samples(s, per_shard, payload=payload, random_payload=random_payload),
        )
        for s in range(count)
    ]


def expected_keys(count: int, per_shard: int) -> set[str]:
    return {f"s{s:03d}/{i:05d}" for s in range(count) for i in range(per_shard)}


def member_offsets(path: Path) -> dict[str, int]:
    """Member name -> byte offset of its data in the (uncompressed) tar file."""
    with tarfile.open(path) as tf:
        return {m.name: m.offset_data for m in tf.getmembers()}


@contextmanager
def switching_lanes() -> Iterator[None]:
    """Shard lanes that switch between threads and inline every few samples (every
    ``SourceRun`` built inside, and in DataLoader workers forked inside): the order,
    exactly-once and resume oracles then cover both modes and the switch itself."""
    import streambuf._source as source_mod
    from streambuf._inline import InlineChooser

    def switchy(window: int, **kw: object) -> InlineChooser:
        return InlineChooser(4, min_window_s=0.0, min_interval_s=0.0, max_interval_s=0.0)

    saved = source_mod.InlineChooser
    source_mod.InlineChooser = switchy  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        source_mod.InlineChooser = saved  # type: ignore[misc]


class _CyclingTuner:
    """A ``ThreadTuner`` double for ``SourceRun``: a new count every ``every`` items,
    cycling through ``counts`` (records each count it handed out in ``seen``)."""

    seen: list[int] = []

    def __init__(self, counts: list[int], every: int, *, max_threads: int, **kw: object) -> None:
        self.counts = [max(1, min(c, max_threads)) for c in counts]
        self.every, self.n, self.i = every, 0, 0
        self.count = self.counts[0]
        self.history: list[Any] = []

    def tick(self) -> int | None:
        self.n += 1
        if self.n % self.every:
            return None
        self.i = (self.i + 1) % len(self.counts)
        self.count = self.counts[self.i]
        _CyclingTuner.seen.append(self.count)
        return self.count

    def restart(self) -> None:
        pass

    def detach(self) -> None:
        pass


@contextmanager
def changing_threads(counts: list[int], every: int = 5) -> Iterator[list[int]]:
    """Shard lanes whose thread count (``lanes="auto"``) changes every ``every`` samples,
    cycling through ``counts`` (every ``SourceRun`` built inside, and in DataLoader
    workers forked inside); yields the counts handed out in this process."""
    import functools

    import streambuf._source as source_mod

    saved = source_mod.ThreadTuner
    _CyclingTuner.seen = []
    source_mod.ThreadTuner = functools.partial(  # type: ignore[misc]
        _CyclingTuner, counts, every
    )
    try:
        yield _CyclingTuner.seen
    finally:
        source_mod.ThreadTuner = saved  # type: ignore[misc]
