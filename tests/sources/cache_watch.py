"""A sampler of a cache folder's size, run in its own (spawned) process: its lock
descriptors can never be inherited by the DataLoader workers the test forks. Standard
library only, so it starts fast."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any


def _sizes(folder: Path) -> int:
    total = 0
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.startswith("foreign"):
                    continue
                try:
                    total += e.stat().st_size
                except FileNotFoundError:
                    pass
    except FileNotFoundError:
        pass
    return total


def watch(root: str, every_s: float, stop: Any, out: Any) -> None:
    """Every ``every_s``: take the cache's lock (so a rename or an eviction in between
    cannot make it count a file twice or miss one), add up the sizes of the entries and
    temp files under ``root`` (a ``.streambuf`` folder), release. Until ``stop`` is set;
    then put ``{"peak", "peak_tmp", "samples"}`` on ``out``."""
    base = Path(root)
    peak = peak_tmp = samples = 0
    out.put("started")
    while not stop.wait(every_s):
        try:
            fd = os.open(base / "lock", os.O_RDWR | os.O_CREAT)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a cache process holds it: sample at the next tick
            data, tmp = _sizes(base / "data"), _sizes(base / "tmp")
        finally:
            os.close(fd)
        peak, peak_tmp, samples = max(peak, data + tmp), max(peak_tmp, tmp), samples + 1
    out.put({"peak": peak, "peak_tmp": peak_tmp, "samples": samples})
