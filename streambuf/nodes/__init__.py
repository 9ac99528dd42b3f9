"""streambuf's bounds inside ``torchdata.nodes`` graphs.

* ``Prefetcher(source, *, max_items, max_bytes)``: ``torchdata.nodes.Prefetcher`` with a
  byte bound as well as a count.
* ``ParallelMapper(source, map_fn, *, threads, max_items=None, max_bytes, in_order=True)``:
  a threaded map whose items being made and finished count against the byte bound.
* ``PipelineNode(pipeline)``: a ``streambuf.Pipeline`` as a source node, with its state.

Each follows the ``BaseNode`` contract (``reset(initial_state=None)``, ``next``,
``get_state``), nests its source's state, stops its threads on ``reset``, ``shutdown()``
and garbage collection (bounded joins), and re-raises a thread's exception as the same
object with a note. See docs/nodes.md.
"""

from __future__ import annotations

try:
    import torchdata.nodes  # noqa: F401
except ImportError as exc:  # a hard dependency, but say what to install if it is missing
    raise ImportError(
        "streambuf.nodes needs torchdata.nodes (torchdata >= 0.10): pip install 'torchdata>=0.10'"
    ) from exc

from .map import ParallelMapper
from .pipeline import PipelineNode
from .prefetch import Prefetcher

__all__ = ["ParallelMapper", "PipelineNode", "Prefetcher"]
