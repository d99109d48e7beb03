"""A server per test that the test may kill, pause and restart."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import pytest

from triogate.redis_server import SyncServer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


class KillableServer:
    """A private server on a fixed socket path: kill, pause, resume, restart."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self.server = SyncServer(folder)
        self.url = self.server.url

    def kill(self) -> None:
        self.server.process.kill()
        self.server.process.wait()

    def pause(self) -> None:
        os.kill(self.server.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.server.process.pid, signal.SIGCONT)

    async def restart(self) -> None:
        """Kill it and start it again on the same socket, without blocking the Trio loop
        (an in-process gateway keeps running meanwhile)."""
        self.kill()
        self.server = await SyncServer.start_in_trio(self._folder)
        assert self.server.url == self.url

    def stop(self) -> None:
        if self.server.process.poll() is None:
            self.resume()
        self.server.stop()


@pytest.fixture
def killable_server(tmp_path: Path) -> Iterator[KillableServer]:
    server = KillableServer(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()
