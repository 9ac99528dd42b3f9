"""Shared test fixtures."""

from __future__ import annotations

import os

import pytest
from hypothesis import Phase, settings

from tests.helpers import wait_for_threads


@pytest.fixture
def no_thread_leak():
    """Fails the test if a streambuf thread is still alive 2 s after it."""
    yield
    assert wait_for_threads(timeout_s=2.0) == []


# Under `make mutants` a failure is all that matters: do not spend minutes shrinking it.
if os.environ.get("STREAMBUF_MUTANTS"):
    settings.register_profile(
        "mutants",
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        print_blob=False,
        derandomize=True,  # the same examples every run: a verdict must not be luck
    )
    settings.load_profile("mutants")
