"""Every option is checked when the object is built, in the calling process, with a
message naming the argument (issue: ``shards(urls, timeout_s=0, on_error="skip")`` used
to be accepted and then silently skipped every shard)."""

from __future__ import annotations

import inspect
import math
from dataclasses import fields

import pytest

import streambuf as sb
from streambuf._units import MAX_BYTES
from streambuf.sources import ShardOptions

BAD_NUMBERS = [0, -1, math.nan, math.inf, "3", True, None]


@pytest.fixture
def tar(tmp_path):
    from tests.sources.helpers import make_shards

    make_shards(tmp_path / "s", 1, 2)
    return str(tmp_path / "s" / "*.tar")


def test_shards_signature_mirrors_shard_options():
    params = inspect.signature(sb.shards).parameters
    for f in ShardOptions.names():
        assert f in params, f"shards() lacks option {f}"
        assert params[f].default == getattr(ShardOptions, f), f"default of {f} differs"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", math.nan),
        ("timeout_s", "30"),
        ("lanes", 0),
        ("lanes", 2.5),
        ("retries", -1),
        ("backoff_s", math.inf),
        ("max_bytes", 1 << 63),
        ("max_bytes", "lots"),
        ("max_bytes", math.nan),
        ("block_bytes", 0),
        ("readahead_bytes", -1),
        ("on_error", "ignore"),
        ("max_failures", -2),
        ("max_failures", "3"),
        ("order", "random"),
        ("min_rate_bps", -5),
        ("rate_window_s", 0),
        ("max_concurrent_io", 0),
        ("storage_options", "endpoint=x"),
    ],
)
def test_shards_rejects_bad_options_at_build(tar, option, value):
    with pytest.raises((TypeError, ValueError), match=option):
        sb.shards(tar, **{option: value})


def test_timeout_zero_with_skip_is_refused_not_silently_skipping(tar):
    with pytest.raises(ValueError, match="timeout_s"):
        sb.shards(tar, timeout_s=0, on_error="skip")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("num_workers", -1),
        ("num_workers", "2"),
        ("max_batches", 0),
        ("max_bytes", 1 << 63),
        ("max_bytes", math.inf),
        ("timeout_s", 0),
        ("timeout_s", math.nan),
        ("tuner_interval_s", -1),
        ("in_order", "yes"),
        ("multiprocessing_context", "threads"),
        ("device_depth", 0),
        ("log_every_s", math.inf),
    ],
)
def test_loader_rejects_bad_options(option, value):
    kw = {"num_workers": 0, "max_batches": 2, "max_bytes": "1MiB", option: value}
    with pytest.raises((TypeError, ValueError), match=option):
        sb.Loader(sb.Pipeline([1, 2]), **kw)


@pytest.mark.parametrize(
    ("stage", "kwargs", "name"),
    [
        ("map", {"threads": 0}, "threads"),
        ("map", {"threads": "4"}, "threads"),
        ("map", {"max_bytes": math.nan}, "max_bytes"),
        ("map", {"ordered": 1}, "ordered"),
        ("shuffle", {"max_bytes": -1}, "max_bytes"),
        ("batch", {"drop_last": "no"}, "drop_last"),
        ("prefetch", {"max_items": 0, "max_bytes": "1MiB"}, "max_items"),
    ],
)
def test_stages_reject_bad_options(stage, kwargs, name):
    pipe = sb.Pipeline([1, 2])
    args = {"map": (str,), "shuffle": (4,), "batch": (2,), "prefetch": ()}[stage]
    with pytest.raises((TypeError, ValueError), match=name):
        getattr(pipe, stage)(*args, **kwargs)


def test_stage_counts_reject_bad_values():
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        sb.Pipeline([1]).batch(0)
    with pytest.raises((TypeError, ValueError), match="buffer_items"):
        sb.Pipeline([1]).shuffle(-3)
    with pytest.raises(TypeError, match="callable"):
        sb.Pipeline([1]).map(3)  # type: ignore[arg-type]


def test_sharding_arguments_are_defined_once(tar):
    # Pipeline, shards() and video.clips() take the same six sharding arguments (clips
    # names two of them after videos) and hand one Sharding along
    from streambuf.sharding import Sharding
    from streambuf.video import clips

    video = {"shuffle_shards": "shuffle_videos", "samples_per_shard": "clips_per_video"}
    for entry, names in ((sb.Pipeline, {}), (sb.shards, {}), (clips, video)):
        params = inspect.signature(entry).parameters
        for f in fields(Sharding):
            if f.name != "arg_names":
                assert names.get(f.name, f.name) in params, f"{entry.__name__} lacks {f.name}"
    pipe = sb.shards(tar, seed=3, samples_per_shard=[2], equalize="drop", rank=1, world_size=2)
    want = Sharding(True, 3, (2,), "drop", 1, 2)
    assert pipe._sharding == want and pipe.map(str)._sharding == want
    assert sb.Pipeline([1], seed=3).rank_world is None and pipe.rank_world == (1, 2)
    with pytest.raises(ValueError, match="give both rank= and world_size="):
        Sharding(rank=0)


def test_pipeline_rejects_bad_options():
    with pytest.raises(TypeError, match="seed"):
        sb.Pipeline([1], seed="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shuffle_shards"):
        sb.Pipeline([1], shuffle_shards="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank"):
        sb.Pipeline([1], rank=2, world_size=2)
    with pytest.raises(TypeError, match="samples_per_shard"):
        sb.Pipeline([1], samples_per_shard=[1.5])  # type: ignore[list-item]


def test_clips_rejects_bad_options(tmp_path):
    pytest.importorskip("av")
    from streambuf.video import clips, clips_at_random_indices

    s = clips_at_random_indices(num_clips=1, num_frames_per_clip=2)
    video = str(tmp_path / "x.mp4")
    for option, value in [
        ("width", 0),
        ("width", "224"),
        ("threads", 0),
        ("ffmpeg_threads", -1),
        ("layout", "HWC"),
        ("on_error", "drop"),
        ("max_failures", -1),
        ("shuffle_videos", "no"),
        ("decoder", "gpu"),
        ("decoder", None),
    ]:
        with pytest.raises((TypeError, ValueError), match=option):
            clips(video, sampler=s, **{option: value})


def test_byte_sizes_have_a_ceiling():
    from streambuf._units import parse_bytes

    assert parse_bytes(MAX_BYTES) == MAX_BYTES
    with pytest.raises(ValueError, match="too large"):
        parse_bytes(MAX_BYTES + 1)
    with pytest.raises(TypeError, match="float"):  # a byte size is an int or "1GiB"
        parse_bytes(math.inf)
    for bad in BAD_NUMBERS[:2]:
        with pytest.raises(ValueError):
            parse_bytes(bad)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("fn", 5),
        ("sizeof", 5),
        ("on_threads", 5),
        ("ordered", "yes"),
        ("adaptive", None),
        ("close_source", 1),
        ("join_timeout_s", "x"),
        ("join_timeout_s", -1),
        ("join_timeout_s", math.nan),
        ("name", 3),
    ],
)
def test_thread_prefetcher_refuses_bad_options_when_built(option, value):
    """Each option of the public ``ThreadPrefetcher`` is checked when it is built (not
    at the first item on a background thread, or at ``break``: ``join_timeout_s="x"``
    failed inside ``close()`` and left its threads running)."""
    from streambuf.prefetch import ThreadPrefetcher

    kw = {"max_items": 4, "max_bytes": "1MiB", "threads": 2, option: value}
    with pytest.raises((TypeError, ValueError), match=option):
        ThreadPrefetcher(range(10), **kw)
