"""Fixtures for the batch library's unit tests."""

from __future__ import annotations

import pytest
from trio.testing import MockClock


@pytest.fixture
def file_clock() -> MockClock:
    """A MockClock that jumps only after 50 ms of real idleness.

    For tests that write journal or dead-letter files: those writes run in worker threads
    under a shield with a deadline, and a clock that jumps at once (threshold 0) would jump
    to that deadline while the thread is still writing. 0.25 s, not 0.05 s: on a loaded
    host a journal write in its thread took longer than 50 ms, the clock jumped past a
    replay interval meanwhile, and the journal tests failed in about 3 runs of 8 (on main
    as well); still not immune, they assert state after fixed mock-time sleeps.
    """
    return MockClock(autojump_threshold=0.25)
