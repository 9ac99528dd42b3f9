"""A stage's exception reaches the loop as the same type with its attributes and notes,
through real worker processes (fork and spawn) as without workers; ``WorkerError`` only
for a dead or silent worker; an unpicklable batch is an error, never a hang."""

from __future__ import annotations

import pytest

from streambuf import Loader, Pipeline, ShardError, StageError, WorkerError
from tests.pipeline_data import KwOnlyError, raise_on_5, with_lock

pytestmark = pytest.mark.timeout(120)

SETUPS = [
    pytest.param(0, None, id="no-workers"),
    pytest.param(2, "fork", id="fork"),
    pytest.param(2, "spawn", id="spawn"),
]


def run(kind, workers, mp_context):
    pipe = Pipeline(list(range(12))).map(raise_on_5(kind)).batch(2)
    loader = Loader(
        pipe,
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="1MiB",
        multiprocessing_context=mp_context,
        timeout_s=60,
    )
    with pytest.raises(BaseException) as info:
        for _ in loader:
            pass
    return info.value


def notes(exc):
    return "\n".join(getattr(exc, "__notes__", ()))


@pytest.mark.parametrize(("workers", "mp_context"), SETUPS)
@pytest.mark.parametrize("kind", ["value", "key", "fake_worker_error"])
def test_builtin_errors_keep_their_type(kind, workers, mp_context):
    exc = run(kind, workers, mp_context)
    expected = {"value": ValueError, "key": KeyError, "fake_worker_error": RuntimeError}[kind]
    assert type(exc) is expected, repr(exc)
    assert "map(_Raiser)" in notes(exc) and "on 5" in notes(exc)
    if workers:
        assert "DataLoader worker" in notes(exc) and "Traceback" in notes(exc)


@pytest.mark.parametrize(("workers", "mp_context"), SETUPS)
def test_stage_error_keeps_stage_and_source(workers, mp_context):
    exc = run("shard", workers, mp_context)
    assert type(exc) is ShardError
    assert exc.stage == "tar" and exc.source == "s3://b/shard-5.tar"
    assert "truncated member" in str(exc) and "map(_Raiser)" in notes(exc)


@pytest.mark.parametrize(("workers", "mp_context"), SETUPS)
def test_exception_with_keyword_arguments_keeps_them(workers, mp_context):
    exc = run("kwonly", workers, mp_context)
    assert type(exc) is KwOnlyError and exc.code == 7 and str(exc) == "needs a code"


@pytest.mark.parametrize(("workers", "mp_context"), SETUPS[1:])
@pytest.mark.parametrize("kind", ["unbuildable", "unpicklable"])
def test_exception_that_cannot_travel_becomes_a_stage_error_naming_it(kind, workers, mp_context):
    exc = run(kind, workers, mp_context)
    assert isinstance(exc, StageError), repr(exc)
    text = str(exc)
    original = "UnbuildableError" if kind == "unbuildable" else "ValueError"
    assert original in text and ("cannot come back" in text or "holds a lock" in text)
    assert "map(_Raiser)" in notes(exc)


@pytest.mark.parametrize("mp_context", ["fork", "spawn"])
def test_unpicklable_batch_is_an_error_not_a_hang(mp_context):
    pipe = Pipeline(list(range(8))).map(with_lock).batch(2, collate=list)
    loader = Loader(
        pipe, num_workers=2, max_batches=4, max_bytes="1MiB", multiprocessing_context=mp_context
    )  # timeout_s=None: before the fix this waited forever
    with pytest.raises(StageError) as info:
        for _ in loader:
            pass
    text = str(info.value)
    assert "list" in text and "cannot be sent to the main process" in text
    assert "lock" in text and "must pickle" in text and info.value.stage == "transport"


def test_user_runtime_error_mentioning_workers_is_not_a_worker_error():
    exc = run("fake_worker_error", 2, "fork")
    assert not isinstance(exc, WorkerError) and type(exc) is RuntimeError
