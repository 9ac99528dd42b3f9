"""Optional dependencies of the benchmarks, imported lazily, and the progress bar.

The peers (webdataset, moto, torchcodec) and the output helpers (matplotlib, tqdm) are
not dependencies of streambuf itself: ``pip install streambuf[bench]`` brings all but
torchcodec (whose PyPI wheel needs a CUDA build of torch). A benchmark asks for a module
when it needs it; a missing one is an ``ImportError`` naming the extra, or, for a peer
that may be absent (torchcodec, moto), a recorded "not importable: <reason>".
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType
from typing import Any

__all__ = ["Progress", "importable", "package_versions", "progress", "require"]

EXTRA = "pip install 'streambuf[bench]'"


def require(module: str, *, purpose: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError`` saying what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{purpose} needs the {module.split('.')[0]!r} package: {EXTRA}") from exc


def importable(module: str) -> str | None:
    """None when ``module`` imports; else ``"not importable: <reason>"`` (for the JSON)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken wheel raises OSError/RuntimeError, not only ImportError
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return f"not importable: {reason}"
    return None


def package_versions(*names: str) -> dict[str, str | None]:
    """Installed distribution versions (None when not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


class Progress:
    """A tqdm bar on stderr when tqdm is installed; silent otherwise."""

    def __init__(self, total: int, desc: str) -> None:
        self._bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)

    def step(self) -> None:
        if self._bar is not None:
            self._bar.update()

    def label(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(label)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int, desc: str) -> Progress:
    """``with progress(n, "latency") as bar: ... bar.step(name)``."""
    return Progress(total, desc)
