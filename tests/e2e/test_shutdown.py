"""SIGTERM with requests in flight: every one completes, settlement drains, exit 0; behind
the own server (``triogate serve``), behind hypercorn (``triogate serve --server
hypercorn``) and under hypercorn's own command line (``hypercorn triogate.asgi:app``)."""

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

from tests.e2e.conftest import BOTH_SERVERS, MASTER_KEY, UPSTREAM_KEY
from triogate.store import open_store
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def write_config(path: Path, upstream_url: str, redis_url: str) -> None:
    path.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "slow", "model_info": {"id": "slow-a"},
                        "litellm_params": {"model": "openai/slow", "api_base": f"{upstream_url}/v1",
                                           "api_key": UPSTREAM_KEY}}],
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(path.parent / "state"), "redis": {"url": redis_url},
                     "shutdown_grace_s": 20},
    }))


#: How each test starts the gateway: its command line (the config path appended or given
#: in ``TRIOGATE_CONFIG``).
COMMANDS = {
    "serve": ["-m", "triogate", "serve", "--port", "0", "--config"],
    "serve-hypercorn": ["-m", "triogate", "serve", "--server", "hypercorn", "--port", "0",
                        "--config"],
    "hypercorn": ["-m", "hypercorn", "--worker-class", "trio", "--bind", "127.0.0.1:0",
                  "triogate.asgi:app"],
}


async def start_gateway(config: Path, how: str = "serve") -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, *COMMANDS[how]]
    if command[-1] == "--config":
        command.append(str(config))
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE,
        env={**os.environ, "TRIOGATE_LOG_LEVEL": "info", "TRIOGATE_CONFIG": str(config)},
    )
    assert process.stderr is not None

    def read_url() -> str:
        for line in process.stderr:  # type: ignore[union-attr]
            found = re.search(rb"Running on (http://127\.0\.0\.1:\d+)", line)
            if found:
                return found.group(1).decode()
        raise AssertionError("the gateway exited before listening")

    url = await trio.to_thread.run_sync(read_url)
    return process, url


@pytest.mark.parametrize("how", list(COMMANDS))
async def test_sigterm_lets_in_flight_requests_finish_and_exits_0(
    tmp_path: Path, redis: RespBackend, redis_url: str, how: str
) -> None:
    async with open_fake_upstream(latency_s=1.5) as upstream:
        write_config(tmp_path / "config.yaml", upstream.base_url, redis_url)
        process, url = await start_gateway(tmp_path / "config.yaml", how)
        try:
            results: list[int] = []

            async def one(http: httpx.AsyncClient) -> None:
                response = await http.post(
                    f"{url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {MASTER_KEY}"},
                    json={"model": "slow", "messages": [{"role": "user", "content": "hi"}]})
                results.append(response.status_code)

            with trio.fail_after(30):
                async with httpx.AsyncClient(timeout=20) as http, trio.open_nursery() as n:
                    for _ in range(8):
                        n.start_soon(one, http)
                    while len(upstream.requests) < 8:  # all eight are upstream now
                        await trio.sleep(0.02)
                    process.send_signal(signal.SIGTERM)
                code = await trio.to_thread.run_sync(process.wait, 20)
        finally:
            if process.poll() is None:
                process.kill()
    assert results == [200] * 8
    assert code == 0
    # Their settlement drained into Redis before exit: routing usage counts all eight.
    usage = await redis.execute([("KEYS", "tg:{rt:slow}:usage:*")])
    (key,) = usage[0]
    assert await redis.execute([("HGET", key, "rpm:slow-a")]) == [b"8"]
    assert not list((tmp_path / "state" / "journal").glob("*.jsonl"))
    # And every request's spend-log row reached SQL: none lost, none spilled.
    async with open_store(None, state_dir=tmp_path / "state") as store:
        rows, total = await store.query_spend_logs()
    assert total == 8 and {r.status for r in rows} == {"success"}
    assert not list((tmp_path / "state" / "spendlog").glob("spill-*"))


@BOTH_SERVERS
async def test_shutdown_after_a_stream_on_a_kept_alive_connection_is_prompt(
    tmp_path: Path, redis: RespBackend, redis_url: str, server: str
) -> None:
    """A regression: the disconnect watcher's cancel used to land inside hypercorn's
    connection recycling, leaving the idle connection to the whole grace period."""
    from tests.e2e.conftest import gateway_config, running_gateway

    async with open_fake_upstream() as upstream:
        config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                                triogate={"shutdown_grace_s": 60})
        with trio.fail_after(30):
            async with running_gateway(config, server=server) as gateway:
                http = httpx.AsyncClient()  # left open: its connection stays alive
                async with http.stream(
                    "POST", f"{gateway.openai_base}/chat/completions",
                    headers={"authorization": f"Bearer {MASTER_KEY}"},
                    json={"model": "gpt-test", "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]},
                ) as response:
                    assert [line async for line in response.aiter_lines()][-2:] == [
                        "data: [DONE]", ""]
                stopping = trio.current_time()
            # Far below the 60 s grace: the idle keep-alive connection was closed at once.
            assert trio.current_time() - stopping < 10
