"""The manifest of a ``ShardCache`` (``streambuf.io.cache``): what it records, how
it is read without a lock and changed under one.

``manifest.json`` holds ``{"version", "entries": {key: {file, url, size, crc32, written,
used, checked}}, "reserved": {tmp name: {key, file, size, t}}}``. It is only ever replaced
whole (written to ``manifest.json.part``, then ``os.replace``), so a reader without the
lock sees one complete version. Changes happen under ``lock`` (``flock``, exclusive),
held for milliseconds; waiting for it is bounded by ``LOCK_TIMEOUT_S``, and once a wait
runs out the lock is tried without waiting until it is taken again. A manifest this
version did not write (or one naming files outside ``data/`` and ``tmp/``) is refused:
``Unavailable``, and the cache is off until it is deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ._cache_io import close_fd, open_fd

__all__ = [
    "LOCK_TIMEOUT_S",
    "VERSION",
    "Manifest",
    "Unavailable",
    "check_manifest",
    "make_room",
    "used_bytes",
]

VERSION = 1
LOCK_TIMEOUT_S = 10.0  # the lock is held for milliseconds; longer means a hung process
STUCK_POLL_S = 0.1  # once a wait ran out: how long later updates poll (a healthy holder's
# milliseconds pass; a hung one costs this, not LOCK_TIMEOUT_S)


class Unavailable(Exception):
    """The cache cannot be used right now (the caller streams instead)."""


class Manifest:
    """The manifest under ``root`` (a cache's ``.streambuf`` folder). ``warn(kind,
    message)`` reports an unreadable one. Thread-safe."""

    def __init__(self, root: Path, *, warn: Callable[[str, str], None]) -> None:
        self.path = root / "manifest.json"
        self.lock_path = root / "lock"
        self._warn = warn
        self._snap: tuple[tuple[int, ...], dict[str, Any]] | None = None
        # the lock was found held past LOCK_TIMEOUT_S (a hung or stopped process): later
        # updates poll it for STUCK_POLL_S only, until one takes it (each open paid the
        # whole timeout again: 10 s per shard while the process hung)
        self._stuck = False

    def read(self) -> dict[str, Any]:
        """The manifest as it is now (a fresh copy: the caller may change it)."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return _empty()
        except OSError as exc:
            raise Unavailable(f"cannot read {self.path}: {exc}") from exc
        return self._parse(text)

    def snapshot(self) -> dict[str, Any]:
        """The manifest for looking up (never to be changed): parsed once per version of
        the file (each write replaces it: a new inode)."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                version = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                snap = self._snap
                if snap is not None and snap[0] == version:
                    return snap[1]
                text = f.read()
        except FileNotFoundError:
            return _empty()
        except OSError as exc:
            raise Unavailable(f"cannot read {self.path}: {exc}") from exc
        m = self._parse(text)
        self._snap = (version, m)
        return m

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """The manifest under the cross-process lock; written back (atomically) on exit,
        if it changed. Raises ``Unavailable`` when it cannot be locked, read or written."""
        try:
            fd = open_fd(self.lock_path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise Unavailable(f"cannot open {self.lock_path}: {exc}") from exc
        try:
            deadline = time.monotonic() + (STUCK_POLL_S if self._stuck else LOCK_TIMEOUT_S)
            delay = 0.001
            while True:  # flock has no timeout: poll, briefly (holders take milliseconds)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._stuck = False
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        was_stuck, self._stuck = self._stuck, True
                        raise Unavailable(
                            f"the cache lock {self.lock_path} is still held (a hung "
                            "process?): not waiting for it until it is free"
                            if was_stuck
                            else f"the cache lock {self.lock_path} was held for more than "
                            f"{LOCK_TIMEOUT_S:g} s (a hung process?); later opens stream "
                            "without waiting for it, until it is free again"
                        ) from None
                    time.sleep(delay)
                    delay = min(2 * delay, 0.02)
            m = self.read()
            before = json.dumps(m, sort_keys=True)
            yield m
            text = json.dumps(m, sort_keys=True)
            if text != before:
                part = self.path.with_name("manifest.json.part")
                try:
                    part.write_text(text, encoding="utf-8")
                    os.replace(part, self.path)
                except OSError as exc:  # what was done on disk meanwhile heals (dead writers)
                    raise Unavailable(f"cannot write {self.path}: {exc}") from exc
        finally:
            close_fd(fd)

    def _parse(self, text: bytes) -> dict[str, Any]:
        try:
            m = json.loads(text)
            check_manifest(m)
        except ValueError as exc:
            self._warn(
                "manifest",
                f"the cache manifest {self.path} is unreadable ({exc}); the cache is off "
                f"until it is fixed: delete {self.path.parent} to reset the cache",
            )
            raise Unavailable(str(exc)) from exc
        return dict(m)


def _empty() -> dict[str, Any]:
    return {"version": VERSION, "entries": {}, "reserved": {}}


_KEY = re.compile(r"[0-9a-f]{32}")
_ENTRY_FILE = re.compile(r"[0-9a-f]{32}-[A-Za-z0-9._-]{0,64}")
_TMP_FILE = re.compile(r"[0-9]+-[0-9a-f]{32}")


def check_manifest(m: Any) -> None:
    """Raise ``ValueError`` unless ``m`` is a manifest this version wrote. File names are
    checked too: whatever the manifest says, nothing outside ``data/`` and ``tmp/`` is
    ever deleted."""
    if not isinstance(m, dict) or m.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} manifest")
    entries, reserved = m.get("entries"), m.get("reserved")
    if not isinstance(entries, dict) or not isinstance(reserved, dict):
        raise ValueError("no entries or reservations")
    for k, e in entries.items():
        if not (
            _KEY.fullmatch(k)
            and isinstance(e, dict)
            and isinstance(e.get("file"), str)
            and _ENTRY_FILE.fullmatch(e["file"])
            and isinstance(e.get("size"), int)
            and isinstance(e.get("crc32"), int)
        ):
            raise ValueError(f"a bad entry record {e!r}")
    for tmp, r in reserved.items():
        if not (
            _TMP_FILE.fullmatch(tmp)
            and isinstance(r, dict)
            and isinstance(r.get("key"), str)
            and _KEY.fullmatch(r["key"])
            and isinstance(r.get("file"), str)
            and _ENTRY_FILE.fullmatch(r["file"])
            and isinstance(r.get("size"), int)
        ):
            raise ValueError(f"a bad reservation record {r!r}")


def used_bytes(m: Mapping[str, Any]) -> int:
    return sum(int(e["size"]) for e in m["entries"].values()) + sum(
        int(r["size"]) for r in m["reserved"].values()
    )


def make_room(
    m: dict[str, Any],
    size: int,
    *,
    limit: int,
    keep: frozenset[str],
    data: Path,
    tmp: Path,
    writer_alive: Callable[[str], bool],
) -> int | None:
    """Under the lock: make ``size`` more bytes fit within ``limit`` in manifest ``m``;
    the number of entries evicted, or None (nothing evicted) when they cannot fit.

    First reservations whose writer died (``writer_alive(key)`` is False: nobody holds
    the key's lock) are dropped with their temp file and any entry file they had renamed
    into place; then entries whose key is not in ``keep`` are evicted, least recently
    used first, skipping those being read (their ``LOCK_SH`` makes ``LOCK_EX | LOCK_NB``
    fail). Only files ``m`` records are deleted."""
    if used_bytes(m) + size <= limit:
        return 0
    for name, r in list(m["reserved"].items()):
        if writer_alive(r["key"]):
            continue
        del m["reserved"][name]
        with contextlib.suppress(FileNotFoundError):
            (tmp / name).unlink()
        if r["key"] not in m["entries"]:  # a crash between rename and manifest
            with contextlib.suppress(FileNotFoundError):
                (data / r["file"]).unlink()
    need = used_bytes(m) + size - limit
    if need <= 0:
        return 0
    victims: list[tuple[str, int]] = []  # (key, fd holding LOCK_EX)
    try:
        order = sorted(
            (k for k in m["entries"] if k not in keep),
            key=lambda k: (m["entries"][k].get("used", 0), k),
        )
        for k in order:
            if need <= 0:
                break
            rec = m["entries"][k]
            try:
                fd = open_fd(data / rec["file"], os.O_RDONLY)
            except FileNotFoundError:  # already gone: just forget it
                del m["entries"][k]
                need -= int(rec["size"])
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # in use by a reader
                close_fd(fd)
                continue
            victims.append((k, fd))
            need -= int(rec["size"])
        if need > 0:
            return None
        for k, _ in victims:
            rec = m["entries"].pop(k)
            with contextlib.suppress(FileNotFoundError):
                (data / rec["file"]).unlink()
        return len(victims)
    finally:
        for _, fd in victims:
            close_fd(fd)
