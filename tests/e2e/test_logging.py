"""Log lines: JSON with the request id; no key and no prompt unless asked for."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from tests.e2e.hostile_upstream import Hostile, serve_hostile
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


async def test_an_unreachable_deployment_is_named_with_its_reason(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator sees which deployment failed and why: in a warning of the router, and
    on the request's own line; never the upstream's key."""
    listener = trio.socket.socket()  # a port nothing listens on: bound, never listening
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = gateway_config(
        tmp_path / "state", redis_url, upstream.base_url,
        model_list=[{"model_name": "gpt-down", "model_info": {"id": "down-1"},
                     "litellm_params": {"model": "openai/gpt-up",
                                        "api_base": f"http://127.0.0.1:{port}/v1",
                                        "api_key": "sk-upstream-secret-1",
                                        "input_cost_per_token": "0.000001",
                                        "output_cost_per_token": "0.000002"}}],
        router_settings={"num_retries": 1})
    caplog.set_level(logging.INFO)
    try:
        with trio.fail_after(30):
            async with running_gateway(config) as gateway, httpx.AsyncClient() as http:
                response = await http.post(
                    f"{gateway.openai_base}/chat/completions",
                    headers={"authorization": f"Bearer {MASTER_KEY}"},
                    json={"model": "gpt-down", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        listener.close()
    assert response.status_code == 502
    lines = [orjson.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert "sk-upstream-secret-1" not in orjson.dumps(lines).decode()
    (warning,) = [line for line in lines if line["logger"] == "triogate.routing"]
    assert warning["level"] == "warning"
    assert warning["deployment"] == "down-1" and warning["model_group"] == "gpt-down"
    assert warning["error"].startswith("ProviderConnectError: ")
    (request,) = [line for line in lines if line["message"] == "request"]
    assert request["status"] == "error"
    assert request["error"].startswith("ProviderConnectError: ")
    assert request["attempted"] == ["down-1", "down-1"]  # num_retries: 1


async def test_an_upstream_that_echoes_its_key_has_it_masked(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An upstream error that quotes the key it was sent: neither the client (the error
    passes through, a 400 is the request's) nor the logs see the key."""
    secret = "sk-upstream-secret-echoed-77"
    body = orjson.dumps({"error": {"message": f"model not allowed for key {secret}",
                                   "type": "invalid_request_error"}})

    async def echo(stream: trio.abc.Stream) -> None:
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                              b"content-length: %d\r\n\r\n%s" % (len(body), body))

    hostile = Hostile(script=echo)
    caplog.set_level(logging.INFO)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await serve_hostile(nursery, hostile)
            config = gateway_config(
                tmp_path / "state", redis_url, upstream.base_url,
                model_list=[{"model_name": "gpt-echo", "litellm_params": {
                    "model": "openai/gpt-up", "api_key": secret,
                    "api_base": f"{hostile.url}/v1", "input_cost_per_token": "0.000001",
                    "output_cost_per_token": "0.000002"}}],
                router_settings={"num_retries": 0})
            async with running_gateway(config) as gateway, httpx.AsyncClient() as http:
                response = await http.post(
                    f"{gateway.openai_base}/chat/completions",
                    headers={"authorization": f"Bearer {MASTER_KEY}"},
                    json={"model": "gpt-echo", "messages": [{"role": "user", "content": "hi"}]})
            nursery.cancel_scope.cancel()
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "model not allowed for key ***"
    assert secret.encode() in hostile.heads[0]  # it was sent upstream, as it must be
    text = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert secret not in text and "for key ***" in text
