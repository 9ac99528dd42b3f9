"""``Pipeline.pack``: documents packed into fixed-length blocks. Every token exactly once
and in document order (a property over random document lengths, empty documents and
documents longer than a block included), ``document_ids`` at block boundaries, exact
resume at random stops (0 and 2 workers, fork and spawn), elastic resume (2 -> 3
workers, 2 ranks -> 1), and bad input named."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streambuf as sb
from tests.resume_harness import check_save_load, counted_once, resume_and_finish, save_after

pytestmark = pytest.mark.timeout(300)

SEQ = 16
N_SHARDS = 6


def doc_length(shard: int, doc: int) -> int:
    """0..40 tokens (blocks of 16: empty documents and ones over two blocks)."""
    return random.Random(shard * 1000 + doc).choice([0, 1, 3, 7, 15, 16, 17, 29, 40])


def docs_per_shard(shard: int) -> int:
    return 3 + shard % 4


def token(shard: int, doc: int, j: int) -> int:
    return shard * 1_000_000 + doc * 1000 + j


def shard_docs(shard: int) -> Any:
    for d in range(docs_per_shard(shard)):
        yield {"tokens": np.array([token(shard, d, j) for j in range(doc_length(shard, d))])}


def all_tokens() -> list[int]:
    return [
        token(s, d, j)
        for s in range(N_SHARDS)
        for d in range(docs_per_shard(s))
        for j in range(doc_length(s, d))
    ]


def pack_pipe(*, rank: int | None = None, world: int | None = None, drop_last: bool = True):
    kw = {} if rank is None else {"rank": rank, "world_size": world}
    return (
        sb.Pipeline(
            list(range(N_SHARDS)),
            expand=shard_docs,
            shuffle_shards=True,
            seed=5,
            samples_per_shard=[docs_per_shard(s) for s in range(N_SHARDS)],
            **kw,
        )
        .shuffle(3)
        .pack(SEQ, drop_last=drop_last, pad=7)
        .batch(2)
    )


def pack_loader(
    *,
    workers: int = 2,
    mp_context: str | None = None,
    rank: int | None = None,
    world: int | None = None,
    drop_last: bool = True,
) -> sb.Loader:
    return sb.Loader(
        pack_pipe(rank=rank, world=world, drop_last=drop_last),
        num_workers=workers,
        max_batches=max(workers, 1) * 2,
        max_bytes="2MiB",
        multiprocessing_context=mp_context,
        timeout_s=60,
    )


def block_tokens(batch: Any) -> list[int]:
    """The tokens of a batch of blocks, padding left out."""
    tokens, ids = batch["tokens"].flatten(), batch["document_ids"].flatten()
    return [int(t) for t in tokens[ids >= 0]]


# -- what a block holds ------------------------------------------------------------------
def expected_blocks(
    lengths: list[int], seq: int, eos: int | None, drop_last: bool, pad: int = 0
) -> tuple[list[list[int]], list[list[int]]]:
    """The blocks and document ids a plain Python packing loop makes."""
    stream: list[tuple[int, int]] = []  # (token, document)
    for d, n in enumerate(lengths):
        stream += [(d * 1000 + j, d) for j in range(n)]
        if eos is not None:
            stream.append((eos, d))
    blocks, ids = [], []
    for at in range(0, len(stream), seq):
        part = stream[at : at + seq]
        if len(part) < seq and drop_last:
            break
        docs: list[int] = []
        for _, d in part:
            if d not in docs:
                docs.append(d)
        blocks.append([t for t, _ in part] + [pad] * (seq - len(part)))
        ids.append([docs.index(d) for _, d in part] + [-1] * (seq - len(part)))
    return blocks, ids


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 45), min_size=0, max_size=12),
    seq=st.integers(1, 20),
    eos=st.sampled_from([None, 999_999]),
    drop_last=st.booleans(),
)
def test_every_token_once_in_order_with_document_ids(
    lengths: list[int], seq: int, eos: int | None, drop_last: bool
) -> None:
    docs = [{"tokens": [d * 1000 + j for j in range(n)]} for d, n in enumerate(lengths)]
    got = list(sb.Pipeline(docs).pack(seq, eos=eos, drop_last=drop_last))
    blocks, ids = expected_blocks(lengths, seq, eos, drop_last)
    assert [b["tokens"].tolist() for b in got] == blocks
    assert [b["document_ids"].tolist() for b in got] == ids
    assert all(b["tokens"].dtype == torch.int64 for b in got)
    assert all(b["document_ids"].dtype == torch.int32 for b in got)


def test_a_block_boundary_inside_a_document() -> None:
    docs = [np.arange(5), np.arange(10, 22), np.arange(30, 33)]
    got = list(sb.Pipeline(docs).pack(8, key=None, eos=99, drop_last=False, pad=0))
    assert [b["tokens"].tolist() for b in got] == [
        [0, 1, 2, 3, 4, 99, 10, 11],
        [12, 13, 14, 15, 16, 17, 18, 19],
        [20, 21, 99, 30, 31, 32, 99, 0],
    ]
    assert [b["document_ids"].tolist() for b in got] == [
        [0, 0, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0],  # the middle of document 1: document 0 of its block
        [0, 0, 0, 1, 1, 1, 1, -1],
    ]


def test_tensors_lists_and_arrays_of_any_integer_dtype_are_documents() -> None:
    docs = [
        {"tokens": torch.tensor([1, 2], dtype=torch.int32)},
        {"tokens": [3]},
        {"tokens": np.array([4, 5, 6], dtype=np.uint16)},
        {"tokens": []},
    ]
    got = list(sb.Pipeline(docs).pack(3))
    assert [b["tokens"].tolist() for b in got] == [[1, 2, 3], [4, 5, 6]]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    seq=st.integers(1, 12),
    pad=st.sampled_from([0, 3, 999_998]),
)
def test_eos_zero_and_a_pad_token_in_the_last_block(lengths: list[int], seq: int, pad: int) -> None:
    """``eos=0`` is a token like any other (not "no eos"), and the last block is padded
    with ``pad``, its document ids -1 there."""
    docs = [{"tokens": [d * 1000 + j + 1 for j in range(n)]} for d, n in enumerate(lengths)]
    got = list(sb.Pipeline(docs).pack(seq, eos=0, drop_last=False, pad=pad))
    stream = [t for d, n in enumerate(lengths) for t in [*(d * 1000 + j + 1 for j in range(n)), 0]]
    assert [t for b in got for t in b["tokens"].tolist()] == stream + [pad] * (-len(stream) % seq)
    _, ids = expected_blocks(lengths, seq, 0, False, pad)
    assert [b["document_ids"].tolist() for b in got] == ids
    assert all(b["tokens"].dtype == torch.int64 for b in got)


# -- resume ------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_at_random_stops(workers: int) -> None:
    ref = [block_tokens(b) for b in pack_loader(workers=workers)]
    stops = sorted(random.Random(workers).sample(range(1, len(ref)), 3))
    check_save_load(pack_loader, {"workers": workers}, [*stops, "last"], ids=block_tokens)


def test_exact_resume_with_spawned_workers() -> None:
    check_save_load(pack_loader, {"workers": 2, "mp_context": "spawn"}, [2], ids=block_tokens)


@pytest.mark.long
def test_exact_resume_spawn_in_a_fresh_process() -> None:
    check_save_load(
        pack_loader,
        {"workers": 2, "mp_context": "spawn"},
        [2],
        fresh_process=True,
        ids=block_tokens,
    )


def test_a_checkpoint_inside_a_long_document_keeps_its_offset() -> None:
    """The state owes the document cut by the stop, with the piece already delivered:
    a resumed run starts it where the delivered block ended."""
    first, state = save_after(pack_loader, {"workers": 0}, 1, ids=block_tokens)
    owed = [p for w in state["workers"] for p in _pending(w)]
    assert any(len(p) > 3 for p in owed), owed  # [shard, index, hint, [piece ends]]
    rest, _ = resume_and_finish(pack_loader, {"workers": 0}, state, ids=block_tokens)
    assert first + rest == [block_tokens(b) for b in pack_loader(workers=0)]


def _pending(worker_state: Any) -> list[Any]:
    found: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "pending" and isinstance(v, list):
                    found.extend(v)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(worker_state)
    return found


@pytest.mark.parametrize("stop", [1, 3])
def test_elastic_resume_two_to_three_workers_every_token_once(stop: int) -> None:
    first, state = save_after(
        pack_loader, {"workers": 2, "drop_last": False}, stop, ids=block_tokens
    )
    rest, _ = resume_and_finish(
        pack_loader, {"workers": 3, "drop_last": False}, state, ids=block_tokens
    )
    counted_once([t for b in first + rest for t in b], all_tokens())


def test_elastic_resume_two_ranks_to_one_every_token_once() -> None:
    delivered, states = [], []
    for rank in range(2):
        kw = {"workers": 2, "rank": rank, "world": 2, "drop_last": False}
        first, state = save_after(pack_loader, kw, 2, ids=block_tokens)
        delivered += [t for b in first for t in b]
        states.append(state)
    rest, _ = resume_and_finish(
        pack_loader, {"workers": 2, "drop_last": False}, states, ids=block_tokens
    )
    counted_once(delivered + [t for b in rest for t in b], all_tokens())


# -- bad input and bad options -------------------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "error", "match"),
    [
        (np.zeros((2, 3), dtype=np.int64), ValueError, "1-D"),
        (np.array([1.5, 2.0]), TypeError, "integers"),
        (np.array([3, -1]), ValueError, "negative"),
        (np.array([2**63 + 5, 1], dtype=np.uint64), ValueError, "past int64's range"),
        ("hello", TypeError, "tokenize"),
        (np.array([True, False]), TypeError, "integers"),
    ],
)
def test_bad_documents_are_named(doc: Any, error: type, match: str) -> None:
    docs = [
        {"__key__": "ok", "tokens": [1, 2]},
        {"__key__": "doc-7", "__url__": "s.tar", "tokens": doc},
    ]
    with pytest.raises(error, match=match) as info:
        list(sb.Pipeline(docs).pack(4))
    assert "doc-7" in "\n".join(getattr(info.value, "__notes__", []))


def test_a_missing_field_names_the_fields_there() -> None:
    with pytest.raises(KeyError, match="input_ids"):
        list(sb.Pipeline([{"input_ids": [1]}]).pack(4))


def test_options_and_stage_order_are_checked() -> None:
    pipe = sb.Pipeline([[1, 2]])
    with pytest.raises(ValueError, match="seq_len"):
        pipe.pack(0)
    with pytest.raises(TypeError, match="eos"):
        pipe.pack(4, eos=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eos"):
        pipe.pack(4, eos=-2)
    for big in (2**63, 2**70):  # (they built, then failed at the first document)
        with pytest.raises(ValueError, match=r"eos=.*int64"):
            pipe.pack(4, eos=big)
        with pytest.raises(ValueError, match=r"pad=.*int64"):
            pipe.pack(4, pad=big, drop_last=False)
    with pytest.raises(TypeError, match=r"seq_len=.*int\(x\) of this int64"):
        pipe.pack(np.int64(4))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"after \.pack"):
        pipe.pack(4).shuffle(10)
    with pytest.raises(ValueError, match="at most one"):
        pipe.flatten().pack(4)
    with pytest.raises(ValueError, match="mix"):
        sb.mix([pipe.pack(4), pipe], weights=[1, 1])
    pipe.pack(4, key=None).map(lambda b: b).batch(2)  # what may follow


@pytest.mark.parametrize("drop_last", [True, False])
def test_nothing_stays_owed_when_the_stream_ends(drop_last: bool) -> None:
    """The documents of a dropped last block (and empty ones at the end) are settled:
    nothing is left pending for a checkpoint to replay."""
    from streambuf._contracts import WorkerContext

    pipe = sb.Pipeline([[1, 2, 3]] * 5 + [[]]).pack(4, key=None, drop_last=drop_last)
    run = pipe._iterate(WorkerContext(0, 1, 0, 1, 0, pipe.seed), stage_bytes=None)
    blocks = list(run)
    assert len(blocks) == (3 if drop_last else 4)
    assert len(run.ledger) == 0, run.ledger.pending()


# -- the byte budget ---------------------------------------------------------------------
def test_the_block_being_filled_is_charged_to_max_bytes() -> None:
    """Each worker's block (12 bytes a token) comes out of max_bytes before the batches
    in flight get theirs; a max_bytes that cannot hold them is refused, naming pack."""
    kw: dict[str, Any] = {"max_batches": 4, "max_bytes": "2MiB"}
    seq = 4096
    ld = sb.Loader(
        sb.Pipeline(list(range(8)), expand=lambda s: [{"tokens": np.arange(50)}])
        .pack(seq)
        .batch(2),
        num_workers=2,
        **kw,
    )
    assert ld.fixed_bytes == 2 * 12 * seq
    assert ld.credit_bytes == (2 << 20) - 2 * 12 * seq
    assert sb.Loader(pack_pipe(), num_workers=2, **kw).fixed_bytes == 2 * 12 * SEQ
    assert sb.Loader(pack_pipe(), num_workers=0, **kw).fixed_bytes == 12 * SEQ
    assert sb.Loader(sb.Pipeline([0]).batch(1), num_workers=2, **kw).fixed_bytes == 0
    assert ld.stats().fixed_bytes == ld.fixed_bytes
    with pytest.raises(ValueError, match=r"pack's block.*raise max_bytes \(to at least 196608\)"):
        sb.Loader(
            sb.Pipeline([0]).pack(seq, key=None).batch(1),
            num_workers=2,
            max_batches=2,
            max_bytes=150_000,
        )


def test_what_pack_holds_is_its_block_and_the_document_being_cut() -> None:
    """The stage meter's peak for pack: the block (12 bytes a token) and at most one
    document, however long the documents are."""
    seq, long_doc = 64, 1000
    docs = [np.arange(n) for n in (long_doc, 3, 70, long_doc, 5)] * 4
    ld = sb.Loader(
        sb.Pipeline(docs).pack(seq, key=None).batch(2),
        num_workers=0,
        max_batches=2,
        max_bytes="8MiB",
    )
    assert sum(len(b["tokens"]) for b in ld) == sum(map(len, docs)) // seq
    (stage,) = [s for s in ld.stats().stages if s.stage == "pack"]
    assert 12 * seq <= stage.peak_bytes <= 12 * seq + 8 * long_doc


# -- a reordering map after pack -----------------------------------------------------------
def _late_evens(block: Any) -> Any:
    """Holds back every block whose first token is in an even block of its document, so
    an unordered map delivers later pieces of a document before earlier ones."""
    import time

    first = int(block["tokens"][0])
    if (first % 1000) // 16 % 2 == 0:
        time.sleep(0.03)
    return block


def unordered_pack_loader(*, workers: int = 0) -> sb.Loader:
    docs = [{"tokens": np.arange(d * 1000, d * 1000 + 300)} for d in range(4)]
    pipe = (
        sb.Pipeline(docs)
        .pack(16, drop_last=False)
        .map(_late_evens, threads=4, ordered=False)
        .batch(2)
    )
    return sb.Loader(pipe, num_workers=workers, max_batches=4, max_bytes="4MiB", timeout_s=60)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [2, 5, 11])
def test_an_unordered_map_after_pack_resumes_every_token_once(workers: int, stop: int) -> None:
    """Blocks delivered out of order settle a document's later pieces before its earlier
    ones: the state owes the pieces not delivered, wherever they lie in the document."""
    kw = {"workers": workers}
    first, state = save_after(unordered_pack_loader, kw, stop, ids=block_tokens)
    rest, _ = resume_and_finish(unordered_pack_loader, kw, state, ids=block_tokens)
    counted_once(
        [t for b in first + rest for t in b], [d * 1000 + j for d in range(4) for j in range(300)]
    )
