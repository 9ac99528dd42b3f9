"""A webdataset pipeline and its streambuf equivalent, on shards webdataset's own
``ShardWriter`` makes here (images as jpg or png, labels, one sample in 8 corrupt):
both yield the same (image, label) pairs. docs/network.md, "Migrating from webdataset".

    python examples/webdataset_migration.py     # needs: pip install webdataset pillow
"""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np
import torch

import streambuf as sb


def augment(image: torch.Tensor) -> torch.Tensor:
    return image.flip(-1)  # a horizontal flip (CHW)


def is_valid(sample: dict) -> bool:
    return sample["label"] != 0


def make_shards(folder: str, n: int = 48) -> list[str]:
    import webdataset as wds
    from PIL import Image

    rng = np.random.default_rng(0)
    with wds.ShardWriter(os.path.join(folder, "train-%04d.tar"), maxcount=16, verbose=0) as sink:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                buf, format="PNG" if i % 2 else "JPEG"
            )
            image = b"not an image" if i % 8 == 5 else buf.getvalue()
            sink.write({"__key__": f"{i:05d}", "png" if i % 2 else "jpg": image, "cls": i % 4})
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def with_webdataset(urls: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode("torchrgb8", handler=wds.warn_and_continue)
        .rename(image="jpg;png", label="cls")
        .map_dict(image=augment)
        .select(is_valid)
        .to_tuple("image", "label")
        .batched(4)
    )
    return list(ds)


def with_streambuf(urls: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pipe = (
        sb.shards(urls, shuffle_shards=False, lanes=1)
        .decode("torchrgb8", on_error="skip", max_failures=10)
        .rename(image="jpg;png", label="cls")
        .map_dict(image=augment)
        .select(is_valid)
        .to_tuple("image", "label")
        .batch(4)
    )
    return list(pipe)


def main() -> None:
    import logging
    import warnings

    logging.getLogger("streambuf").setLevel(logging.ERROR)  # the 6 skips are expected
    warnings.filterwarnings("ignore", message="DecodingError")  # webdataset's, same 6
    with tempfile.TemporaryDirectory() as folder:
        urls = make_shards(folder)
        theirs, ours = with_webdataset(urls), with_streambuf(urls)
    images = [img for b in ours for img in b[0]]
    assert len(theirs) == len(ours), (len(theirs), len(ours))
    for (ti, tl), (oi, ol) in zip(theirs, ours):
        assert torch.equal(ti, oi) and torch.equal(torch.as_tensor(tl), ol)
    print(f"webdataset and streambuf agree: {len(ours)} batches, {len(images)} images")


if __name__ == "__main__":
    main()
