"""The public stage contract: ``Stage``, the base class of a stage you write, added to a
pipeline with ``Pipeline.compose(stage)`` (webdataset's name for it).

A stage is configuration (picklable: it crosses into DataLoader workers) with one
method, ``iterate(samples, state)``: a generator that pulls samples from ``samples`` and
yields outputs. The pipeline keeps the books that make it exact on resume:

* **Groups.** Each output is made from the samples pulled since the previous output (at
  least one); they are settled (owed to nobody) when that output is delivered, and the
  samples pulled after the last output are dropped when ``iterate`` returns. So a stage
  may map (1 -> 1), filter (n -> 1), or hold samples (a window of n -> 1 list). Fan-out
  (one sample into several outputs) is ``.flatten()``'s: yielding twice without pulling
  raises ``TypeError``.
* **Owned state** (``owns_state = True``): ``state.value`` is what the stage keeps
  across samples (plain, JSON-safe data; None at the start of an epoch). Assign it
  *before* yielding the output it goes with: a checkpoint saves the value at the yield
  before the first group not yet delivered, and a resumed ``iterate`` starts from that
  value and is given the samples of every group not delivered, in the same order. A
  deterministic stage then makes the same outputs. So nothing after the stage may
  deliver its outputs out of order (``.shuffle()``, ``map(ordered=False)`` with
  threads): the outputs delivered after an undelivered one would not be given again and
  their part of the value would be lost; the pipeline warns when built and
  ``load_state_dict()`` refuses a state saved mid-epoch, naming both stages (put the
  shuffle before the stage). The
  value is checked to be JSON data at every snapshot (a ``TypeError`` naming the stage
  at the first batch, not at a save).
* **Randomness.** ``state.seed`` is a seed of (pipeline seed, epoch, rank, worker,
  stage index): seed a generator with it and count its draws in ``state.value`` to
  resume exactly. A stage drawing from global randomness makes other outputs after a
  resume (as does a random function given to ``map``: a sample in flight at the save is
  mapped again on resume).
* **Capabilities**, declared as class attributes: ``holds_samples`` (keeps samples
  across outputs, e.g. a window; they stay pending in the checkpoint and are read again
  on resume), ``owns_state`` (``state.value`` is saved). Neither is needed for a 1 -> 1
  or n -> 1 stage without memory.
* **Fixed memory.** A stage holding a buffer of known size in each worker, whatever the
  budget (a block filled in place), returns its bytes from ``fixed_bytes()``: a
  ``Loader`` takes them out of ``max_bytes`` before the rest is shared.
* **Fingerprint.** ``config()`` (default: the instance's public attributes) is part of
  the state's fingerprint: a state saved with another configuration does not load.
  Values JSON cannot hold are written the same in every process: a function or class
  by module and name, a set sorted, anything else by its ``repr`` without addresses.
* **Groups and ``.flatten()``.** A group's output that is a list of samples, flattened,
  is settled when its last child is delivered (every sample of the group with it); a
  resume gives the whole group to the stage again and skips the children delivered.
* **Errors** raised by the stage carry a note naming it; one raised upstream (a map, the
  source) and passed through its pull keeps only its own notes.
* **Limits.** An elastic resume (another worker count or world size) starts each
  stage's state afresh (``state.value`` None) with the samples it has left; a stage
  cannot follow ``.batch()`` and cannot be in a pipeline given to ``mix()`` (a mix makes
  pending samples again one at a time, by position).

``streambuf.testing.check_resume(make_pipeline)`` proves a stage resumes exactly.
"""

from __future__ import annotations

import copy
import json
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ._ledger import Rec
from .errors import add_note
from .stages import Env
from .stages import Stage as _Stage

__all__ = ["Stage", "StageState"]


@dataclass
class StageState:
    """What one run of a stage keeps (``Stage.iterate``'s second argument): ``value``
    (yours: plain data, saved when ``owns_state``), ``seed`` and ``epoch`` (given)."""

    value: Any
    seed: int
    epoch: int


class Stage(_Stage):
    """Base class of a user stage; see the module docstring for the contract."""

    holds_samples: ClassVar[bool] = False
    owns_state: ClassVar[bool] = False
    replays: ClassVar[bool] = False  # cannot be made again from one position (mix)

    @property
    def name(self) -> str:  # type: ignore[override]
        return type(self).__name__

    def iterate(self, samples: Iterator[Any], state: StageState) -> Iterator[Any]:
        """Pull from ``samples``, yield outputs (see the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must define iterate(samples, state)")

    def config(self) -> dict[str, Any]:
        """The configuration that must match between a save and a load."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def fingerprint(self) -> str:
        cfg = json.dumps(self.config(), sort_keys=True, default=_stable)
        return f"{type(self).__module__}.{type(self).__qualname__}{cfg}"

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        env.grouping = self.name
        run = _Run(self, env, k, state)
        if self.owns_state:
            env.snapshots[k] = run.snapshot
        return run.run(up)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable(value: Any) -> Any:
    """A configuration value JSON cannot hold, as text that is the same in every process
    (a state saved in one process is loaded in another): a function or class by its
    module and name, a set sorted, anything else by its ``repr`` without memory addresses
    (a function's repr holds its address, different in each process, and a set's order
    follows the string hash seed: states saved in one process were refused in the next)."""
    if isinstance(value, set | frozenset):
        return sorted(json.dumps(v, sort_keys=True, default=_stable) for v in value)
    name = getattr(value, "__qualname__", None)
    if callable(value) and isinstance(name, str):
        return f"{getattr(value, '__module__', '?')}.{name}"
    return _ADDRESS.sub("", repr(value))


class _Run:
    """One iteration of a user stage: the groups it made and the state at each yield."""

    def __init__(self, stage: Stage, env: Env, k: int, saved: Any) -> None:
        self.stage, self.ledger = stage, env.ledger
        initial = saved["value"] if saved else None
        epoch = env.seed_parts[0] if env.seed_parts is not None else 0
        self.state = StageState(copy.deepcopy(initial), env.seed_for(k, None), epoch)
        self.group: list[Rec] = []  # pulled since the last output
        self.at_yield = copy.deepcopy(initial)  # state.value at the last yield
        self.emitted: deque[tuple[Rec, Any]] = deque()  # (output, state before it)
        self.upstream: BaseException | None = None  # what the pull from upstream raised

    def snapshot(self) -> dict[str, Any]:
        with self.ledger.lock:
            while self.emitted and not self.ledger.is_open(self.emitted[0][0]):
                self.emitted.popleft()
            before = self.emitted[0][1] if self.emitted else self.at_yield
            try:
                json.dumps(before)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"stage {self.stage.name!r}: state.value={before!r} cannot be saved: "
                    f"{exc}; a stage's state is plain JSON data (dict, list, str, int, "
                    "float, bool, None): keep a set as a sorted list, numbers as int(x) or "
                    "float(x)"
                ) from exc
            return {"value": copy.deepcopy(before)}

    def _pull(self, up: Iterator[Rec]) -> Iterator[Any]:
        try:
            for rec in up:
                with self.ledger.lock:
                    self.group.append(rec)
                yield rec.value
        except BaseException as exc:  # raised upstream: its notes say where, not this stage
            self.upstream = exc
            raise

    def run(self, up: Iterator[Rec]) -> Iterator[Rec]:
        stage, ledger = self.stage, self.ledger
        out = stage.iterate(self._pull(up), self.state)
        try:
            while True:
                try:
                    value = next(out)
                except StopIteration:
                    break
                except Exception as exc:
                    if exc is not self.upstream:
                        add_note(exc, f"streambuf: raised in stage {stage.name!r}")
                    raise
                with ledger.lock:
                    members, self.group = self.group, []
                    if not members:
                        raise TypeError(
                            f"stage {stage.name!r} yielded an output without pulling a "
                            "sample since its previous output (fan-out): yield lists and "
                            "add .flatten() after it"
                        )
                    rec = Rec(value, members[0].pos, members[0].seq, members)
                    if stage.owns_state:
                        before = self.at_yield
                        self.at_yield = copy.deepcopy(self.state.value)
                        self.emitted.append((rec, before))
                        if len(self.emitted) > 256:  # prune what was delivered long ago
                            while self.emitted and not ledger.is_open(self.emitted[0][0]):
                                self.emitted.popleft()
                yield rec
            with ledger.lock:  # pulled after the last output: dropped
                dropped, self.group = self.group, []
                for r in dropped:
                    ledger.settle_all(r)
        finally:
            close = getattr(out, "close", None)
            if close is not None:
                close()
