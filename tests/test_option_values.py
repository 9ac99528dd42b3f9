"""Option values are checked once, in ``streambuf._units``, so every option that takes
the same kind of value refuses the same bad values, at build time, naming the option
(issue "Reliability II"): byte sizes are ints or strings with a unit (``max_bytes=1.9``
was accepted while ``0.5`` was refused), counts are ints, weights are numbers (not
bools, not strings), a ``sizeof`` must return an int of bytes, ``cache_dir`` a folder,
``device`` one this machine has; ``equalize`` is checked when the pipeline is built and
an understated ``samples_per_shard`` is an error, not lost samples."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import streambuf as sb
from streambuf._units import MAX_BYTES, parse_bytes
from streambuf.io import open_stream

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tar(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.sources.helpers import make_shards

    root = tmp_path_factory.mktemp("shards")
    make_shards(root, 2, 4)
    return str(root / "*.tar")


def _nodes() -> Any:
    pytest.importorskip("torchdata.nodes")
    from torchdata.nodes import IterableWrapper

    from streambuf import nodes

    return nodes, IterableWrapper(range(4))


def _clips(**kw: Any) -> Any:
    pytest.importorskip("av")
    from streambuf.video import clips, clips_at_random_indices

    s = clips_at_random_indices(num_clips=1, num_frames_per_clip=2)
    return clips("/nonexistent/x.mp4", sampler=s, **kw)


def _loader(**kw: Any) -> Any:
    base = {"num_workers": 0, "max_batches": 2, "max_bytes": "1MiB"}
    return sb.Loader(sb.Pipeline([1, 2]), **{**base, **kw})


# every public option that takes a byte size: (name in the message, build(value))
BYTE_OPTIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "shards(max_bytes)": ("max_bytes", lambda v: sb.shards(TAR[0], max_bytes=v)),
    "shards(readahead_bytes)": ("readahead_bytes", lambda v: sb.shards(TAR[0], readahead_bytes=v)),
    "shards(block_bytes)": ("block_bytes", lambda v: sb.shards(TAR[0], block_bytes=v)),
    "shards(max_member_bytes)": (
        "max_member_bytes",
        lambda v: sb.shards(TAR[0], max_member_bytes=v),
    ),
    "shards(max_sample_bytes)": (
        "max_sample_bytes",
        lambda v: sb.shards(TAR[0], max_sample_bytes=v),
    ),
    "shards(max_shard_bytes)": ("max_shard_bytes", lambda v: sb.shards(TAR[0], max_shard_bytes=v)),
    "shards(cache_limit)": (
        "cache_limit",
        lambda v: sb.shards(TAR[0], cache_dir=TAR[1], cache_limit=v),
    ),
    "decode(max_decoded_bytes)": (
        "max_decoded_bytes",
        lambda v: sb.Pipeline([{}]).decode(max_decoded_bytes=v),
    ),
    "decode(max_sample_bytes)": (
        "max_sample_bytes",
        lambda v: sb.Pipeline([{}]).decode(max_sample_bytes=v),
    ),
    "decode(max_decoded_sample_bytes)": (
        "max_decoded_sample_bytes",
        lambda v: sb.Pipeline([{}]).decode(max_decoded_sample_bytes=v),
    ),
    "Loader(max_bytes)": ("max_bytes", lambda v: _loader(max_bytes=v)),
    "Loader(memory_reserve_bytes)": (
        "memory_reserve_bytes",
        lambda v: _loader(memory_reserve_bytes=v),
    ),
    "map(max_bytes)": ("max_bytes", lambda v: sb.Pipeline([1]).map(str, threads=2, max_bytes=v)),
    "shuffle(max_bytes)": ("max_bytes", lambda v: sb.Pipeline([1]).shuffle(4, max_bytes=v)),
    "prefetch(max_bytes)": (
        "max_bytes",
        lambda v: sb.Pipeline([1]).prefetch(max_items=2, max_bytes=v),
    ),
    "BoundedBuffer(max_bytes)": ("max_bytes", lambda v: sb.BoundedBuffer(max_items=2, max_bytes=v)),
    "ShardedBuffer(max_bytes)": (
        "max_bytes",
        lambda v: sb.ShardedBuffer(lanes=1, max_items=2, max_bytes=v),
    ),
    "DevicePrefetcher(max_bytes)": (
        "max_bytes",
        lambda v: sb.DevicePrefetcher([], device="cpu", max_bytes=v),
    ),
    "open_stream(block_bytes)": (
        "block_bytes",
        lambda v: open_stream(TAR[2], block_bytes=v),
    ),
    "nodes.ParallelMapper(max_bytes)": (
        "max_bytes",
        lambda v: (lambda n, s: n.ParallelMapper(s, str, threads=1, max_bytes=v))(*_nodes()),
    ),
    "nodes.Prefetcher(max_bytes)": (
        "max_bytes",
        lambda v: (lambda n, s: n.Prefetcher(s, max_items=2, max_bytes=v))(*_nodes()),
    ),
    "video.clips(cache_limit)": ("cache_limit", lambda v: _clips(cache_dir=TAR[1], cache_limit=v)),
}
TAR: list[str] = []  # [a shard glob, a cache folder, one shard's path], set by _paths

BAD_BYTES = [1.9, 2.0, 0.5, 1e9, True, False, -1, math.nan, math.inf, "lots", "1.5", 1 << 63]


@pytest.fixture(autouse=True)
def _paths(tar: str, tmp_path: Path) -> None:
    TAR[:] = [tar, str(tmp_path / "cache"), str(next(Path(tar).parent.glob("*.tar")))]


@pytest.mark.parametrize("bad", BAD_BYTES, ids=repr)
@pytest.mark.parametrize("option", sorted(BYTE_OPTIONS))
def test_every_byte_size_option_refuses_floats_bools_and_bad_values(option: str, bad: Any) -> None:
    name, build = BYTE_OPTIONS[option]
    with pytest.raises((TypeError, ValueError), match=name):
        build(bad)


@pytest.mark.parametrize("option", sorted(BYTE_OPTIONS))
def test_every_byte_size_option_takes_ints_and_unit_strings(option: str) -> None:
    _, build = BYTE_OPTIONS[option]
    build(1 << 20)
    build("1.5MiB")  # a whole number of bytes


def test_zero_is_refused_except_where_it_means_off(tar: str) -> None:
    with pytest.raises(ValueError, match="block_bytes"):
        sb.shards(tar, block_bytes=0)
    sb.shards(tar, readahead_bytes=0)  # 0: no readahead


def test_parse_bytes_rules() -> None:
    assert parse_bytes(MAX_BYTES) == MAX_BYTES and parse_bytes("0.5KiB") == 512
    with pytest.raises(TypeError, match="float"):
        parse_bytes(1.9)
    with pytest.raises(ValueError, match="whole number of bytes"):
        parse_bytes("0.3MiB")
    with pytest.raises(ValueError, match="too large"):
        parse_bytes(str(MAX_BYTES + 1))


# every public option that takes a count: (name in the message, build(value), minimum)
COUNT_OPTIONS: dict[str, tuple[str, Callable[[Any], Any], int]] = {
    "shards(lanes)": ("lanes", lambda v: sb.shards(TAR[0], lanes=v), 1),
    "shards(max_items)": ("max_items", lambda v: sb.shards(TAR[0], max_items=v), 1),
    "shards(max_concurrent_io)": (
        "max_concurrent_io",
        lambda v: sb.shards(TAR[0], max_concurrent_io=v),
        1,
    ),
    "shards(retries)": ("retries", lambda v: sb.shards(TAR[0], retries=v), 0),
    "shards(max_failures)": (
        "max_failures",
        lambda v: sb.shards(TAR[0], on_error="skip", max_failures=v),
        0,
    ),
    "shards(samples_per_shard)": (
        "samples_per_shard",
        lambda v: sb.shards(TAR[0], samples_per_shard=v),
        0,
    ),
    "Loader(num_workers)": ("num_workers", lambda v: _loader(num_workers=v), 0),
    "Loader(max_batches)": ("max_batches", lambda v: _loader(max_batches=v), 1),
    "Loader(device_depth)": ("device_depth", lambda v: _loader(device_depth=v), 1),
    "map(threads)": ("threads", lambda v: sb.Pipeline([1]).map(str, threads=v), 1),
    "map(max_items)": ("max_items", lambda v: sb.Pipeline([1]).map(str, threads=2, max_items=v), 1),
    "decode(threads)": ("threads", lambda v: sb.Pipeline([{}]).decode(threads=v), 1),
    "shuffle(buffer_items)": ("buffer_items", lambda v: sb.Pipeline([1]).shuffle(v), 1),
    "batch(n)": ("batch_size", lambda v: sb.Pipeline([1]).batch(v), 1),
    "prefetch(max_items)": (
        "max_items",
        lambda v: sb.Pipeline([1]).prefetch(max_items=v, max_bytes="1MiB"),
        1,
    ),
    "nodes.ParallelMapper(threads)": (
        "threads",
        lambda v: (lambda n, s: n.ParallelMapper(s, str, threads=v, max_bytes="1MiB"))(*_nodes()),
        1,
    ),
    "nodes.Prefetcher(max_items)": (
        "max_items",
        lambda v: (lambda n, s: n.Prefetcher(s, max_items=v, max_bytes="1MiB"))(*_nodes()),
        1,
    ),
}


@pytest.mark.parametrize("bad", [1.5, 2.0, True, "3", -1, 0], ids=repr)
@pytest.mark.parametrize("option", sorted(COUNT_OPTIONS))
def test_every_count_option_refuses_non_ints(option: str, bad: Any) -> None:
    name, build, minimum = COUNT_OPTIONS[option]
    if bad == 0 and minimum == 0 and not isinstance(bad, bool):
        build(bad)  # 0 is allowed here
        return
    with pytest.raises((TypeError, ValueError), match=name):
        build(bad)


@pytest.mark.parametrize(
    ("weights", "error", "named"),
    [
        (["a", 1], TypeError, r"weights\[0\]='a'"),
        ([True, 1], TypeError, r"weights\[0\]=True"),
        ([1, None], TypeError, r"weights\[1\]=None"),
        ([math.nan, 1], ValueError, r"weights\[0\]=nan"),
        ([1, math.inf], ValueError, r"weights\[1\]=inf"),
        ([1, -2], ValueError, r"weights\[1\]=-2"),
        ([0, 1], ValueError, r"weights\[0\]=0"),
        ("ab", TypeError, "weights="),
        (3, TypeError, "weights="),
        ([1], ValueError, "1 weights for 2 pipelines"),
        ([1e308, 1e-308], ValueError, r"weights\[1\]=1e-308 is too small"),
    ],
)
def test_mix_weights_are_numbers_and_named(weights: Any, error: type, named: str) -> None:
    p = sb.Pipeline([1, 2])
    with pytest.raises(error, match=named):
        sb.mix([p, p], weights=weights)


def test_mix_weights_accept_numbers_of_any_kind() -> None:
    import numpy as np

    p = sb.Pipeline([1, 2])
    sb.mix([p, p], weights=np.array([0.7, 0.3]))
    sb.mix([p, p], weights=(1, np.float32(2.5)))
    # finite weights whose sum overflows: each source half (they were all 0.0: the last
    # source was drawn every time until it ran out)
    big = sb.mix([sb.Pipeline(list(range(200))), sb.Pipeline([-1] * 200)], weights=[1e308] * 2)
    first = [x for x, _ in zip(big, range(100))]
    assert 30 < sum(x >= 0 for x in first) < 70


@pytest.mark.parametrize("bad", [-1, 1.5, 2.0, True, 2**70, "8", None], ids=repr)
@pytest.mark.parametrize("where", ["nodes.Prefetcher", "nodes.ParallelMapper", "ShardedBuffer"])
def test_sizeof_returning_a_bad_size_is_an_error_naming_sizeof(where: str, bad: Any) -> None:
    def sizeof(item: Any) -> Any:
        return bad

    if where == "ShardedBuffer":
        buf = sb.ShardedBuffer(lanes=1, max_items=2, max_bytes="1MiB", sizeof=sizeof)
        with pytest.raises((TypeError, ValueError), match="sizeof returned") as info:
            buf.put(0, b"x")
    else:
        nodes, source = _nodes()
        node = (
            nodes.Prefetcher(source, max_items=2, max_bytes="1MiB", sizeof=sizeof)
            if where == "nodes.Prefetcher"
            else nodes.ParallelMapper(source, str, threads=2, max_bytes="1MiB", sizeof=sizeof)
        )
        with pytest.raises((TypeError, ValueError), match="sizeof returned") as info:
            next(iter(node))
        node.shutdown() if hasattr(node, "shutdown") else None
    assert repr(bad) in str(info.value)


def test_sizeof_must_be_callable() -> None:
    nodes, source = _nodes()
    with pytest.raises(TypeError, match="sizeof"):
        nodes.Prefetcher(source, max_items=2, max_bytes="1MiB", sizeof=3)


def test_sizeof_returning_good_sizes_still_works() -> None:
    import numpy as np

    nodes, source = _nodes()
    node = nodes.Prefetcher(source, max_items=2, max_bytes="1MiB", sizeof=lambda x: np.int64(8))
    assert list(node) == [0, 1, 2, 3]


@pytest.mark.parametrize("empty", ["", "  "])
def test_empty_cache_dir_is_refused(tar: str, empty: Any) -> None:
    with pytest.raises(ValueError, match=r"cache_dir=.*empty"):
        sb.shards(tar, cache_dir=empty, cache_limit="1MiB")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")], ids=str)
def test_cuda_device_without_cuda_refused_at_build(device: Any) -> None:
    with pytest.raises(ValueError, match=r"device=.*CUDA is not available"):
        _loader(device=device)
    with pytest.raises(ValueError, match="CUDA is not available"):
        sb.DevicePrefetcher([], device=device)


def test_device_values() -> None:
    assert _loader(device="cpu").device == torch.device("cpu")
    assert _loader(device=None).device is None
    assert list(_loader(device="cpu")) == [1, 2]
    with pytest.raises(ValueError, match="device='gpu0'"):
        _loader(device="gpu0")
    with pytest.raises(TypeError, match="device=0"):
        _loader(device=0)
    if torch.cuda.is_available():  # a GPU machine: the visible devices pass, the rest not
        assert _loader(device="cuda").device.type == "cuda"
        n = torch.cuda.device_count()
        with pytest.raises(ValueError, match=f"{n} CUDA device"):
            _loader(device=f"cuda:{n}")


# -- equalize ---------------------------------------------------------------------------


def test_equalize_without_samples_per_shard_refused_at_build(tar: str) -> None:
    with pytest.raises(ValueError, match=r"equalize='pad' needs .*samples_per_shard"):
        sb.shards(tar, equalize="pad")
    with pytest.raises(ValueError, match="samples_per_shard has 3 counts for 2 shards"):
        sb.shards(tar, equalize="drop", samples_per_shard=[4, 4, 4])
    with pytest.raises(ValueError, match="equalize='drop' needs a sequence source"):
        sb.Pipeline(iter([1, 2]), equalize="drop")
    sb.shards(tar, equalize="pad", samples_per_shard=[4, 4])  # right: built
    sb.shards(tar, equalize="pad", samples_per_shard=4)


@pytest.mark.parametrize("lanes", [1, 2])
def test_understated_samples_per_shard_with_pad_is_an_error_not_lost_samples(
    tmp_path: Path, lanes: int
) -> None:
    """Shards of 20 samples declared as 10: the batch counts come out for 10, and the
    stream would stop there (with 2 lanes exactly at the target, both shards at sample
    9). The read names the shard, what was declared and what was read."""
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 2, 20)
    pipe = sb.shards(
        str(tmp_path / "s" / "*.tar"),
        equalize="pad",
        samples_per_shard=10,
        lanes=lanes,
        rank=0,
        world_size=1,
    ).batch(5)
    with pytest.raises(ValueError) as info:
        list(pipe)
    msg = str(info.value)
    assert "shard-00000" in msg and "10 declared, at least 11 read" in msg, msg
    assert "samples_per_shard" in msg and "equalize='pad'" in msg, msg
    right = sb.shards(
        str(tmp_path / "s" / "*.tar"), equalize="pad", samples_per_shard=20, lanes=lanes
    ).batch(5)
    assert sum(len(b["__key__"]) for b in right) == 40


@pytest.mark.parametrize("mode", ["pad", "drop"])
@pytest.mark.parametrize("lanes", [1, 2])
def test_overstated_samples_per_shard_is_an_error_not_repeated_samples(
    tmp_path: Path, mode: str, lanes: int
) -> None:
    """Shards of 6 samples declared as 50: the batch counts would come out for 50, and
    the missing ones be made up by repeating the 6 (found by a new user: declared 1000
    for shards of 40, each sample delivered up to 21 times, nothing logged)."""
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 3, 6)
    pipe = sb.shards(
        str(tmp_path / "s" / "*.tar"), equalize=mode, samples_per_shard=50, lanes=lanes
    ).batch(4)
    with pytest.raises(ValueError) as info:
        list(pipe)
    msg = str(info.value)
    assert "shard-0000" in msg and "50 declared, it ended at sample 5" in msg, msg
    assert "fewer samples" in msg and f"equalize={mode!r}" in msg and "(and 2 more" in msg


@pytest.mark.timeout(120)
def test_overstated_samples_per_shard_is_an_error_in_loader_workers(tmp_path: Path) -> None:
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 4, 5)
    pipe = sb.shards(str(tmp_path / "s" / "*.tar"), equalize="pad", samples_per_shard=9)
    loader = sb.Loader(
        pipe.batch(2, collate=list), num_workers=2, max_batches=4, max_bytes="16MiB", timeout_s=60
    )
    try:
        with pytest.raises(ValueError, match="9 declared, it ended at sample 4"):
            list(loader)
    finally:
        loader.close()


def test_a_shard_cut_short_under_on_error_skip_is_not_refused(tmp_path: Path) -> None:
    """``on_error="skip"``: a failed shard gives its good prefix, counted and logged where
    it failed; the declared counts are right, so the short read is not refused."""
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 3, 6)
    bad = sorted((tmp_path / "s").glob("*.tar"))[1]
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    pipe = sb.shards(
        str(tmp_path / "s" / "*.tar"), equalize="pad", samples_per_shard=6, on_error="skip"
    ).batch(6, collate=list)
    got = [s["__key__"] for b in pipe for s in b]  # (no ValueError)
    assert 12 < len(set(got)) < 18 and len(got) <= 18  # (the 3 batches of 6 declared)


def test_an_empty_shard_with_a_declared_count_is_an_error(tmp_path: Path) -> None:
    """A shard that gives no sample at all is short too (it never shows in the stream)."""
    import tarfile

    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 2, 4)
    with tarfile.open(tmp_path / "s" / "shard-99999.tar", "w"):
        pass  # an empty tar
    pipe = sb.shards(str(tmp_path / "s" / "*.tar"), equalize="pad", samples_per_shard=4)
    with pytest.raises(ValueError, match=r"shard-99999\.tar .*4 declared, it gave no sample"):
        list(pipe.batch(2))


def test_a_shard_shared_by_slots_is_not_short(tmp_path: Path) -> None:
    """Fewer shards than slots: each slot reads every m-th sample of its shard, and
    its last one is before the end; the right counts are not refused."""
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 1, 7)
    seen = []
    for rank in range(3):
        pipe = sb.shards(
            str(tmp_path / "s" / "*.tar"),
            equalize="drop",
            samples_per_shard=7,
            rank=rank,
            world_size=3,
        ).batch(1, collate=list)
        seen += [s["__key__"] for b in pipe for s in b]
    assert len(seen) == 6 and len(set(seen)) == 6  # 2 a rank, the 7th dropped


def test_right_counts_still_pad(tmp_path: Path) -> None:
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 3, 6)
    for rank in range(2):  # rank 0: 2 shards, rank 1: one, padded by repeats
        pipe = sb.shards(
            str(tmp_path / "s" / "*.tar"),
            equalize="pad",
            samples_per_shard=[6, 6, 6],
            rank=rank,
            world_size=2,
        ).batch(4)
        assert len(list(pipe)) == 3


@pytest.mark.parametrize("raw", ["abc", "-5", "1.5", "1MiB"])
def test_allocator_environment_variables_refuse_bad_values(monkeypatch, raw):
    from streambuf._worker import _env_bytes

    monkeypatch.setenv("STREAMBUF_MMAP_THRESHOLD", raw)
    with pytest.raises(ValueError, match=r"STREAMBUF_MMAP_THRESHOLD=.*whole number"):
        _env_bytes("STREAMBUF_MMAP_THRESHOLD", 1 << 20)


def test_allocator_environment_variables_default_and_values(monkeypatch):
    from streambuf._worker import _env_bytes

    monkeypatch.delenv("STREAMBUF_ARENA_MAX", raising=False)
    assert _env_bytes("STREAMBUF_ARENA_MAX", 7) == 7
    monkeypatch.setenv("STREAMBUF_ARENA_MAX", " 4 ")
    assert _env_bytes("STREAMBUF_ARENA_MAX", 7) == 4
    monkeypatch.setenv("STREAMBUF_ARENA_MAX", "0")
    assert _env_bytes("STREAMBUF_ARENA_MAX", 7) == 0


def test_a_number_of_another_type_is_told_what_to_pass() -> None:
    """numpy's numbers are refused where a value may reach a JSON state; the error says
    what to pass. A Python float for an int gets no such hint (int(x) would truncate)."""
    import numpy as np

    from streambuf._units import check_int, check_seconds

    with pytest.raises(
        TypeError, match=r"must be an int >= 1 \(a Python int: int\(x\) of this int64\)"
    ):
        check_int(np.int64(3), name="n", minimum=1)
    with pytest.raises(TypeError, match=r"must be a number of seconds \(a Python float"):
        check_seconds(np.float32(0.5), name="t")
    with pytest.raises(TypeError) as info:
        check_int(2.5, name="n")
    assert "int(x)" not in str(info.value)
    with pytest.raises(TypeError, match=r"seed=.* must be an int \(a Python int"):
        sb.Pipeline([1], seed=np.int64(3))  # type: ignore[arg-type]
