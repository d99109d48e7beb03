"""One gateway per state folder: a second ``triogate serve`` there exits with one line and
leaves the first one's embedded server, its socket and its answers alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import TYPE_CHECKING

import httpx
import pytest
import trio
import yaml

from tests.e2e.conftest import MASTER_HEADERS, MASTER_KEY, UPSTREAM_KEY, short_request
from triogate.redis_server import ping, server_spec

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def serve(config: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "triogate", "serve", "--port", "0", "--config", str(config),
         *extra],
        stderr=subprocess.PIPE, env={**os.environ, "TRIOGATE_LOG_LEVEL": "info"})


async def test_a_second_gateway_on_the_same_state_folder_is_refused(
    tmp_path: Path, upstream: FakeUpstream,
) -> None:
    state = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "gpt-test", "model_info": {"id": "a"},
                        "litellm_params": {"model": "openai/gpt", "api_key": UPSTREAM_KEY,
                                           "api_base": f"{upstream.base_url}/v1"}}],
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(state)},  # the embedded server
    }))
    first = serve(config)
    try:
        def read_url() -> str:
            for line in first.stderr:  # type: ignore[union-attr]
                found = re.search(rb"Running on (http://127\.0\.0\.1:\d+)", line)
                if found:
                    return found.group(1).decode()
            raise AssertionError("the first gateway exited before listening")

        with trio.fail_after(60):
            url = await trio.to_thread.run_sync(read_url)
            socket_path = server_spec(state / "redis", persistent=True).socket_path
            assert await ping(socket_path)
            for extra in ((), ("--server", "hypercorn"), ("--workers", "2")):
                second = serve(config, *extra)
                _, err = await trio.to_thread.run_sync(second.communicate, None, 30)
                assert second.returncode == 2, err.decode()[-2000:]
                lines = [line for line in err.decode().splitlines()
                         if line.startswith("triogate: ")]
                assert len(lines) == 1, err.decode()[-2000:]
                assert "is in use by another gateway" in lines[0]
                assert f"pid {first.pid}" in lines[0]
                assert "Traceback" not in err.decode()
                # The first one's server is untouched: its socket, its answers.
                assert socket_path.exists() and await ping(socket_path)
                async with httpx.AsyncClient(timeout=20) as http:
                    ready = await http.get(f"{url}/health/readiness")
                    assert ready.status_code == 200, ready.text
                    chat = await http.post(f"{url}/v1/chat/completions",
                                           headers=MASTER_HEADERS,
                                           json=short_request("chat", "still here"))
                    assert chat.status_code == 200
    finally:
        first.terminate()
        await trio.to_thread.run_sync(first.wait, 30)
    # Once the first is gone, the folder is free again.
    again = serve(config)
    try:
        def wait_listening() -> bool:
            return any(b"Running on" in line for line in again.stderr)  # type: ignore[union-attr]

        with trio.fail_after(60):
            assert await trio.to_thread.run_sync(wait_listening)
    finally:
        again.terminate()
        await trio.to_thread.run_sync(again.wait, 30)
