"""Pack tokenized documents into fixed-length blocks, checkpoint mid-epoch, resume.

The example writes its own data: 8 tar shards (WebDataset layout) of 40 "documents"
each, a document being a ``.npy`` array of token ids of random length (some longer than
a block). ``.pack(256, eos=0)`` concatenates them with an end-of-document token and cuts
blocks of 256 tokens; ``document_ids`` says which document of the block each position
came from (for attention masks). A checkpoint taken after 5 batches resumes into a fresh
Loader and the blocks are exactly those of the uninterrupted run.

    python examples/pack_tokens.py
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np

import streambuf as sb

SEQ_LEN = 256
EOS = 0


def write_shards(root: Path, shards: int = 8, docs: int = 40) -> list[str]:
    rng = np.random.default_rng(0)
    urls = []
    for s in range(shards):
        path = root / f"docs-{s:04d}.tar"
        with tarfile.open(path, "w") as tar:
            for d in range(docs):
                tokens = rng.integers(1, 50_000, size=int(rng.integers(1, 700)), dtype=np.int32)
                buf = io.BytesIO()
                np.save(buf, tokens)
                info = tarfile.TarInfo(f"doc{s:04d}{d:04d}.npy")
                info.size = buf.tell()
                buf.seek(0)
                tar.addfile(info, buf)
        urls.append(str(path))
    return urls


def make_loader(urls: list[str]) -> sb.Loader:
    pipe = (
        sb.shards(urls, shuffle_shards=True, seed=0)
        .decode()  # "npy" -> a numpy array
        .shuffle(16)
        .pack(SEQ_LEN, key="npy", eos=EOS)  # {"tokens": [256], "document_ids": [256]}
        .batch(4)
    )
    return sb.Loader(pipe, num_workers=2, max_batches=4, max_bytes="64MiB")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        urls = write_shards(Path(tmp))
        full = [b["tokens"].tolist() for b in make_loader(urls)]

        loader = make_loader(urls)
        it = iter(loader)
        first = [next(it)["tokens"].tolist() for _ in range(5)]
        state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint file holds it
        it.close()

        resumed = make_loader(urls)
        resumed.load_state_dict(state)
        rest = [b["tokens"].tolist() for b in resumed]
        batch = next(iter(make_loader(urls)))

    assert first + rest == full, "the resumed run differs from the uninterrupted one"
    print(
        f"{len(full)} batches of 4 x {SEQ_LEN} tokens; tokens {tuple(batch['tokens'].shape)}, "
        f"document_ids {tuple(batch['document_ids'].shape)} "
        f"(first block: {int(batch['document_ids'][0].max()) + 1} documents)"
    )
    print(f"resumed after 5 batches: the {len(rest)} batches left equal the uninterrupted run")


if __name__ == "__main__":
    main()
