"""decode_member: clips from video bytes held in a sample dict (a tar shard member)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from streambuf import Pipeline, VideoError
from streambuf.video import clips_at_random_indices, decode_clips, decode_member
from streambuf.video.member import sample_index

pytestmark = pytest.mark.timeout(60)

SAMPLER = clips_at_random_indices(num_clips=2, num_frames_per_clip=3)


@pytest.fixture(scope="module")
def samples(videos) -> list[dict]:
    return [
        {"__key__": name, "__url__": "shard-000.tar", "mp4": path.read_bytes(), "cls": b"1"}
        for name, path in sorted(videos.items())
    ]


def test_list_of_clips_like_decode_clips(samples) -> None:
    dec = decode_member("mp4", sampler=SAMPLER, seed=7)
    for s in samples:
        got = dec(s)
        want = sorted(
            decode_clips(
                io.BytesIO(s["mp4"]),
                sampler=SAMPLER,
                seed=7,
                index=sample_index(s["__url__"], s["__key__"]),
            ),
            key=lambda c: int(c.clip_index),
        )
        assert [int(c.clip_index) for c in got] == [0, 1]
        assert all(torch.equal(a.data, b.data) for a, b in zip(got, want))
        assert got[0].source == f"shard-000.tar#{s['__key__']}.mp4"


def test_epoch_changes_the_clips_and_reaches_copies(samples) -> None:
    dec = decode_member(sampler=SAMPLER)
    first = [c.pts_seconds.tolist() for c in dec(samples[0])]
    copy = pickle.loads(pickle.dumps(dec))
    assert [c.pts_seconds.tolist() for c in copy(samples[0])] == first
    dec.set_epoch(1)
    assert [c.pts_seconds.tolist() for c in dec(samples[0])] != first


def test_as_a_threaded_map_stage(samples) -> None:
    dec = decode_member(("webm", "mp4"), sampler=SAMPLER, width=16, height=16)
    out = list(Pipeline(samples).map(dec, threads=3))
    assert len(out) == len(samples) and all(len(x) == 2 for x in out)
    assert out[0][0].data.shape == (3, 3, 16, 16)


def test_missing_field_and_bad_bytes(samples) -> None:
    dec = decode_member("mkv", sampler=SAMPLER)
    with pytest.raises(VideoError, match=r"no field 'mkv' \(fields: cls, mp4\)"):
        dec(samples[0])
    bad = dict(samples[0], mp4=b"\0" * 100)
    with pytest.raises(VideoError) as info:
        decode_member(sampler=SAMPLER)(bad)
    assert info.value.stage == "video.open" and "shard-000.tar#" in str(info.value.source)
    skip = decode_member(sampler=SAMPLER, on_error="skip")
    assert skip(bad) == [] and skip.stats.failures == 1
    with pytest.raises(TypeError, match="not bytes"):
        decode_member(sampler=SAMPLER)(dict(samples[0], mp4="text"))
    with pytest.raises(ValueError, match="field"):
        decode_member("", sampler=SAMPLER)
