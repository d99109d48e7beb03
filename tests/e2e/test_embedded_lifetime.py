"""The embedded server lives as long as `python -m triogate serve`: idle, killed, or hung.

A regression first: the server asked Linux for a parent-death signal from a trio worker
thread, and trio retires idle worker threads after 10 s, so the server was SIGTERMed ~10 s
after start-up and the gateway served degraded for good. Every test here runs the real
command in a subprocess with the embedded default (no Redis URL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio
import yaml

from tests.e2e.conftest import MASTER_KEY, UPSTREAM_KEY
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

ADMIN = {"authorization": f"Bearer {MASTER_KEY}"}


class Served:
    """A `triogate serve` subprocess: its URL, its pid, its state folder."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, state: Path) -> None:
        self.process = process
        self.url = url
        self.state = state

    def server_pid(self) -> int:
        """The embedded server's pid, from its pid file."""
        return int((self.state / "redis" / "redis.pid").read_text())

    def threads(self) -> set[int]:
        """The gateway's threads other than the main one."""
        return {int(t) for t in os.listdir(f"/proc/{self.process.pid}/task")} - {
            self.process.pid}


@asynccontextmanager
async def served(tmp_path: Path, **triogate: Any) -> AsyncIterator[Served]:
    async with open_fake_upstream() as upstream:
        config = tmp_path / "config.yaml"
        state = tmp_path / "state"
        config.write_text(yaml.safe_dump({
            "model_list": [{"model_name": "m", "litellm_params": {
                "model": "openai/m", "api_base": f"{upstream.base_url}/v1",
                "api_key": UPSTREAM_KEY}}],
            "general_settings": {"master_key": MASTER_KEY},
            "triogate": {"state_dir": str(state), **triogate},  # embedded Redis, SQLite
        }))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
        log = tmp_path / "gateway.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "triogate", "serve", "--config", str(config),
                 "--port", "0"], stderr=sink, env=env)
        try:
            with trio.fail_after(30):
                while not (found := re.search(rb"Running on (http://127\.0\.0\.1:\d+)",
                                              log.read_bytes())):
                    assert process.poll() is None, log.read_text()
                    await trio.sleep(0.05)
            yield Served(process, found.group(1).decode(), state)
            process.send_signal(signal.SIGTERM)
            assert await trio.to_thread.run_sync(process.wait, 20) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


async def governed(http: httpx.AsyncClient, url: str, key: str) -> httpx.Response:
    response = await http.post(f"{url}/v1/chat/completions",
                               headers={"authorization": f"Bearer {key}"},
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200, response.text
    return response


async def readiness(http: httpx.AsyncClient, url: str) -> str:
    return str((await http.get(f"{url}/health/readiness")).json()["status"])


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def test_the_embedded_server_outlives_trios_idle_worker_threads(tmp_path: Path) -> None:
    async with served(tmp_path) as gateway, httpx.AsyncClient(timeout=20) as http:
        created = await http.post(f"{gateway.url}/key/generate", headers=ADMIN,
                                  json={"max_budget": 5, "rpm_limit": 100})
        key = created.json()["key"]
        first = await governed(http, gateway.url, key)
        assert "x-triogate-degraded" not in first.headers
        pid = gateway.server_pid()
        # Idle until every worker thread that existed at start-up and for the first
        # request has retired (trio retires them after 10 s idle): the thread that once
        # forked the server is among them.
        threads = gateway.threads()
        assert threads, "expected trio worker threads after start-up"
        with trio.fail_after(60):
            while threads & gateway.threads():
                await trio.sleep(0.5)
        assert alive(pid) and gateway.server_pid() == pid  # the same server: not restarted
        for _ in range(3):
            response = await governed(http, gateway.url, key)
            assert "x-triogate-degraded" not in response.headers
        assert await readiness(http, gateway.url) == "ready"


async def test_a_killed_embedded_server_is_started_again(tmp_path: Path) -> None:
    async with served(tmp_path) as gateway, httpx.AsyncClient(timeout=20) as http:
        created = await http.post(f"{gateway.url}/key/generate", headers=ADMIN,
                                  json={"max_budget": 5, "rpm_limit": 100})
        key = created.json()["key"]
        await governed(http, gateway.url, key)
        pid = gateway.server_pid()
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(30):
            while not alive(new := gateway.server_pid()) or new == pid:
                await trio.sleep(0.05)
            while await readiness(http, gateway.url) != "ready":
                await trio.sleep(0.1)
            # The identity may still be cached; either way, answers are not degraded.
            while "x-triogate-degraded" in (await governed(http, gateway.url, key)).headers:
                await trio.sleep(0.1)
        for _ in range(3):
            response = await governed(http, gateway.url, key)
            assert "x-triogate-degraded" not in response.headers
        assert (await http.get(f"{gateway.url}/health/liveliness")).status_code == 200
        restarted = (tmp_path / "gateway.log").read_text()
        assert "embedded server restarted" in restarted


async def test_liveness_fails_while_the_embedded_server_does_not_answer(tmp_path: Path) -> None:
    async with served(tmp_path, redis={"liveness_grace_s": 1}) as gateway, httpx.AsyncClient(
        timeout=20
    ) as http:
        live = f"{gateway.url}/health/liveliness"
        assert (await http.get(live)).status_code == 200
        pid = gateway.server_pid()
        os.kill(pid, signal.SIGSTOP)  # alive but hung: nothing restarts it
        try:
            with trio.fail_after(30):
                while (response := await http.get(live)).status_code == 200:
                    await trio.sleep(0.2)
            assert response.status_code == 503
            assert response.json()["status"] == "unhealthy"
        finally:
            os.kill(pid, signal.SIGCONT)
        with trio.fail_after(30):
            while (await http.get(live)).status_code != 200:
                await trio.sleep(0.2)
