"""How many of streambuf's modules one batch from a tar shard passes through (issue 24's
measure of the package's shape): profile hooks on every thread record the module of each
streambuf function called while a Loader delivers batches 2-5 of a local tar shard
pipeline: in process (the whole path, lanes included) and with 2 workers (the main
process's side only).

    python benchmarks/modules_on_path.py
"""

from __future__ import annotations

import io
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

import streambuf as sb


def write_shards(folder: Path, n_shards: int = 4, per_shard: int = 64) -> list[str]:
    urls = []
    for s in range(n_shards):
        path = folder / f"shard-{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                for ext, data in (("txt", f"sample {s}-{i}".encode()), ("cls", b"3")):
                    info = tarfile.TarInfo(f"{s:04d}{i:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        urls.append(str(path))
    return urls


def modules_on_path(urls: list[str], workers: int) -> set[str]:
    seen: set[str] = set()
    root = str(Path(sb.__file__).parent)
    active = [False]  # hooks on from the start (lane threads start with the iteration)

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and active[0]:
            name = frame.f_code.co_filename
            if name.startswith(root):
                seen.add(Path(name).relative_to(root).as_posix())

    pipe = sb.shards(urls, lanes=2).decode().to_tuple("txt", "cls").batch(16)
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        with sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="64MiB") as loader:
            it = iter(loader)
            next(it)
            active[0] = True
            for _ in range(4):
                next(it)
            active[0] = False
            it.close()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return seen


def main() -> dict[int, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        urls = write_shards(Path(tmp))
        out = {w: sorted(modules_on_path(urls, w)) for w in (0, 2)}
    for w, mods in out.items():
        where = "in process" if w == 0 else f"{w} workers (the main process's side)"
        print(f"{where}: {len(mods)} modules: {' '.join(mods)}")
    return out


if __name__ == "__main__":
    main()
