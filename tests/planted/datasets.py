"""The planted bugs of map-style datasets as pipelines (``streambuf._dataset``,
``Pipeline(dataset)`` and ``Pipeline.from_dataset``). Each must make the tests named
beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

_m = planted("datasets", default_file="tests/test_from_dataset.py")

MUTANTS = [
    _m(
        "Pipeline(dataset) iterates a map-style dataset (every worker reads it all, on past its end)",
        "streambuf/pipeline.py",
        "        if is_map_style(source):  # a map-style dataset: read by index, each index once\n"
        "            source = DatasetItems(source)\n",
        "",
        "::test_a_pipeline_over_a_map_style_dataset_reads_each_index_once",
        "::test_a_dataset_that_never_raises_index_error_ends_after_len_items",
    ),
    _m(
        "the dataset view does not check an index against the length",
        "streambuf/_dataset.py",
        "        return self.dataset[_position(i, len(self))]",
        "        return self.dataset[i]",
        "::test_the_dataset_view_checks_bounds_as_a_sequence_does",
    ),
    _m(
        "from_dataset ignores shuffle=",
        "streambuf/pipeline.py",
        "                shuffle_shards=shuffle,\n",
        "                shuffle_shards=False,\n",
        "::test_shuffle_permutes_the_indices_by_seed_and_epoch",
        "::test_exact_resume_equals_the_uninterrupted_shuffled_run",
    ),
    _m(
        "from_dataset ignores threads= (reads one item at a time)",
        "streambuf/pipeline.py",
        "            GetItem(dataset), threads=threads\n",
        "            GetItem(dataset), threads=1\n",
        "::test_threads_read_items_concurrently_in_index_order",
    ),
]
MUTANTS += [
    _m(
        "any object with __len__ and __getitem__ is read by index (a label index too)",
        "streambuf/_dataset.py",
        "        isinstance(source, Dataset)\n",
        "        True\n",
        "tests/test_from_dataset.py::test_other_sources_are_read_as_before",
    ),
]
