"""The planted bugs of token streams: ``pack`` and ``token_files``. Each must
make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

P = "tests/test_pack.py"
T = "tests/test_token_files.py"
R = "tests/sources/test_token_files_remote.py"

_m = planted("tokens")

MUTANTS = [
    _m(
        "pack: a piece is numbered by where it starts, not by its range",
        "streambuf/packing.py",
        "Rec(None, (*rec.pos, piece(size, off, end)), rec.seq)",
        "Rec(None, (*rec.pos, off), rec.seq)",
        f"{P}::test_a_checkpoint_inside_a_long_document_keeps_its_offset",
    ),
    _m(
        "pack: a piece is numbered by its end alone (blocks assumed delivered in order)",
        "streambuf/packing.py",
        "Rec(None, (*rec.pos, piece(size, off, end)), rec.seq)",
        "Rec(None, (*rec.pos, piece(size, 0, end)), rec.seq)",
        f"{P}::test_an_unordered_map_after_pack_resumes_every_token_once",
    ),
    _m(
        "pack: a range owed before a delivered piece is not packed again",
        "streambuf/packing.py",
        "        if start > at:\n            out.append((at, start))",
        "        if False:\n            out.append((at, start))",
        f"{P}::test_an_unordered_map_after_pack_resumes_every_token_once",
    ),
    _m(
        "pack: the rest of a cut document is not owed any more",
        "streambuf/packing.py",
        "                    if end < stop:\n                        ledger.expanded(rec, 2)",
        "                    if False:\n                        ledger.expanded(rec, 2)",
        f"{P}::test_elastic_resume_two_to_three_workers_every_token_once",
    ),
    _m(
        "pack: a resumed document starts at its first token again",
        "streambuf/packing.py",
        "todo = owed_ranges(size, partial.pop(rec.pos, None))",
        "todo = owed_ranges(size, partial.pop(rec.pos, None) and None)",
        f"{P}::test_a_checkpoint_inside_a_long_document_keeps_its_offset",
    ),
    _m(
        "pack: document ids run on across blocks",
        "streambuf/packing.py",
        "        self.members, self.fill, self.docs = [], 0, 0",
        "        self.members, self.fill = [], 0",
        f"{P}::test_a_block_boundary_inside_a_document",
    ),
    _m(
        "pack: the dropped last block's documents stay owed",
        "streambuf/packing.py",
        "            ledger.settle_all(Rec(None, (), -1, self.members))",
        "            pass",
        f"{P}::test_nothing_stays_owed_when_the_stream_ends",
    ),
    _m(
        "token_files: blocks are read at a stride of seq_len + overlap",
        "streambuf/token_files.py",
        "at, length = b * self.seq_len * size, count * size",
        "at, length = b * count * size, count * size",
        f"{T}::test_local_blocks_equal_memmap_slices",
    ),
    _m(
        "token_files: a file that is not whole tokens is read anyway",
        "streambuf/token_files.py",
        "        if size % itemsize:\n",
        "        if False:\n",
        f"{T}::test_a_file_that_is_not_whole_tokens_is_named",
    ),
    _m(
        "pack: eos appended twice",
        "streambuf/packing.py",
        "            doc = np.append(doc, np.int64(self.eos))",
        "            doc = np.append(doc, [np.int64(self.eos)] * 2)",
        f"{P}::test_a_block_boundary_inside_a_document",
    ),
    _m(
        "pack: a block is cut at seq_len - 1 tokens",
        "streambuf/packing.py",
        "        n = cfg.seq_len\n",
        "        n = cfg.seq_len - 1\n",
        f"{P}::test_a_block_boundary_inside_a_document",
    ),
    _m(
        "token_files: byte offsets off by one element",
        "streambuf/token_files.py",
        "at, length = b * self.seq_len * size, count * size",
        "at, length = (b * self.seq_len + 1) * size, count * size",
        f"{T}::test_local_blocks_equal_memmap_slices",
    ),
    _m(
        "pack: the block being filled is not charged to max_bytes",
        "streambuf/packing.py",
        "        return 12 * self.seq_len",
        "        return 0",
        f"{P}::test_the_block_being_filled_is_charged_to_max_bytes",
    ),
    _m(
        "token_files: the cache's copy is never read (every block remote)",
        "streambuf/token_files.py",
        "        if self.cache is not None or _is_local(url):",
        "        if _is_local(url):",
        f"{R}::test_cached_files_are_fetched_once_and_read_locally_after",
    ),
    _m(
        "token_files: a descriptor a thread still reads is closed",
        "streambuf/token_files.py",
        "            for old in [k for k, e in self.open.items() if e[2] == 0][:excess]:",
        "            for old in list(self.open)[:excess]:",
        f"{R}::test_a_descriptor_in_use_is_never_closed",
    ),
    _m(
        "token_files: a state loads into the same files in another order",
        "streambuf/_source_kinds.py",
        '        return f";items[{identity()}]" if callable(identity) else ""',
        '        return ""',
        f"{T}::test_a_state_does_not_load_into_the_files_in_another_order",
    ),
    _m(
        "token_files: a file swapped for another with as many blocks keeps the identity",
        "streambuf/token_files.py",
        "        listed = json.dumps([list(names), list(counts)]).encode()",
        "        listed = json.dumps([list(counts)]).encode()",
        f"{T}::test_a_state_does_not_load_into_the_files_in_another_order",
    ),
    _m(
        "token_files: descriptors outlive their pipeline",
        "streambuf/token_files.py",
        "        weakref.finalize(self, _close_all, self.open).atexit = False",
        "        pass",
        f"{T}::test_descriptors_are_closed_with_their_pipeline",
    ),
    _m(
        "pack: a uint64 token id past int64 wraps to a negative one",
        "streambuf/packing.py",
        "        if doc.size and doc.dtype == np.uint64 and int(doc.max()) > _INT64_MAX:",
        "        if False:",
        f"{P}::test_bad_documents_are_named",
    ),
    _m(
        "pack: an eos past int64 is accepted (and fails at the first document)",
        "streambuf/packing.py",
        "    if not 0 <= value <= _INT64_MAX:",
        "    if not 0 <= value:",
        f"{P}::test_options_and_stage_order_are_checked",
    ),
    _m(
        "token_files: files of one name in two folders keep one identity",
        "streambuf/token_files.py",
        "    names = shard_names(files)",
        '    names = [str(f).rsplit("/", 1)[-1] for f in files]',  # (names alone)
        f"{T}::test_files_of_one_name_in_two_folders_are_told_apart",
    ),
    _m(
        "pack: eos=0 taken for no eos",
        "streambuf/packing.py",
        "        if self.eos is not None:",
        "        if self.eos:",
        f"{P}::test_eos_zero_and_a_pad_token_in_the_last_block",
    ),
    _m(
        "pack: the last block is padded with 0 whatever pad says",
        "streambuf/packing.py",
        "        self.tokens = np.full(n, self.cfg.pad, dtype=np.int64)",
        "        self.tokens = np.full(n, 0, dtype=np.int64)",
        f"{P}::test_eos_zero_and_a_pad_token_in_the_last_block",
    ),
    _m(
        "token_files: shuffle=False shuffles the blocks anyway",
        "streambuf/token_files.py",
        "        shuffle_shards=shuffle,",
        "        shuffle_shards=True,",
        f"{T}::test_unshuffled_blocks_come_file_by_file_in_the_order_given",
    ),
    _m(
        "token_files: a file's blocks are numbered from its end (come last first)",
        "streambuf/token_files.py",
        "        return f, i - self.starts[f]",
        "        return f, self.starts[f + 1] - 1 - i",
        f"{T}::test_unshuffled_blocks_come_file_by_file_in_the_order_given",
    ),
    _m(
        "token_files: rank= and world_size= given are ignored (every rank reads every block)",
        "streambuf/token_files.py",
        "        rank=rank,\n        world_size=world_size,",
        "        rank=None,\n        world_size=None,",
        f"{T}::test_explicit_rank_and_world_size_split_the_blocks_without_torch_distributed",
    ),
    _m(
        "token_files: blocks counted without the overlap (the last one reads past the end)",
        "streambuf/token_files.py",
        "        counts.append(max(0, (size // itemsize - overlap) // seq_len))",
        "        counts.append(max(0, size // itemsize // seq_len))",
        f"{T}::test_files_of_whole_blocks_end_at_their_last_token",
    ),
    _m(
        "token_files: keep_dtype blocks are read-only views of the bytes read",
        "streambuf/token_files.py",
        "array.copy() if self.keep_dtype else",
        "array if self.keep_dtype else",
        f"{T}::test_blocks_are_writable_copies",
    ),
]
