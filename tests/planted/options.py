"""The option-validation and decode-bound planted bugs:
``tests/planted`` gathers them with the others (``python tests/mutants.py options`` for
these alone). Each one must make the tests named beside it fail.

No mutant lifts a size bound outright where a test would then allocate GiBs: the
decode-bound mutants run only the tests whose data is sized small (at most ~240 MiB
decoded under the mutant), not the default-options bomb test (2.9 GiB without a bound).
"""

from __future__ import annotations

from tests.planted._mutant import planted

FORMATS = "tests/sources/test_formats.py"
VALUES = "tests/test_option_values.py"
PAGES = "tests/sources/test_pages.py"
SMALL_BOUND = f"{FORMATS}::test_sample_bound_is_the_gzip_readers_limit_not_a_count_afterwards"
AUTO_BOUND = f"{FORMATS}::test_default_sample_bound_follows_max_decoded_bytes"
IMAGES_BOUND = f"{FORMATS}::test_images_count_against_the_sample_bound_from_their_headers"
D = "streambuf/wds/decoders.py"
U = "streambuf/_units.py"


_m = planted("options")


MUTANTS = [
    _m(
        "per-field-only decode bound (no per-sample bound by default)",
        D,
        "return None if per_field is None else min(MAX_BYTES, SAMPLE_BOUND_FACTOR * per_field)",
        "return None",
        AUTO_BOUND,
    ),
    _m(
        "per-field-only decode bound (the sample's room never limits a field)",
        D,
        "            if left is not None and (best is None or left < best):",
        "            if False:",
        SMALL_BOUND,
        IMAGES_BOUND,
    ),
    _m(
        "sample total counted after a gz field inflates, not as its gzip reader's limit",
        D,
        "            limit, label = self._limit(room, inflating=True)",
        '            limit, label = self.max_decoded_bytes, "max_decoded_bytes"',
        SMALL_BOUND,
    ),
    _m(
        "images not counted against the per-sample bound",
        D,
        "        room.take(decoded=need)",
        "        room.take(decoded=0)",
        IMAGES_BOUND,
    ),
    _m(
        "sharding: a rank outside the world size accepted",
        "streambuf/sharding.py",
        'check_int(self.rank, name=name("rank"), maximum=self.world_size - 1)',
        'check_int(self.rank, name=name("rank"))',
        "tests/test_options.py::test_pipeline_rejects_bad_options",
    ),
    _m(
        "sharding: clips() errors name Pipeline's arguments, not its own",
        "streambuf/sharding.py",
        "            return self.arg_names.get(f, f)",
        "            return f",
        "tests/test_options.py::test_clips_rejects_bad_options",
    ),
    _m(
        "equalize checked only in the worker",
        "streambuf/pipeline.py",
        "            self.sizes()  # samples_per_shard: given, and one count per shard",
        "            pass",
        f"{VALUES}::test_equalize_without_samples_per_shard_refused_at_build",
    ),
    _m(
        "a shard longer than its samples_per_shard is not detected while reading",
        "streambuf/_iteration.py",
        "            if index < declared[shard]:",
        "            if True:",
        f"{VALUES}::test_understated_samples_per_shard_with_pad_is_an_error_not_lost_samples",
    ),
    _m(
        "a shard shorter than its samples_per_shard is padded by repeats, silently",
        "streambuf/_iteration.py",
        "        short = [(s, top.get(s, -1)) for s, i in sorted(last.items()) if top.get(s, -1) < i]",
        "        short = [(s, top.get(s, -1)) for s, i in sorted(last.items()) if False]",
        f"{VALUES}::test_overstated_samples_per_shard_is_an_error_not_repeated_samples",
        f"{VALUES}::test_overstated_samples_per_shard_is_an_error_in_loader_workers",
    ),
    _m(
        "a short shard is refused in a resumed pass (its pending samples come out of order)",
        "streambuf/_iteration.py",
        "            fresh = resume is None and self.pass_index == 0 and self.progress is None",
        "            fresh = self.pass_index == 0",
        "tests/test_resume_grid.py",
    ),
    _m(
        "a slot sharing a shard with others must read it to its last sample",
        "streambuf/_iteration.py",
        "            out[s] = a.offset + (k - 1) * a.stride",
        "            out[s] = sizes[s] - 1",
        f"{VALUES}::test_a_shard_shared_by_slots_is_not_short",
    ),
    _m(
        "a shard cut short under on_error='skip' is refused as overstated",
        "streambuf/_iteration.py",
        '        if last is None or getattr(policy, "on_error", "raise") == "skip":',
        "        if last is None:",
        f"{VALUES}::test_a_shard_cut_short_under_on_error_skip_is_not_refused",
    ),
    _m(
        "byte sizes accept floats",
        U,
        "    elif _is_integer(value):\n        out = int(value)",
        "    elif _is_integer(value) or isinstance(value, float) and math.isfinite(value):\n"
        "        out = int(value)",
        f"{VALUES}::test_every_byte_size_option_refuses_floats_bools_and_bad_values",
    ),
    _m(
        "byte sizes accept bools",
        U,
        "    return isinstance(value, numbers.Integral) and not isinstance(value, bool)",
        "    return isinstance(value, numbers.Integral)",
        f"{VALUES}::test_every_byte_size_option_refuses_floats_bools_and_bad_values",
    ),
    _m(
        "unit strings may name a fraction of a byte",
        U,
        "        if exact.denominator != 1:",
        "        if False:",
        f"{VALUES}::test_every_byte_size_option_refuses_floats_bools_and_bad_values",
    ),
    _m(
        "mix weights accept bools",
        U,
        "    if isinstance(value, bool) or not isinstance(value, numbers.Real):",
        "    if not isinstance(value, numbers.Real):",
        f"{VALUES}::test_mix_weights_are_numbers_and_named",
    ),
    _m(
        "mix weights not named by their index",
        "streambuf/mixing.py",
        'w = [check_weight(x, name=f"weights[{i}]") for i, x in enumerate(given)]',
        'w = [check_weight(x, name="weights") for i, x in enumerate(given)]',
        f"{VALUES}::test_mix_weights_are_numbers_and_named",
    ),
    _m(
        "a node's sizeof result taken as int() of it",
        "streambuf/nodes/_run.py",
        "return seq, (out, idx, state, check_size(self._sizeof(out)))",
        "return seq, (out, idx, state, int(self._sizeof(out)))",
        f"{VALUES}::test_sizeof_returning_a_bad_size_is_an_error_naming_sizeof",
    ),
    _m(
        "a negative size from sizeof accepted",
        U,
        '    if not 0 <= value <= MAX_BYTES:\n        raise ValueError(\n            f"{name} returned',
        '    if value > MAX_BYTES:\n        raise ValueError(\n            f"{name} returned',
        f"{VALUES}::test_sizeof_returning_a_bad_size_is_an_error_naming_sizeof",
    ),
    _m(
        "an empty cache_dir accepted (caches in the working directory)",
        "streambuf/sources/options.py",
        "    if not os.fspath(value).strip():",
        "    if False:",
        f"{VALUES}::test_empty_cache_dir_is_refused",
    ),
    _m(
        "device='cuda' accepted without CUDA (fails at the first batch)",
        "streambuf/device.py",
        "        if count == 0:",
        "        if False:",
        f"{VALUES}::test_cuda_device_without_cuda_refused_at_build",
    ),
    _m(
        "a text/html answer read as a tar gets no hint",
        "streambuf/io/opener.py",
        '    if kind.startswith("text/") or kind.startswith(_PAGES):',
        "    if False:",
        PAGES,
    ),
    _m(
        "an HTML page answered for a shard is cached as the shard",
        "streambuf/io/cache.py",
        "        if not_data_hint(stream.content_type) is not None:  # an error page is no entry",
        "        if False:",
        f"{PAGES}::test_an_html_page_is_not_cached_as_the_shard",
    ),
    _m(
        "thread and lane counts have no ceiling (a window slot each, made at the start)",
        "streambuf/_units.py",
        "    if count > MAX_THREADS_PER_STAGE:",
        "    if False:",
        "tests/test_threads_auto.py::test_invalid_threads_options_are_refused_by_name",
    ),
    _m(
        "mix weights normalised by their sum, which overflows to inf for huge finite weights",
        "streambuf/mixing.py",
        "    shares = tuple(x / top / total for x in w)",
        "    shares = tuple(x / sum(w) for x in w)",
        f"{VALUES}::test_mix_weights_accept_numbers_of_any_kind",
    ),
    _m(
        "tune: a memory share above 1 accepted",
        "streambuf/tune.py",
        "    if fraction > 1:",
        "    if False:",
        "tests/test_tune.py::test_bad_tune_options_are_named_before_anything_runs",
    ),
    _m(
        "tune: settings recommended from trials that measured no rate",
        "streambuf/tune.py",
        '    if all(t["batches"] < 2 for t in trials):',
        "    if False:",
        "tests/test_tune.py::test_a_pipeline_without_two_batches_is_not_tuned",
    ),
    _m(
        "equalize: a flatten that makes more samples than it was given passes",
        "streambuf/stages.py",
        "if env.equalize is not None and len(values) != len(leaves(rec)):",
        "if False:",
        "tests/test_sharding.py::test_equalize_refuses_a_stage_that_changes_the_sample_count",
    ),
    _m(
        "equalize: a group reaching .batch() unflattened counts as one sample",
        "streambuf/stages.py",
        "                    if given != 1:  # a group (n -> 1) reached the batch unflattened",
        "                    if False:",
        "tests/test_sharding.py::test_equalize_refuses_a_stage_that_changes_the_sample_count",
    ),
    _m(
        "equalize='drop': a slot short of its count reads its stream again",
        "streambuf/_iteration.py",
        '            if mode == "drop":  # its count is within the slot\'s stream: never a repeat',
        "            if False:",
        "tests/test_sharding.py::test_equalize_drop_refuses_to_repeat_what_a_filter_dropped",
    ),
]
