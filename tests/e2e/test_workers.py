"""`triogate serve --workers 2`: two processes on one port, one embedded Redis between
them, one rate limit across them, and a clean exit on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
import yaml

from tests.e2e.conftest import MASTER_KEY, UPSTREAM_KEY
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


async def test_two_workers_share_the_port_and_the_embedded_redis(tmp_path: Path) -> None:
    async with open_fake_upstream() as upstream:
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({
            "model_list": [{"model_name": "m", "litellm_params": {
                "model": "openai/m", "api_base": f"{upstream.base_url}/v1",
                "api_key": UPSTREAM_KEY}}],
            "general_settings": {"master_key": MASTER_KEY},
            "triogate": {"state_dir": str(tmp_path / "state")},  # embedded Redis, SQLite
        }))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
        process = subprocess.Popen(
            [sys.executable, "-m", "triogate", "serve", "--config", str(config),
             "--port", "0", "--workers", "2"],
            stderr=subprocess.PIPE, env=env)
        assert process.stderr is not None
        try:
            def ready() -> tuple[int, set[bytes]]:
                port, pids = 0, set()
                for line in process.stderr:  # type: ignore[union-attr]
                    if found := re.search(rb'"port": ?(\d+)', line):
                        port = int(found.group(1))
                    if b"gateway ready" in line and (pid := re.search(rb'"pid": ?(\d+)', line)):
                        pids.add(pid.group(1))
                    if port and len(pids) == 2:
                        return port, pids
                raise AssertionError("the supervisor exited early")

            with trio.fail_after(30):
                port, pids = await trio.to_thread.run_sync(ready)
                url = f"http://127.0.0.1:{port}"
                async with httpx.AsyncClient(timeout=20) as http:
                    created = await http.post(f"{url}/key/generate", json={"rpm_limit": 10},
                                              headers={"authorization": f"Bearer {MASTER_KEY}"})
                    assert created.status_code == 200, created.text
                    key = created.json()["key"]
                    statuses = []
                    for _ in range(16):  # new connections: the kernel spreads them
                        async with httpx.AsyncClient(timeout=20) as fresh:
                            response = await fresh.post(
                                f"{url}/v1/chat/completions",
                                headers={"authorization": f"Bearer {key}"},
                                json={"model": "m",
                                      "messages": [{"role": "user", "content": "hi"}]})
                            statuses.append(response.status_code)
                # One limit across both workers: exactly 10 of 16 in this minute.
                assert statuses.count(200) == 10 and statuses.count(429) == 6
                process.send_signal(signal.SIGTERM)
                code = await trio.to_thread.run_sync(process.wait, 20)
        finally:
            if process.poll() is None:
                process.kill()
    assert code == 0
    assert len(pids) == 2


async def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "m", "litellm_params": {"model": "mock/m"}}],
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(tmp_path / "state")},
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "triogate", "serve", "--config", str(config), "--port", "0",
         "--workers", "2"], stderr=subprocess.PIPE, env=env)
    assert process.stderr is not None

    def worker_pids() -> set[int]:
        pids: set[int] = set()
        for line in process.stderr:  # type: ignore[union-attr]
            if b"gateway ready" in line and (pid := re.search(rb'"pid": ?(\d+)', line)):
                pids.add(int(pid.group(1)))
            if len(pids) == 2:
                return pids
        raise AssertionError("the supervisor exited early")

    with trio.fail_after(30):
        pids = await trio.to_thread.run_sync(worker_pids)
        server_pid = int((tmp_path / "state" / "redis" / "redis.pid").read_text())
        process.kill()  # no chance to forward anything
        process.wait()
        # The workers shut down, and so does the supervisor's embedded server.
        while any(_alive(pid) for pid in (*pids, server_pid)):
            await trio.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
