"""The embedded server's lifecycle: a leftover from a crashed gateway is stopped first."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from triogate.redis_server import SyncServer

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.integration


def test_a_leftover_server_in_the_state_folder_is_stopped_before_a_new_one(tmp_path: Path
                                                                            ) -> None:
    crashed = SyncServer(tmp_path / "redis", persistent=True)  # its gateway died: never stopped
    assert crashed.lock is not None
    os.close(crashed.lock)  # the folder's lock went with the gateway that died
    old_pid = crashed.process.pid
    fresh = SyncServer(tmp_path / "redis", persistent=True)
    try:
        assert crashed.process.wait(5) is not None  # terminated by the new start
        assert fresh.process.pid != old_pid
        assert int((tmp_path / "redis" / "redis.pid").read_text()) == fresh.process.pid
    finally:
        fresh.stop()


def test_an_unrelated_process_named_in_a_stale_pid_file_is_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "redis"
    folder.mkdir()
    (folder / "redis.pid").write_text(str(os.getpid()))  # this test process: not a server
    server = SyncServer(folder)
    server.stop()  # starting did not kill us
