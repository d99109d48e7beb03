"""Fixtures for the batch library's unit tests."""

from __future__ import annotations

import pytest
from trio.testing import MockClock


@pytest.fixture
def file_clock() -> MockClock:
    """A MockClock that jumps only after 50 ms of real idleness.

    For tests that write journal or dead-letter files: those writes run in worker threads
    under a shield with a deadline, and a clock that jumps at once (threshold 0) would jump
    to that deadline while the thread is still writing.
    """
    return MockClock(autojump_threshold=0.05)
