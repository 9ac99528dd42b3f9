"""A ``Pipeline`` as the dataset of torchdata's ``StatefulDataLoader`` resumes exactly:
the loader keeps one state per worker (each worker's ``Pipeline.state_dict()`` is a
one-slot run) and hands each back to its worker. Mid-epoch and end-of-epoch states,
workers 0 and 2, fork and spawn, persistent workers; a JSON round trip of the state."""

from __future__ import annotations

import json

import pytest

from tests.pipeline_data import all_samples
from tests.resume_data import N_SHARDS, plain_pipe
from tests.resume_harness import counted_once, ids_of

sdl = pytest.importorskip("torchdata.stateful_dataloader")

pytestmark = pytest.mark.timeout(180)

CASES = [
    pytest.param(0, None, False, id="workers0"),
    pytest.param(2, "fork", False, id="workers2-fork"),
    pytest.param(2, "spawn", False, id="workers2-spawn"),
    pytest.param(2, "fork", True, id="workers2-persistent"),
]


def _loader(workers: int, ctx: str | None, persistent: bool) -> object:
    return sdl.StatefulDataLoader(
        plain_pipe(),
        batch_size=None,  # the pipeline batches
        num_workers=workers,
        multiprocessing_context=ctx if workers else None,
        persistent_workers=persistent,
        timeout=60 if workers else 0,
    )


@pytest.mark.parametrize(("workers", "ctx", "persistent"), CASES)
@pytest.mark.parametrize("stop", [2, "end"])
def test_stateful_dataloader_resumes_a_pipeline_exactly(workers, ctx, persistent, stop) -> None:
    whole = [ids_of(b) for b in _loader(workers, ctx, persistent)]
    assert len(whole) > 4
    dl = _loader(workers, ctx, persistent)
    it = iter(dl)
    k = len(whole) if stop == "end" else stop
    first = [ids_of(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))  # plain data (streambuf's part too)
    del it, dl
    again = _loader(workers, ctx, persistent)
    again.load_state_dict(state)
    rest = [ids_of(b) for b in again]
    if stop != "end":
        assert first + rest == whole  # in order: the uninterrupted epoch, batch for batch
        counted_once([x for b in first + rest for x in b], all_samples(N_SHARDS))
        return
    assert first == whole
    # nothing of the saved epoch is owed: with workers the resumed iteration is empty
    # (StatefulDataLoader's workers had seen the end) and the next one is a new epoch;
    # without workers the pipeline's own rule applies (its next epoch at once)
    nxt = rest if workers == 0 else [ids_of(b) for b in again]
    if workers:
        assert rest == []
    counted_once([x for b in nxt for x in b], all_samples(N_SHARDS))
