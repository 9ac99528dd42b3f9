"""``Pipeline.pack(seq_len)``: tokenized documents packed into fixed-length blocks.

Each sample holds one document: a 1-D integer array, list or tensor (under ``key`` of a
dict sample, or the sample itself with ``key=None``). The documents are concatenated in
stream order, each followed by ``eos`` when given, and cut into blocks of ``seq_len``
tokens; each block is a sample ``{"tokens": int64 [seq_len], "document_ids": int32
[seq_len]}``, ``document_ids[i]`` the index, within the block, of the document position
``i`` came from (0, 1, ...; a block that starts in the middle of a document gives it 0;
``-1`` marks padding). The last partial block of a slot's stream is dropped
(``drop_last=True``, the default, as torchtitan and nanoGPT-style loaders do) or padded
with ``pad`` (``document_ids`` -1 there).

**Exactly once, and resume.** A document cut over several blocks is the
ledger's business, not the stage's: each piece of it is a child of the document's
position, numbered by the token range it holds (``(shard, index, piece)`` with ``piece =
start * (size + 1) + end``, ``size`` the document's length with its ``eos``: the
mechanism ``flatten`` uses for its children), and a block's members are its pieces.
Delivering a block settles its pieces; a document is owed until its last piece is
delivered, and a saved state lists, for each document owed, the pieces already
delivered. A resumed run (exact, or elastic at another worker count or world size) is
handed the owed documents again with those pieces, and the stage packs each document's
ranges not delivered, in order: every token is delivered exactly once, whatever order
the blocks were delivered in (an unordered ``map`` after ``pack`` delivers a document's
later piece before an earlier one). A piece number below ``size + 1`` is the range
``[0, end)`` (a state written before ranges were numbered: pieces were delivered in
order then). After an exact resume the blocks are
the same as without the stop (the replayed stream is the same, so is the cut); after an
elastic one, the blocks near the seam differ (a slot packs the remainders it was given,
in its own order), not the tokens. The stage keeps no state of its own.

**Memory.** It holds the block being filled, written in place: ``12 * seq_len`` bytes
(int64 tokens, int32 document ids), whatever the documents' lengths; a ``Loader``
charges it to ``max_bytes`` once per worker (``fixed_bytes``: the batches in flight
get that much less). It also references the document being cut, a sample upstream
already made (``stats().stages``: ``held_items``/``bytes`` show both).

**Limits.** At most one of ``pack`` and ``flatten`` (both number children of a
position); after ``pack`` only ``map``, ``filter``, ``batch`` and ``prefetch`` (a
block has no position of its own for ``shuffle`` or a composed stage to record); not in
a pipeline given to ``mix()``; not with ``equalize`` (the number of blocks is not known
from the number of documents).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._ledger import Rec
from ._units import check_bool, parse_count
from .errors import add_note
from .stages import Env, Stage, describe

__all__ = ["Pack"]


def _check_token(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"pack({name}={value!r}) must be an int token id >= 0 or None")
    if not 0 <= value <= _INT64_MAX:
        raise ValueError(f"pack({name}={value!r}) must be a token id in [0, 2**63 - 1] (int64)")
    return int(value)


_INT64_MAX = (1 << 63) - 1  # blocks hold int64 token ids


@dataclass(frozen=True)
class Pack(Stage):
    """The stage behind ``Pipeline.pack`` (see the module docstring)."""

    seq_len: int
    key: str | None = "tokens"
    eos: int | None = None
    drop_last: bool = True
    pad: int = 0
    name = "pack"
    replays = False  # a block cannot be made again from one position (mix)

    def __post_init__(self) -> None:
        parse_count(self.seq_len, name="seq_len")
        if self.key is not None and not isinstance(self.key, str):
            raise TypeError(f"pack(key={self.key!r}) must be a str (a field) or None")
        _check_token(self.eos, "eos")
        check_bool(self.drop_last, name="drop_last")
        if _check_token(self.pad, "pad") is None:
            raise TypeError("pack(pad=None): give an int token id to pad the last block with")

    def fixed_bytes(self) -> int:
        """The block being filled: int64 tokens and int32 document ids."""
        return 12 * self.seq_len

    def open(self, up: Iterator[Rec], env: Env, k: int, state: Any) -> Iterator[Rec]:
        run = _PackRun(self, env)
        env.held[k] = run.holding
        return run.run(up)

    def tokens(self, value: Any) -> np.ndarray:
        """The document of one sample as int64 tokens, ``eos`` appended; a clear error
        for anything else."""
        doc = value
        if self.key is not None:
            if not isinstance(value, dict) or self.key not in value:
                fields = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise KeyError(
                    f"pack(key={self.key!r}): the sample has no field {self.key!r} (it has "
                    f"{fields}); give key= the field holding the token ids, or key=None "
                    "when the sample is the array itself"
                )
            doc = value[self.key]
        if isinstance(doc, torch.Tensor):
            doc = doc.detach().cpu().numpy()
        elif isinstance(doc, list | tuple):
            doc = np.asarray(doc) if len(doc) else np.zeros(0, dtype=np.int64)
        if not isinstance(doc, np.ndarray):
            raise TypeError(
                f"pack(): the document is a {type(doc).__name__}; it must be a 1-D integer "
                "array, tensor or list of token ids (tokenize it first, e.g. in .map())"
            )
        if doc.ndim != 1:
            raise ValueError(
                f"pack(): the document has shape {tuple(doc.shape)}; it must be 1-D (one "
                "sequence of token ids per sample: flatten or split it first)"
            )
        if doc.size == 0:  # (np.array([]) is float64: no token to check)
            doc = np.zeros(0, dtype=np.int64)
        if doc.dtype == np.bool_ or not np.issubdtype(doc.dtype, np.integer):
            raise TypeError(
                f"pack(): the document's dtype is {doc.dtype}; token ids must be integers "
                "(tokenize, or .astype(int) if they are whole numbers)"
            )
        if doc.size and doc.min() < 0:
            raise ValueError(
                f"pack(): the document holds a negative token id ({int(doc.min())}); ids "
                "must be >= 0"
            )
        if doc.size and doc.dtype == np.uint64 and int(doc.max()) > _INT64_MAX:
            raise ValueError(
                f"pack(): the document holds a token id ({int(doc.max())}) past int64's "
                "range, which blocks hold; ids must be <= 2**63 - 1"
            )
        doc = doc.astype(np.int64, copy=False)
        if self.eos is not None:
            doc = np.append(doc, np.int64(self.eos))
        return doc


def piece(size: int, start: int, end: int) -> int:
    """The child number of the piece ``[start, end)`` of a document of ``size`` tokens."""
    return start * (size + 1) + end


def owed_ranges(size: int, delivered: list[int] | None) -> list[tuple[int, int]]:
    """The ranges ``[start, end)`` of a document of ``size`` tokens not in the pieces
    ``delivered`` (child numbers, ``piece``), in order; ``[(0, size)]`` when none was
    delivered, ``[]`` when nothing is owed (an empty document included)."""
    done = sorted(divmod(p, size + 1) for p in delivered or ())
    out: list[tuple[int, int]] = []
    at = 0
    for start, end in done:
        if start > at:
            out.append((at, start))
        at = max(at, end)
    if at < size:
        out.append((at, size))
    return out


class _PackRun:
    """One run of ``Pack``: the block being filled (its tokens and document ids written
    in place, so it holds exactly ``12 * seq_len`` bytes whatever the documents)."""

    def __init__(self, cfg: Pack, env: Env) -> None:
        self.cfg, self.env = cfg, env
        self.members: list[Rec] = []  # settled when the block is delivered
        self.fill = 0
        self.docs = 0  # documents that gave the block tokens
        self.doc: np.ndarray | None = None  # the document being cut
        self._new()

    def _new(self) -> None:
        n = self.cfg.seq_len
        self.tokens = np.full(n, self.cfg.pad, dtype=np.int64)
        self.ids = np.full(n, -1, dtype=np.int32)

    def holding(self) -> tuple[int, int]:
        doc = self.doc
        block = self.tokens.nbytes + self.ids.nbytes
        return len(self.members), block + (doc.nbytes if doc is not None else 0)

    def _block(self, last: bool) -> Rec:
        rec = Rec(
            {"tokens": torch.from_numpy(self.tokens), "document_ids": torch.from_numpy(self.ids)},
            (),
            -1,
            self.members,
            last,
        )
        self.members, self.fill, self.docs = [], 0, 0
        self._new()
        return rec

    def run(self, up: Iterator[Rec]) -> Iterator[Rec]:
        cfg, ledger, partial = self.cfg, self.env.ledger, self.env.partial
        n = cfg.seq_len
        for rec in up:
            try:
                tokens = cfg.tokens(rec.value)
            except Exception as exc:
                add_note(exc, f"streambuf: raised in stage 'pack' on {describe(rec.value)}")
                raise
            size = len(tokens)
            # the ranges not delivered before a resume (all of it on a first run)
            todo = owed_ranges(size, partial.pop(rec.pos, None))
            if not todo:  # nothing (left) to pack: owed to nobody with this block
                self.members.append(rec)
                continue
            self.doc = tokens
            first = True
            stop = todo[-1][1]
            for off, upto in todo:
                while off < upto:
                    end = min(upto, off + n - self.fill)
                    if end < stop:
                        ledger.expanded(rec, 2)  # this piece, and the rest owed
                    at = self.fill
                    self.tokens[at : at + end - off] = tokens[off:end]
                    if first:
                        self.docs += 1
                        first = False
                    self.ids[at : at + end - off] = self.docs - 1
                    self.members.append(Rec(None, (*rec.pos, piece(size, off, end)), rec.seq))
                    self.fill += end - off
                    off = end
                    if self.fill == n:
                        yield self._block(last=False)
                        first = True  # (the rest of it is document 0 of the next block)
            self.doc = None
        if self.fill and not cfg.drop_last:
            yield self._block(last=True)
        elif self.members:  # a partial block dropped, or empty documents at the end
            ledger.settle_all(Rec(None, (), -1, self.members))
            self.members, self.fill = [], 0
