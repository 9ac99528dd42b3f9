"""Shared test fixtures."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for_threads


@pytest.fixture
def no_thread_leak():
    """Fails the test if a streambuf thread is still alive 2 s after it."""
    yield
    assert wait_for_threads(timeout_s=2.0) == []
