"""``streambuf.shards`` through ``Loader``: exactly once over HTTP, byte budget, memory rule.

Issue "Network shards", point 3: Loader with 2 workers x 3 lanes over 10 shards on the
HTTP fault server delivers every ``__key__`` once, the credit accounting stays within
``max_bytes``, and memory growth (docs/design.md "Measuring memory") obeys the budget rule.
"""

from __future__ import annotations

import collections
import pickle
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import streambuf as sb
from streambuf.bench import memwatch
from streambuf.sources import shard_stats

from .helpers import expected_keys, make_shards
from .httpserver import FaultyServer

pytestmark = pytest.mark.timeout(90)
FAST = dict(backoff_s=0.01, max_backoff_s=0.05, timeout_s=10)
MIB = 1 << 20


def to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def keys_of(loader: sb.Loader) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


@pytest.fixture(scope="module")
def ten_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 shards x 12 samples of ~1 KB."""
    root = tmp_path_factory.mktemp("ten")
    make_shards(root, 10, 12)
    return root


@pytest.fixture
def server(ten_shards: Path) -> Iterator[FaultyServer]:
    with FaultyServer(ten_shards) as srv:
        yield srv


def spec(srv: FaultyServer, n: int) -> str:
    return srv.base_url + f"/shard-{{000000..{n - 1:06d}}}.tar"


def test_loader_two_workers_three_lanes_exactly_once_under_faults(server: FaultyServer) -> None:
    server.latency_s = 0.005
    server.fail("*", times=2, status=503)
    server.drop("/shard-000004.tar", after_bytes=7000)
    server.drop("/shard-000007.tar", after_bytes=20000)
    pipe = sb.shards(spec(server, 10), lanes=3, readahead_bytes="4KiB", **FAST)
    pipe = pipe.decode({"bin": to_tensor}).batch(8)
    loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="4MiB", timeout_s=60)
    keys = keys_of(loader)
    assert len(keys) == 120 and set(keys) == expected_keys(10, 12)
    budget = loader.stats().budget
    assert budget is not None and budget.peak_in_flight_bytes <= budget.max_bytes
    assert budget.max_bytes <= 4 * MIB
    totals = shard_stats(pipe)  # written by the forked workers, read here
    assert totals.samples == 120 and totals.shards_done == 10 and totals.shards_skipped == 0
    assert totals.io.retries == 4 and totals.io.opens == 10
    stats = pipe.stats()  # the one way: shard_stats(pipe) is its .shards
    assert stats.shards == totals and stats.mix is None and stats.videos is None
    flat = stats.as_dict(flat=True)
    assert flat["shards/samples"] == 120 and flat["shards/io/retries"] == 4


@pytest.mark.parametrize("n_shards", [10, 3])  # 3 shards < 2 ranks x 2 workers: sample split
def test_two_simulated_ranks_shuffled_exactly_once(server: FaultyServer, n_shards: int) -> None:
    for epoch in (0, 1):
        got: list[str] = []
        orders = []
        for rank in (0, 1):
            pipe = sb.shards(
                spec(server, n_shards), lanes=3, seed=7, rank=rank, world_size=2, **FAST
            )
            pipe = pipe.shuffle(16).batch(5)
            loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="2MiB", timeout_s=60)
            loader.set_epoch(epoch)
            keys = keys_of(loader)
            orders.append(keys)
            got += keys
        dup = [k for k, c in collections.Counter(got).items() if c > 1]
        assert not dup and set(got) == expected_keys(n_shards, 12), (epoch, dup)
        assert all(orders), "every rank got samples"


def test_same_seed_and_epoch_same_order(ten_shards: Path) -> None:
    def run(epoch: int) -> list[str]:
        pipe = sb.shards(str(ten_shards / "shard-*.tar"), lanes=3, seed=1).batch(4)
        loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="2MiB")
        loader.set_epoch(epoch)
        return keys_of(loader)

    first = run(0)
    assert run(0) == first and sorted(run(1)) == sorted(first) and run(1) != first


def test_equalize_pad_gives_equal_batch_counts(ten_shards: Path) -> None:
    counts = []
    for rank in range(3):
        pipe = sb.shards(
            str(ten_shards / "shard-*.tar"),
            samples_per_shard=12,
            equalize="pad",
            rank=rank,
            world_size=3,
        ).batch(5)
        counts.append(
            sum(1 for _ in sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="2MiB"))
        )
    assert len(set(counts)) == 1


def test_reader_pickles_and_runs_under_spawn(ten_shards: Path) -> None:
    pipe = sb.shards(str(ten_shards / "shard-00000{0..3}.tar"), lanes=2).batch(6)
    clone = pickle.loads(pickle.dumps(pipe))
    assert [k for b in clone for k in b["__key__"]] != []
    loader = sb.Loader(
        pipe, num_workers=1, max_batches=2, max_bytes="2MiB", multiprocessing_context="spawn"
    )
    assert set(keys_of(loader)) == expected_keys(4, 12)
    assert shard_stats(pipe).samples == 48  # shared counters reach a spawned worker too


def test_skips_are_counted_and_reachable(server: FaultyServer) -> None:
    urls = [server.url(f"shard-{i:06d}.tar") for i in range(4)] + [server.url("missing.tar")]
    pipe = sb.shards(urls, lanes=2, on_error="skip", max_failures=1, **FAST).batch(4)
    keys = keys_of(sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="2MiB"))
    assert set(keys) == expected_keys(4, 12) and len(keys) == 48
    totals = shard_stats(pipe)
    assert totals.shards_skipped == 1 and totals.shards_done == 4 and totals.samples == 48


def test_stage_grant_bounds_the_lane_buffer(ten_shards: Path) -> None:
    pipe = sb.shards(str(ten_shards / "*.tar"), lanes=3, block_bytes="1MiB", readahead_bytes="1MiB")
    reader = pipe._src.reader
    assert isinstance(reader, sb.sources.TarReader)
    assert reader.buffer_bytes(None, lanes=3) == 256 * MIB  # outside a Loader: max_bytes
    assert reader.buffer_bytes(40 * MIB, lanes=3) == 31 * MIB  # minus 3 x (2 + 1) MiB
    assert reader.buffer_bytes(8 * MIB, lanes=3) == 4 * MIB  # never below half the grant


def test_a_loader_charges_the_read_buffers_to_max_bytes(ten_shards: Path) -> None:
    """The lanes' read buffers (2 blocks and the readahead a lane) are fixed bytes a
    worker: charged whole where they fit in half of max_bytes, else cut to that half.
    They were taken off the stage grant, which kept half for the samples: below it they
    sat outside max_bytes (8 lanes over S3: ~88 MiB a worker on any budget)."""
    pipe = sb.shards(str(ten_shards / "*.tar"), lanes=3).batch(4)
    as_set = 3 * 2 * MIB  # local files: two blocks a lane, no readahead
    assert pipe._src.read_bytes(2) == as_set
    assert pipe._src.read_bytes(5) == 2 * 2 * MIB  # 2 shards a worker: 2 lanes
    roomy = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="64MiB")
    assert roomy.read_bytes == as_set and roomy.fixed_bytes == 2 * as_set
    assert roomy.stats().fixed_bytes == 2 * as_set
    assert roomy.credit_bytes + roomy.fixed_bytes + 2 * roomy.stage_bytes <= 64 * MIB
    tight = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="8MiB")  # 2 MiB a worker
    assert tight.read_bytes == 2 * MIB and tight.fixed_bytes == 4 * MIB  # half of 8
    assert tight.credit_bytes + tight.fixed_bytes + 2 * tight.stage_bytes <= 8 * MIB
    keys = keys_of(tight)  # and it reads every sample with the cut sizes
    assert sorted(keys) == sorted(expected_keys(10, 12))
    plain = sb.Loader(sb.Pipeline(list(range(4))), num_workers=0, max_batches=2, max_bytes="1MiB")
    assert plain.read_bytes is None


def test_shards_not_divisible_by_workers_charge_the_most_lanes_a_worker_opens(
    tmp_path: Path,
) -> None:
    """5 shards over 2 workers with lanes=3: one worker reads 3 shards (3 lanes), the
    other 2 (2 lanes). Each worker is charged for the most lanes a worker opens (3: the
    charge is one figure for every worker), never the fewer (the worker with the extra
    shard would read outside max_bytes)."""
    make_shards(tmp_path, 5, 6)
    pipe = sb.shards(str(tmp_path / "*.tar"), lanes=3).batch(4)
    lane = 2 * MIB  # local files: two blocks a lane, no readahead
    assert pipe._src.reader.lanes_for(pipe._src.shards, 2) == 3
    assert pipe._src.read_bytes(2) == 3 * lane
    assert pipe._src.read_bytes(3) == 2 * lane  # 2, 2 and 1 shards
    assert pipe._src.read_bytes(4) == 2 * lane  # 2, 1, 1 and 1
    assert pipe._src.read_bytes(5) == 1 * lane
    loader = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="64MiB")
    assert loader.read_bytes == 3 * lane
    assert loader.fixed_bytes == loader.stats().fixed_bytes == 2 * 3 * lane
    assert loader.credit_bytes + loader.fixed_bytes + 2 * loader.stage_bytes <= 64 * MIB
    assert sorted(keys_of(loader)) == sorted(expected_keys(5, 6))


def as_tokens(sample: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {"tokens": to_tensor(sample["bin"]).long()}


def test_pack_over_shards_is_charged_its_block_and_the_reads(tmp_path: Path) -> None:
    """Both are fixed bytes a worker: pack's block (12 bytes a token) and the lanes' read
    buffers. fixed_bytes holds both for every worker; where half of max_bytes cannot
    hold both, the reads get what the blocks leave of that half (pack's block is not
    cut)."""
    make_shards(tmp_path, 4, 6)  # 24 samples of 1000 bytes: 24000 tokens
    urls = str(tmp_path / "*.tar")
    lane = 2 * MIB
    seq = 1024
    pipe = sb.shards(urls, lanes=2).map(as_tokens).pack(seq).batch(2)
    roomy = sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="64MiB")
    assert roomy.read_bytes == 2 * lane
    assert roomy.fixed_bytes == roomy.stats().fixed_bytes == 2 * (12 * seq + 2 * lane)
    assert roomy.credit_bytes + roomy.fixed_bytes + 2 * roomy.stage_bytes <= 64 * MIB
    got = [b["tokens"].shape for b in roomy]
    assert sum(shape[0] for shape in got) == 2 * 11  # 11 full blocks a worker (12000 tokens)

    seq = 1 << 16  # a 768 KiB block a worker: the reads get (4 MiB - 1.5 MiB) / 2
    pipe = sb.shards(urls, lanes=2).map(as_tokens).pack(seq, drop_last=False).batch(1)
    tight = sb.Loader(pipe, num_workers=2, max_batches=2, max_bytes="8MiB")
    assert tight.read_bytes == (4 * MIB - 2 * 12 * seq) // 2
    assert tight.fixed_bytes == tight.stats().fixed_bytes == 2 * (12 * seq) + 2 * tight.read_bytes
    assert tight.fixed_bytes <= 4 * MIB
    blocks = list(tight)
    assert sum(int((b["document_ids"] >= 0).sum()) for b in blocks) == 24 * 1000


@pytest.mark.parametrize("fsspec", [False, True], ids=["http", "fsspec"])
@pytest.mark.parametrize("allot_mib", [100, 20, 6, 1])
def test_read_sizes_fit_the_charge_largest_request_first(
    ten_shards: Path, fsspec: bool, allot_mib: int
) -> None:
    pipe = sb.shards(str(ten_shards / "*.tar"), lanes=4, readahead_bytes="1MiB")
    reader = pipe._src.reader
    allot = allot_mib * MIB
    fit = reader.fit(allot, lanes=4, fsspec=fsspec)
    held = 4 * (2 * fit.block + fit.readahead + (fit.request if fsspec else 0))
    assert fit.over == 0 and held <= allot
    as_set = 4 * (3 + (8 if fsspec else 0)) * MIB
    if as_set <= allot:
        assert (fit.block, fit.readahead, fit.request) == (MIB, MIB, 8 * MIB)
    elif fsspec and 4 * 4 * MIB <= allot:  # the largest request is cut first
        assert (fit.block, fit.readahead) == (MIB, MIB) and MIB <= fit.request < 8 * MIB
    else:  # then the block and the readahead in proportion
        assert fit.block < MIB and 0 < fit.readahead < MIB
        assert abs(fit.readahead - fit.block) <= fit.block // 8
        assert fit.request == (fit.block if fsspec else fit.request)
        assert held >= allot * 0.9  # not cut further than needed
    ctx = types.SimpleNamespace(worker=0, read_bytes=allot)
    run = reader.open(
        [str(p) for p in sorted(ten_shards.glob("*.tar"))],
        ctx=ctx,
        stage_bytes=3 * MIB,
        stride=1,
        offset=0,
    )
    if not fsspec:  # the worker reads with them; the stage grant is the samples' alone
        local = reader.fit(allot, lanes=4, local=True)  # (no readahead counted: local)
        o = run.access.options
        assert (o.block_bytes, o.readahead_bytes) == (local.block, MIB)
        assert 4 * 2 * local.block <= allot or local.block == 64 << 10
        assert run.max_bytes == 3 * MIB


def test_a_cut_is_said_once_with_the_budget_that_keeps_the_reads(
    server: FaultyServer, caplog: pytest.LogCaptureFixture
) -> None:
    pipe = sb.shards(spec(server, 10), lanes=8, **FAST).batch(4)
    reader = pipe._src.reader
    fit = reader.fit(512 << 10, lanes=5)
    assert fit.block == 64 << 10 and fit.readahead == 0
    assert fit.over == 5 * 2 * (64 << 10) - (512 << 10)
    as_set = 5 * 3 * MIB  # 10 shards over 2 workers: 5 lanes a worker, 3 MiB each
    assert pipe._src.read_bytes(2) == as_set
    with caplog.at_level("INFO", logger="streambuf"):
        sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="16MiB")  # 4 MiB a worker
        said = [r for r in caplog.records if "read buffers" in r.getMessage()]
        assert said and said[0].levelname == "INFO"
        assert f"max_bytes >= {2 * 2 * as_set} keeps them as set" in said[0].getMessage()
        assert "requests" not in said[0].getMessage()  # an fsspec matter only
        caplog.clear()
        sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="2MiB")  # 512 KiB a worker
        (rec,) = [r for r in caplog.records if "read buffers" in r.getMessage()]
        assert rec.levelname == "WARNING"
        assert "raise max_bytes, use fewer lanes or fewer workers" in rec.getMessage()
        caplog.clear()
        sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes=f"{2 * 2 * as_set}B")
        assert not [r for r in caplog.records if "read buffers" in r.getMessage()]


def test_break_in_process_stops_the_lanes(server: FaultyServer, no_thread_leak: None) -> None:
    server.trickle = (2048, 0.002)
    pipe = sb.shards(spec(server, 10), lanes=3, **FAST).batch(2)
    for i, _ in enumerate(pipe):  # num_workers=0: the lanes run in this process
        if i == 2:
            break
    assert shard_stats(pipe).samples >= 6  # published when the reader was closed


def test_shards_rejects_bad_options(ten_shards: Path) -> None:
    with pytest.raises(ValueError, match="lanes"):
        sb.shards(str(ten_shards / "*.tar"), lanes=0)
    with pytest.raises(ValueError, match="on_error"):
        sb.shards(str(ten_shards / "*.tar"), on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        sb.shards(str(ten_shards / "nothing-*.tar"))
    with pytest.raises(TypeError):
        shard_stats(sb.Pipeline([1, 2]))
    assert sb.Pipeline([1, 2]).stats() == sb.Pipeline(iter([1])).stats()  # counts nothing


# -- memory rule -------------------------------------------------------------------------
def _memory_run(srv: FaultyServer, n_samples: int, *, keep: bool = False) -> dict[str, Any]:
    """One epoch with a slow consumer; ``keep``: hold every batch (the harness must see it)."""
    pipe = sb.shards(spec(srv, 10), lanes=3, **FAST).decode({"bin": to_tensor}).batch(16)
    loader = sb.Loader(pipe, num_workers=2, max_batches=8, max_bytes=MAX_BYTES, timeout_s=60)
    seen = nbytes = 0
    held = []
    for batch in loader:
        if keep:
            held.append(batch)
        seen += len(batch["__key__"])
        nbytes += batch["bin"].numel()
        time.sleep(0.01)  # a consumer slower than the network: the stages fill up
    budget = loader.stats().budget
    assert seen == n_samples
    assert budget is not None
    return {"bytes": nbytes, "peak_in_flight": budget.peak_in_flight_bytes}


MAX_BYTES = 32 * MIB


@pytest.mark.serial
@pytest.mark.skipif(not memwatch.available(), reason="needs /proc/meminfo")
def test_memory_growth_obeys_the_budget_rule(tmp_path: Path) -> None:
    """10 shards x 64 samples x 512 KiB (320 MiB, > 2x the rule) against 1-byte samples."""
    per, payload = 64, 512 << 10
    make_shards(tmp_path / "big", 10, per, payload=payload, random_payload=False)
    make_shards(tmp_path / "tiny", 10, per, payload=1, random_payload=False)
    rule = memwatch.budget_rule_bytes(MAX_BYTES)
    with FaultyServer(tmp_path / "big") as big, FaultyServer(tmp_path / "tiny") as tiny:
        _, tiny_peak = memwatch.watch(lambda: _memory_run(tiny, 10 * per))
        _, held_peak = memwatch.watch(lambda: _memory_run(big, 10 * per, keep=True))
        seen = held_peak.peak - tiny_peak.peak
        assert seen > rule, f"the harness must see batches kept by the user ({seen / MIB:.0f} MiB)"
        growths = []
        for _ in range(2):  # other processes on the machine only add: keep the smaller
            _, tiny_peak = memwatch.watch(lambda: _memory_run(tiny, 10 * per))
            real, real_peak = memwatch.watch(lambda: _memory_run(big, 10 * per))
            growths.append(real_peak.peak - tiny_peak.peak)
            assert real["peak_in_flight"] <= MAX_BYTES
            if growths[-1] <= rule:
                break
    assert real["bytes"] == 10 * per * payload > 2 * rule  # an unbounded loader would fail
    assert min(growths) <= rule, [f"{g / MIB:.0f} MiB" for g in growths] + [f"rule {rule / MIB}"]
