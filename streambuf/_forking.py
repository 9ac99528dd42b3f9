"""Forking DataLoader workers without running the parent's finalizers in them.

A forked worker inherits every object of the parent, garbage included: a reference
cycle the parent has not collected yet (an exception's traceback holding a decoder's
frames, say) is collected by the *worker's* garbage collector, whose finalizers then
run in a process where the threads those objects own do not exist. An FFmpeg filter
graph or frame-threaded decoder freed there waits forever for its threads (seen:
both workers of a Loader hung "Garbage-collecting" after the parent had decoded audio).

``frozen_for_fork``: around the fork, the parent's objects are moved to the
collector's permanent generation (``gc.freeze``), so the workers never collect (nor
finalize) anything they inherited, which also spares copy-on-write pages the
collector would touch; the parent unfreezes them right after. Spawn and forkserver
workers inherit nothing: a no-op there.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["frozen_for_fork"]


@contextmanager
def frozen_for_fork(start_method: str | None) -> Iterator[None]:
    """Freeze the collector's view of this process while workers are forked under
    ``start_method`` ("fork"), unfreeze after; a no-op for other start methods, or when
    the caller froze objects already (``gc.unfreeze`` would thaw theirs too)."""
    if start_method != "fork" or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
