"""The planted bugs of "Per-sample cost": shard lanes switching to and from inline reads
(the order and exactly-once across a switch), and no read-ahead thread for local files.
Each must make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

ADAPTIVE = "tests/sources/test_adaptive_lanes.py"

_m = planted("cost")

MUTANTS = [
    _m(
        "adaptive lanes: a pause stops at once, dropping what the lanes' buffer holds",
        "streambuf/_source.py",
        '                if chooser is not None and chooser.tick() == "pause":\n'
        "                    self._end_phase()\n",
        '                if chooser is not None and chooser.tick() == "pause":\n'
        "                    self._end_phase()\n                    return\n",
        f"{ADAPTIVE}::test_switching_keeps_round_robin_order",
    ),
    _m(
        "adaptive lanes: the inline reader starts at lane 0, not the lane due next",
        "streambuf/_source.py",
        "            lane = self._next_lane\n            while self._done[lane]:",
        "            lane = 0\n            while self._done[lane]:",
        f"{ADAPTIVE}::test_switching_keeps_round_robin_order",
    ),
    _m(
        "adaptive lanes: lanes stop at the count made, not counting the one being read",
        "streambuf/_source.py",
        "max(m + d for m, d in zip(self._made, self._driving))",
        "min(self._made)",
        f"{ADAPTIVE}::test_a_pause_waits_for_the_lane_behind",
    ),
    _m(
        "local files start on the lane threads",
        "streambuf/_source.py",
        "self.chooser = InlineChooser(max(4 * k, 32), start_inline=local)",
        "self.chooser = InlineChooser(max(4 * k, 32), start_inline=False)",
        f"{ADAPTIVE}::test_local_files_start_inline_without_threads",
    ),
    _m(
        "a local file's next shard is read ahead on a helper thread",
        "streambuf/sources/access.py",
        "        if stream.local:",
        "        if False:",
        "tests/sources/test_lanes.py::test_local_shards_are_not_read_ahead",
    ),
]
MUTANTS += [
    _m(
        "lean tar: only the first header's number fields are ever checked",
        "streambuf/sources/tar.py",
        "            if numbers not in _VALID_NUMBERS:",
        "            if not _VALID_NUMBERS:",
        "tests/sources/test_tar.py::test_a_bad_number_field_after_good_headers_is_refused",
    ),
    _m(
        "lean tar: a sample's byte offset leaves out the previous member's padding",
        "streambuf/sources/tar.py",
        "                chain = base_offset + inp.pos + inp.owed",
        "                chain = base_offset + inp.pos",
        "tests/sources/test_tar.py::test_sample_byte_ranges_are_tarfiles_member_offsets",
        "tests/sources/test_resume_shards.py",
    ),
]
MUTANTS += [
    _m(
        "fsspec reads: every request stays one block (no growth)",
        "streambuf/io/opener.py",
        "            self._want = min(2 * self._want, self._cap)",
        "            self._want = self._block",
        "tests/sources/test_s3.py::test_s3_resume_through_faulty_proxy",
    ),
    _m(
        "fsspec reads: a bounded range requests past its end",
        "streambuf/io/opener.py",
        "            stop = self.end if self.end is not None else self.size",
        "            stop = self.size",
        "tests/sources/test_s3.py::test_s3_bounded_read_requests_only_its_range",
    ),
    _m(
        "fsspec reads: a small object's rest comes in growing requests, not one",
        "streambuf/io/opener.py",
        "                want = rest if rest <= self._cap else min(want, rest)",
        "                want = min(want, rest)",
        "tests/sources/test_s3.py::test_s3_small_object_is_one_request",
    ),
]
MUTANTS += [
    _m(
        "in-place reads: a bounded range reads past its end",
        "streambuf/io/_resumable.py",
        "        m = min(n, self._block)\n",
        "        m = self._block\n",
        "tests/sources/test_opener.py",
        "tests/sources/test_cache.py",
    ),
]
MUTANTS += [
    _m(
        "adaptive lanes: a lane that was reading when the consumer left never closes its reader",
        "streambuf/_source.py",
        "            if closing:  # the consumer left",
        "            if False:  # the consumer left",
        f"{ADAPTIVE}::test_a_reader_stuck_in_a_read_is_closed_when_it_returns",
    ),
    _m(
        "collate: plain numbers leave the batch's slot (a tensor of their own per batch)",
        "streambuf/_collate.py",
        "        dtype = _SCALARS.get(type(x))",
        "        dtype = None",
        "tests/test_arena.py::test_plain_numbers_travel_in_the_batch_slot",
    ),
    _m(
        "collate: a batch of mixed int and float values written as the first one's dtype",
        "streambuf/_collate.py",
        "            if all(type(v) is want for v in values):",
        "            if True:",
        "tests/test_collate.py::test_equals_default_collate",
    ),
]
WINDOW = "tests/test_window.py"
MUTANTS += [
    _m(
        "chunks: a chunk's reservation counts its bytes once, not once per item",
        "streambuf/window.py",
        "        self._bytes += nbytes * n\n",
        "        self._bytes += nbytes\n",
        f"{WINDOW}::test_chunks_fill_the_byte_bound_and_never_pass_it",
        f"{WINDOW}::test_get_many_lends_what_it_took_until_the_next_get",
    ),
    _m(
        "chunks: a chunk takes the room owed to items delivered before its first only",
        "streambuf/window.py",
        "            extra = self._ahead(lane, n) if",
        "            extra = self._ahead(lane) if",
        f"{WINDOW}::test_a_chunk_leaves_room_for_the_items_delivered_before_its_last",
    ),
    _m(
        "chunks: get_many stops counting the items it lent at once",
        "streambuf/window.py",
        "            if lend:  # counted until the consumer's next get",
        "            if False:  # counted until the consumer's next get",
        f"{WINDOW}::test_get_many_lends_what_it_took_until_the_next_get",
    ),
    _m(
        "chunks: a lane's samples made in a chunk when its reader stops are never handed over",
        "streambuf/_lanes.py",
        "            if not items:\n                win.release(lane)",
        "            if not items or ended:\n                win.release(lane)",
        f"{ADAPTIVE}::test_switching_keeps_round_robin_order",
        f"{WINDOW}::test_chunks_fill_the_byte_bound_and_never_pass_it",
    ),
    _m(
        "chunks: a lane that slowed down keeps reserving the chunk it grew to",
        "streambuf/_lanes.py",
        "            elif not ended:\n                self._want[lane] = max(1, n)",
        "            elif False:\n                self._want[lane] = max(1, n)",
        f"{WINDOW}::test_a_lane_that_slowed_down_gives_back_its_chunk_room",
    ),
    _m(
        "chunks: a slow lane's chunk of one that filled as time ran out grows to two",
        "streambuf/_lanes.py",
        "            if n == room and not late:",
        "            if n == room:",
        f"{WINDOW}::test_a_lane_that_slowed_down_gives_back_its_chunk_room",
    ),
    _m(
        "chunks: the unused room of a chunk is given back but still counted as reserved",
        "streambuf/window.py",
        "            self._reserved -= k\n",
        "",
        f"{WINDOW}::test_a_lane_that_slowed_down_gives_back_its_chunk_room",
    ),
    _m(
        "chunks: a chunk is handed over only when full (a paced stream waits for 16 samples)",
        "streambuf/_lanes.py",
        "time.perf_counter() - t0 > FLUSH_S",
        "time.perf_counter() - t0 > 1e9",
        "tests/sources/test_lanes.py::test_chunks_never_hold_a_paced_stream_back",
    ),
    _m(
        "chunks: shard lanes never hand over more than one sample at a time",
        "streambuf/_source.py",
        "            chunk=CHUNK,",
        "            chunk=1,",
        "tests/sources/test_lanes.py::test_shard_lanes_hand_over_chunks",
    ),
    _m(
        "chunks: a waiting consumer never takes what a stalled lane holds (a stall late)",
        "streambuf/window.py",
        "                        if self._take_held(key[0]) if rr else self._take_any_held():",
        "                        if False:",
        f"{WINDOW}::test_a_waiting_consumer_takes_what_a_stalled_lane_holds",
    ),
    _m(
        "chunks: commit_many commits again the items a waiting consumer took",
        "streambuf/window.py",
        "                    items, sizes = items[early:], sizes[early:]",
        "                    items, sizes = items[:], sizes[:]",
        f"{WINDOW}::test_a_waiting_consumer_takes_what_a_stalled_lane_holds",
    ),
    _m(
        "chunks: a lane holds its chunk across its next shard's open (a request late)",
        "streambuf/_source.py",
        "                yield AGAIN  # hands over",
        "                pass  # hands over",
        "tests/sources/test_lanes.py::test_a_chunk_is_handed_over_before_the_next_shard_opens",
    ),
    _m(
        "chunks: a lane counts a shard's end as an item made (phases stop off the round)",
        "streambuf/_source.py",
        "            if item is AGAIN:  # (a shard's end: not an item)",
        "            if item is AGAIN and lane < 0:  # (a shard's end: not an item)",
        f"{ADAPTIVE}::test_switching_keeps_the_order_where_lanes_end_shards_at_different_counts",
    ),
]
MUTANTS += [
    _m(
        "chunks: a thread driving several lanes makes a chunk of each in turn (a hang)",
        "streambuf/_lanes.py",
        "                    if not self._step(lane, its[lane]):",
        "                    if not (self._step_chunk if self._chunk > 1 else self._step)(\n"
        "                        lane, its[lane]\n                    ):",
        f"{WINDOW}::test_a_thread_driving_several_lanes_hands_over_one_item_of_each_in_turn",
    ),
    _m(
        "chunks: hold never wakes a consumer already asleep (an item waits for the stall)",
        "streambuf/window.py",
        "                if self._get_waiting:  # a consumer asleep with no timeout: poll",
        "                if False:  # a consumer asleep with no timeout: poll",
        "tests/test_window.py::test_a_consumer_waiting_before_the_hold_takes_what_a_stalled_lane_holds",
    ),
    _m(
        "chunks: a chunk split by a waiting consumer's take loses its tail",
        "streambuf/window.py",
        "                    items, sizes = items[early:], sizes[early:]\n"
        "                    if not items:",
        "                    items, sizes = items[early:], sizes[early:]\n"
        "                    if True:",
        "tests/test_window.py::test_a_waiting_consumer_takes_what_a_stalled_lane_holds",
    ),
]
