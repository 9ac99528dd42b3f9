"""``PipelineNode``: a ``streambuf.Pipeline`` as a ``torchdata.nodes`` source node, in
this process, with its state.

Each ``reset`` starts one iteration of the pipeline as the copy ``pipeline.context()``
describes: rank and world size from ``torch.distributed`` (or the pipeline's own
``rank=``/``world_size=``), the worker split when it runs inside a DataLoader worker,
the epoch from ``pipeline.epoch``. Its stages keep their own threads and byte bounds.

Epochs (torchdata's semantics): ``reset()`` restarts the iteration at ``pipeline.epoch``;
it never advances the epoch by itself: call ``pipeline.set_epoch(e)`` before an epoch,
as with ``streambuf.Loader``. ``reset(state)`` restores the epoch the state was saved in.

State: ``get_state()`` is the pipeline's own state format (``streambuf._state``: the
same dict ``Pipeline.state_dict()`` returns), describing exactly the items ``next()``
returned. ``reset(state)`` resumes it as ``Pipeline.load_state_dict`` would (exactly in
the same layout, elastically in another), except for a state saved at the end of an
epoch: torchdata expects that to resume *exhausted* (``next()`` raises
``StopIteration``; torchdata's ``Loader`` then calls ``reset()`` again), so it does.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torchdata.nodes import BaseNode

from .. import _state
from .._iteration import Iteration
from ..pipeline import Pipeline

__all__ = ["PipelineNode"]


def _close(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        try:
            close()
        except ValueError:  # "generator already executing": its own thread will end it
            pass


class PipelineNode(BaseNode[Any]):
    """Iterate ``pipeline`` (a ``streambuf.Pipeline`` over a sequence of shards or
    items) as a ``torchdata.nodes.BaseNode``; see the module docstring.

    Ownership: the node owns the iteration (and the stage threads inside it) from
    ``reset`` to the next ``reset``, ``shutdown()`` or garbage collection, which close it.
    """

    def __init__(self, pipeline: Pipeline, /) -> None:
        super().__init__()
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"pipeline={pipeline!r} must be a streambuf.Pipeline")
        refused = pipeline._src.state_refusal()
        if refused is not None:
            raise ValueError(f"PipelineNode needs a pipeline with a state to save: {refused}")
        self.pipeline = pipeline
        self._iteration: Iteration | None = None
        self._it: Iterator[Any] | None = None
        self._ended_state: dict[str, Any] | None = None  # resumed at the end of an epoch
        self._stop: weakref.finalize | None = None
        self._unpickled = False

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Close the current iteration and start one: at ``pipeline.epoch`` from its
        start, or where ``initial_state`` (this node's ``state_dict()``) left off."""
        super().reset(initial_state)
        self.shutdown()
        self._unpickled = False
        pipe = self.pipeline
        self._ended_state = None
        ctx = pipe.context()
        resume = progress = None
        if initial_state is not None:
            plan = _state.check_loadable(pipe, initial_state)
            if plan["complete"]:
                pipe.set_epoch(plan["epoch"])
                self._ended_state = initial_state
                return
            resume, progress, ctx = _state.plan_pipeline(pipe, ctx, plan)
        self._iteration = pipe._iterate(ctx, stage_bytes=None, resume=resume, progress=progress)
        it = iter(self._iteration)
        self._it = it
        self._stop = weakref.finalize(self, _close, it)

    def next(self) -> Any:
        if self._it is None:
            if self._unpickled:  # its iteration stayed in the other process
                self.reset()
                return self.next()
            raise StopIteration  # resumed exhausted, or shut down
        return next(self._it)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles as configuration (the pipeline): a copy starts a fresh iteration."""
        state = self.__dict__.copy()
        state.update(_iteration=None, _it=None, _ended_state=None, _stop=None, _unpickled=True)
        return state

    def get_state(self) -> dict[str, Any]:
        """The pipeline's state (``Pipeline.state_dict()``'s format) as of the last item
        ``next()`` returned; JSON-serialisable."""
        if self._unpickled:
            self.reset()
        if self._ended_state is not None:
            return self._ended_state
        return _state.pipeline_state(self.pipeline, self._iteration)

    def shutdown(self) -> None:
        """Close the iteration: stop its stage threads (bounded joins). Idempotent; the
        state stays readable, ``next()`` raises ``StopIteration`` until ``reset()``."""
        if self._stop is not None:
            self._stop()
            self._stop = None
        self._it = None
