"""Log lines: JSON with the request id; no key and no prompt unless asked for."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from triogate._log import JsonFormatter, remember_request_ids

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

SECRET_PROMPT = "my-very-private-prompt-42"


@pytest.mark.parametrize("log_prompts", [False, True])
async def test_request_lines_carry_the_request_id_and_no_secrets(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture, log_prompts: bool,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"log_prompts": log_prompts})
    caplog.set_level(logging.INFO)
    remember_request_ids()  # as `triogate serve` does
    with trio.fail_after(30):
        async with running_gateway(config) as gateway:
            key, _ = await gateway.services.store.create_key()  # type: ignore[union-attr]
            async with httpx.AsyncClient() as http:
                response = await http.post(
                    f"{gateway.openai_base}/chat/completions",
                    headers={"authorization": f"Bearer {key}", "x-request-id": "trace-me"},
                    json={"model": "gpt-test",
                          "messages": [{"role": "user", "content": SECRET_PROMPT}]})
                assert response.status_code == 200
                # A stream's answer too (the gateway's cache is off here).
                async with http.stream(
                        "POST", f"{gateway.openai_base}/chat/completions",
                        headers={"authorization": f"Bearer {key}",
                                 "x-request-id": "trace-stream"},
                        json={"model": "gpt-test", "stream": True, "messages": [
                            {"role": "user", "content": SECRET_PROMPT + "-streamed"}]},
                ) as streamed:
                    assert streamed.status_code == 200
                    await streamed.aread()
    lines = [JsonFormatter().format(r) for r in caplog.records]
    text = "\n".join(lines)
    assert key not in text and MASTER_KEY not in text
    request_lines = [orjson.loads(line) for line in lines if '"message":"request"' in line]
    assert [line["request_id"] for line in request_lines] == ["trace-me", "trace-stream"]
    assert {line["status"] for line in request_lines} == {"success"}
    assert (SECRET_PROMPT in text) is log_prompts
    for line in request_lines:  # the answers: only when asked for, streamed or not
        answer = line.get("response_body")
        if not log_prompts:
            assert answer is None
            continue
        assert answer is not None and answer["object"] == "chat.completion"
        assert answer["choices"][0]["message"]["content"]
