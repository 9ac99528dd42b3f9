"""Two stages of your own, written against the public API only, proven to resume exactly.

* ``Window(n)`` holds samples: it emits lists of ``n`` consecutive samples (the last one
  shorter). Nothing to save: the samples it holds at a checkpoint are pending, read
  again on resume, and it rebuilds the same window from them.
* ``RunningCount`` owns state: it tags each output with how many it tagged before in
  this epoch (per worker). The count is in ``state.value``, assigned before the yield,
  so a checkpoint saves the count of what was delivered.

``streambuf.testing.check_resume`` stops an epoch after some batches, saves the state
through JSON, loads it into a fresh Loader, and checks the rest of the epoch and the next
one against an uninterrupted run, with 0 and 2 workers.

    python examples/custom_stage.py
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import streambuf as sb
from streambuf.testing import check_resume


class Window(sb.Stage):
    """Lists of ``n`` consecutive samples."""

    holds_samples = True

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"Window(n={n}): n must be at least 1")
        self.n = n

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        window: list[Any] = []
        for x in samples:
            window.append(x)
            if len(window) == self.n:
                yield window
                window = []
        if window:
            yield window


class RunningCount(sb.Stage):
    """``{"count": k, "window": w}``: the k-th output of this worker in this epoch."""

    owns_state = True

    def iterate(self, samples: Iterator[Any], state: sb.StageState) -> Iterator[Any]:
        for w in samples:
            k = state.value or 0
            state.value = k + 1  # before the yield: saved with this output
            yield {"count": k, "window": w}


def make_pipeline(items: list[int]) -> sb.Pipeline:
    return (
        sb.Pipeline(items, shuffle_shards=True, seed=7)
        .compose(Window(3))
        .compose(RunningCount())
        .batch(2, collate=list)
    )


def example_pipeline() -> sb.Pipeline:
    """The example's data: 40 items (module level, so that workers can build it)."""
    return make_pipeline(list(range(40)))


def main() -> dict[int, list[list[Any]]]:
    with sb.Loader(example_pipeline(), num_workers=2, max_batches=4, max_bytes="64MiB") as ld:
        first = next(iter(ld))
    print("first batch:", first)
    refs = check_resume(example_pipeline, num_workers=(0, 2))
    print("check_resume: exact with 0 and 2 workers, stops 1, 3, last, end")
    return refs


if __name__ == "__main__":
    main()
