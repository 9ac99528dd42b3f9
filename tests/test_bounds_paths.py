"""Memory bounds on the float image path (4 bytes per value), not only the uint8 one:
real JPEG and PNG members in real tar shards, decoded with ``"torchrgb"`` (float32).

* The decode bound (``max_decoded_bytes``) counts a float image at 4 bytes per value,
  from its header, before any pixel is decoded.
* Through ``Loader(max_bytes=...)``: the budget counts the float batches at their true
  size (what the consumer computes itself, ``element_size() * numel()``), its peak
  reaches >= 90% of the limit and never passes it, and the true bytes of the batches in
  flight at once never pass it either.
"""

from __future__ import annotations

import io
import random
import time

import pytest
import torch

import streambuf as sb
from streambuf.errors import ShardError
from streambuf.wds import Decoder
from tests.sources.helpers import write_tar

pytestmark = pytest.mark.timeout(120)

Image = pytest.importorskip("PIL.Image")

W = H = 64
FLOAT_IMAGE = 3 * W * H * 4  # 48 KiB decoded as "torchrgb"
PER_SHARD = 40
BATCH = 4


def image_bytes(i: int, fmt: str) -> bytes:
    rng = random.Random(i)
    img = Image.new("RGB", (W, H), tuple(rng.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def make_shards(root, count=4):
    """Shards 0, 2: JPEG members; shards 1, 3: PNG members (``key.jpg`` / ``key.png``)."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(count):
        ext, fmt = ("jpg", "JPEG") if s % 2 == 0 else ("png", "PNG")
        samples = [
            {
                "__key__": f"s{s}/{i:04d}".encode(),
                ext: image_bytes(s * 1000 + i, fmt),
                "cls": str(s * 1000 + i).encode(),
            }
            for i in range(PER_SHARD)
        ]
        paths.append(str(write_tar(root / f"shard-{s}.tar", samples)))
    return paths


def decoded(decoder: Decoder, sample: dict) -> dict:
    out = decoder(sample)
    assert isinstance(out, dict)
    return out


def true_nbytes(batch) -> int:
    return sum(t.element_size() * t.numel() for t in batch)


def test_the_decode_bound_counts_float_images_at_four_bytes_per_value(tmp_path):
    png = image_bytes(1, "PNG")
    sample = {"__key__": "k", "png": png}
    as_uint8 = 3 * W * H
    # uint8 fits where float does not: a float bound must count 4 bytes per value
    assert (
        decoded(Decoder("torchrgb8", max_decoded_bytes=as_uint8), sample)["png"].dtype
        == torch.uint8
    )
    with pytest.raises(ShardError, match=f"decodes to {FLOAT_IMAGE} bytes"):
        Decoder("torchrgb", max_decoded_bytes=FLOAT_IMAGE - 1)(sample)
    with pytest.raises(ShardError, match=f"decodes to {FLOAT_IMAGE} bytes"):
        Decoder("rgb", max_decoded_bytes=as_uint8 * 2)(sample)  # numpy float32 too
    out = decoded(Decoder("torchrgb", max_decoded_bytes=FLOAT_IMAGE), sample)["png"]
    assert out.dtype == torch.float32 and out.element_size() * out.numel() == FLOAT_IMAGE
    # the per-sample bound adds float images up at their true size as well
    two = {"__key__": "k", "a.png": png, "b.png": png}
    with pytest.raises(ShardError, match="max_decoded_sample_bytes"):
        Decoder("torchrgb", max_decoded_sample_bytes=2 * FLOAT_IMAGE - 1)(two)
    assert len(decoded(Decoder("torchrgb", max_decoded_sample_bytes=2 * FLOAT_IMAGE), two)) == 3
    # and from real shards, through a pipeline: a JPEG member refused the same way
    urls = make_shards(tmp_path / "shards", count=1)
    pipe = sb.shards(urls).decode("torchrgb", max_decoded_bytes=FLOAT_IMAGE - 1)
    with pytest.raises(ShardError, match=f"decodes to {FLOAT_IMAGE} bytes"):
        next(iter(pipe))


@pytest.mark.parametrize("in_order", [False, True])
def test_loader_budget_counts_float_image_batches_at_their_true_size(tmp_path, in_order):
    urls = make_shards(tmp_path / "shards")
    pipe = sb.shards(urls, seed=3).decode("torchrgb").to_tuple("jpg;png", "cls").batch(BATCH)
    batch_bytes = BATCH * FLOAT_IMAGE + BATCH * 8  # float32 images + int64 labels
    # the lanes' read buffers first (fixed: half of max_bytes here), then a quarter of
    # the rest to the stage buffers: ~9.75 batches of credit
    max_bytes = 26 * batch_bytes
    loader = sb.Loader(
        pipe,
        num_workers=2,
        max_batches=64,
        max_bytes=max_bytes,
        in_order=in_order,
        adaptive=False,
        timeout_s=60,
    )
    seen, sizes = [], []
    for images, labels in loader:
        assert images.dtype == torch.float32 and images.shape == (BATCH, 3, H, W)
        sizes.append(true_nbytes((images, labels)))
        seen += [int(x) for x in labels]
        del images, labels
        time.sleep(0.03)  # a slow consumer: the workers fill the budget
    assert sorted(seen) == sorted(s * 1000 + i for s in range(4) for i in range(PER_SHARD))
    assert set(sizes) == {batch_bytes}
    s = loader.stats()
    b = s.budget
    assert b is not None
    limit = b.max_bytes
    rest = max_bytes - s.fixed_bytes
    assert s.fixed_bytes == 2 * (max_bytes // 2 // 2)  # the reads: 2 lanes of 2 MiB, cut
    assert s.stage_bytes is not None and limit == rest - rest // 4
    # the accounting is of the true size: the bytes it counted are the consumer's own sum
    assert s.bytes == sum(sizes), (s.bytes, sum(sizes))
    assert b.oversize == 0 and b.overshoot <= 2  # the first batch of each worker: estimate
    assert 0.9 * limit <= b.peak_in_flight_bytes <= limit, b
    # independent of the byte accounting: the batches in flight at once (their count),
    # at their true size, never held more than the limit
    assert b.peak_in_flight_batches * batch_bytes <= limit, b
    if in_order:  # sharded: each worker within its half
        assert all(p <= limit // 2 for p in b.per_worker_peak_bytes), b
    assert b.in_flight_bytes == 0
