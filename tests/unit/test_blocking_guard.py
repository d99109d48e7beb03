"""The loop-blocking guard of tests/blocking.py, as the suite has it installed: each kind of
blocking call on the Trio loop's thread is caught (and taken here, so that these tests pass),
the same calls from a worker thread or on Trio's own sockets are not."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from triogate.config import load_config

if TYPE_CHECKING:
    from tests.blocking import Guard


def calls(guard: Guard) -> list[str]:
    return [b.call for b in guard.take()]


async def test_a_sleep_on_the_loop_is_caught(_blocking_guard: Guard) -> None:
    time.sleep(0.001)  # noqa: ASYNC251
    found = _blocking_guard.take()
    assert [b.call for b in found] == ["time.sleep"]
    assert found[0].where.startswith("tests/unit/test_blocking_guard.py:")
    assert found[0].where.endswith("in test_a_sleep_on_the_loop_is_caught")


async def test_a_file_the_gateway_opens_on_the_loop_is_caught(_blocking_guard: Guard) -> None:
    load_config(None)  # reads the packaged example.yaml, here on the loop
    found = _blocking_guard.take()
    assert [b.call for b in found] == ["io.open"]
    assert found[0].where.startswith("triogate/config.py:")


async def test_the_tests_own_file_reads_pass_but_fsync_is_caught(
    _blocking_guard: Guard, tmp_path: Path
) -> None:
    (tmp_path / "x").write_text("x")  # a test's own small read or write: not counted
    with open(tmp_path / "y", "w") as f:  # noqa: ASYNC230
        os.fsync(f.fileno())
    assert calls(_blocking_guard) == ["os.fsync"]


async def test_a_blocking_socket_on_the_loop_is_caught(_blocking_guard: Guard) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    assert calls(_blocking_guard) == ["socket.sendall", "socket.recv"]


async def test_trio_sockets_and_worker_threads_pass(_blocking_guard: Guard,
                                                    tmp_path: Path) -> None:
    a, b = trio.socket.socketpair()
    with a, b:
        await a.send(b"x")
        assert await b.recv(1) == b"x"

    def blocking_work() -> None:
        time.sleep(0.001)
        (tmp_path / "x").write_text("x")

    await trio.to_thread.run_sync(blocking_work)
    await trio.lowlevel.checkpoint()
    assert calls(_blocking_guard) == []


def test_outside_a_trio_run_nothing_is_caught(_blocking_guard: Guard) -> None:
    time.sleep(0.001)
    assert calls(_blocking_guard) == []


@pytest.mark.allow_blocking("the marker's own test")
async def test_the_marker_lets_a_test_block(_blocking_guard: Guard) -> None:
    time.sleep(0.001)  # noqa: ASYNC251 (left recorded: the check must let it through)


def test_a_test_that_blocks_the_loop_fails(tmp_path: Path) -> None:
    """The suite's own check, end to end: a pytest run (with this suite's conftest and
    settings) of one test that sleeps on the loop and one that sleeps in a thread."""
    (tmp_path / "test_demo.py").write_text(
        "import time, trio\n"
        "async def test_sleeps_on_the_loop():\n    time.sleep(0.001)\n"
        "async def test_sleeps_in_a_thread():\n"
        "    await trio.to_thread.run_sync(time.sleep, 0.001)\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-c",
         str(root / "pyproject.toml"), "--rootdir", str(root), str(tmp_path)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
        text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "the Trio loop was blocked 1 time(s)" in done.stdout
    assert "time.sleep from " in done.stdout and "test_demo.py:3 in test_sleeps_on_the_loop" \
        in done.stdout
