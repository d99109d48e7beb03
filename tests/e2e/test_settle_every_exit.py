"""Settlement runs whatever happens inside it: an upstream's impossible answer (negative
usage, a completion whose choices are not objects) or an exception at any one step still
gives the reservation and the parallel slot back, charges what is known and writes the
spend-log row. A raw upstream on loopback answers with the JSON the test sets."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway, spend_rows
from tests.e2e.test_stream_accounting import key_budget
from triogate.api import settlement
from triogate.cache.response import ResponseCache

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from tests.e2e.scripted_upstream import Scripted
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

USD = 1_000_000_000


def chat_answer(prompt_tokens: int = 5, completion_tokens: int = 2,
                choices: list[Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-raw", "object": "chat.completion", "created": 1, "model": "up",
        "choices": choices if choices is not None else [
            {"index": 0, "message": {"role": "assistant", "content": "hi"},
             "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


@attrs.define
class RawUpstream:
    """Answers every POST with ``answer`` as a JSON 200."""

    answer: dict[str, Any] = attrs.Factory(chat_answer)
    port: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                body += await stream.receive_some(65536)
            payload = orjson.dumps(self.answer)
            await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                  b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                                  % (len(payload), payload))


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, upstream.handle, 0,
                                                host="127.0.0.1"))
        upstream.port = listeners[0].socket.getsockname()[1]
        yield upstream
        nursery.cancel_scope.cancel()


@pytest.fixture
async def one_slot(tmp_path: Path, redis: RespBackend, redis_url: str,
                   raw_upstream: RawUpstream) -> AsyncIterator[tuple[Gateway, str]]:
    """A gateway in front of the raw upstream (response cache on), and a key with a
    budget and ONE parallel slot: a slot that stays held refuses the key's next request."""
    base = f"http://127.0.0.1:{raw_upstream.port}"
    config = gateway_config(tmp_path / "state", redis_url, base, litellm_settings={
        "cache": True, "cache_params": {"ttl": 60}})
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            assert gateway.services.store is not None
            raw, _ = await gateway.services.store.create_key(
                max_budget_nanousd=10 * USD, max_parallel_requests=1, tpm_limit=1_000_000)
            yield gateway, raw


async def ask(gateway: Gateway, key: str, content: str, *, path: str = "chat/completions"
              ) -> httpx.Response:
    body: dict[str, Any] = {"model": "gpt-test", "max_tokens": 50}
    if path == "completions":
        body["prompt"] = content
    else:
        body["messages"] = [{"role": "user", "content": content}]
    with trio.fail_after(20):
        async with httpx.AsyncClient(timeout=20) as http:
            return await http.post(f"{gateway.openai_base}/{path}", json=body,
                                   headers={"authorization": f"Bearer {key}"})


async def assert_settled(gateway: Gateway, key: str, rows: int, *, row_lost: bool = False
                         ) -> None:
    """Nothing stays reserved, the key's spend is its rows' cost (charged although its
    row is lost, with ``row_lost``), and its one parallel slot is free again (the next
    request is answered)."""
    found = await spend_rows(gateway, rows)
    spend, reserved = await key_budget(gateway, key)
    assert reserved == 0
    if row_lost:
        assert spend > 0
    else:
        assert spend == sum(row.cost_nanousd for row in found)
    assert (await ask(gateway, key, "the slot is free again")).status_code == 200


async def test_negative_usage_is_charged_as_zero_and_settled(
    one_slot: tuple[Gateway, str], raw_upstream: RawUpstream, caplog: pytest.LogCaptureFixture,
) -> None:
    gateway, key = one_slot
    raw_upstream.answer = chat_answer(prompt_tokens=-5_000, completion_tokens=-7)
    with caplog.at_level(logging.WARNING, "triogate.requests"):
        response = await ask(gateway, key, "negative usage")
    assert response.status_code == 200
    assert "negative usage" in caplog.text
    (row,) = await spend_rows(gateway, 1)
    assert (row.status, row.input_tokens, row.output_tokens, row.cost_nanousd) == (
        "success", 0, 0, 0)
    raw_upstream.answer = chat_answer()
    await assert_settled(gateway, key, 1)


async def test_a_completion_whose_choices_are_not_objects_is_a_settled_502(
    one_slot: tuple[Gateway, str], raw_upstream: RawUpstream,
) -> None:
    gateway, key = one_slot
    raw_upstream.answer = chat_answer(choices=[5])
    response = await ask(gateway, key, "odd choices", path="completions")
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["type"] == "api_error" and "could not be read" in error["message"]
    (row,) = await spend_rows(gateway, 1)
    assert (row.status, row.http_status) == ("error", 502) and row.deployment_id is not None
    assert row.cost_nanousd > 0  # the upstream answered: its usage is charged
    raw_upstream.answer = chat_answer()
    await assert_settled(gateway, key, 1)


async def test_a_stream_with_negative_usage_is_charged_as_zero_and_settled(
    tmp_path: Path, redis: RespBackend, redis_url: str, scripted: Scripted,
) -> None:
    base = {"id": "chatcmpl-neg", "object": "chat.completion.chunk", "created": 1,
            "model": "up"}
    scripted.pieces = [
        b"data: " + orjson.dumps({**base, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": "hi"},
             "finish_reason": "stop"}]}) + b"\n\n",
        b"data: " + orjson.dumps({**base, "choices": [], "usage": {
            "prompt_tokens": -40, "completion_tokens": -2, "total_tokens": -42}}) + b"\n\n",
        b"data: [DONE]\n\n",
    ]
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}")
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            assert gateway.services.store is not None
            key, _ = await gateway.services.store.create_key(
                max_budget_nanousd=10 * USD, max_parallel_requests=1, tpm_limit=1_000_000)
            body = {"model": "gpt-test", "max_tokens": 50, "stream": True,
                    "messages": [{"role": "user", "content": "negative stream"}]}
            async with httpx.AsyncClient(timeout=20) as http:
                response = await http.post(f"{gateway.openai_base}/chat/completions",
                                           json=body, headers={"authorization": f"Bearer {key}"})
            assert response.status_code == 200 and b"[DONE]" in response.content
            (row,) = await spend_rows(gateway, 1)
            assert (row.status, row.input_tokens, row.output_tokens) == ("success", 0, 0)
            spend, reserved = await key_budget(gateway, key)
            assert (spend, reserved) == (0, 0)
            async with httpx.AsyncClient(timeout=20) as http:  # the slot is free again
                again = await http.post(f"{gateway.openai_base}/chat/completions",
                                        json=body, headers={"authorization": f"Bearer {key}"})
            assert again.status_code == 200


def _once(original: Callable[..., Any], nth: int = 1) -> Callable[..., Any]:
    """``original``, except that its ``nth`` call raises."""
    calls = [0]

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError("injected")
        return original(*args, **kwargs)

    return failing_once


#: Each step of settlement, and where to inject its failure.
STEPS: dict[str, Callable[[pytest.MonkeyPatch, Gateway], None]] = {
    "usage": lambda mp, gw: mp.setattr(settlement, "_sane_usage",
                                       _once(settlement._sane_usage)),
    # The first call is the response's cost header; the second, settlement's.
    "cost": lambda mp, gw: mp.setattr(settlement, "cost_nanousd",
                                      _once(settlement.cost_nanousd, 2)),
    "governance": lambda mp, gw: mp.setattr(settlement, "governance_settle",
                                            _once(settlement.governance_settle)),
    "routing": lambda mp, gw: mp.setattr(gw.services.router, "record",
                                         _once(gw.services.router.record)),
    "cache": lambda mp, gw: mp.setattr(ResponseCache, "store", _once(ResponseCache.store)),
    "hand_off": lambda mp, gw: mp.setattr(gw.services.settler, "submit_nowait",
                                          _once(gw.services.settler.submit_nowait)),
    "spend_row": lambda mp, gw: mp.setattr(settlement, "_spend_row",
                                           _once(settlement._spend_row)),
    "spend_log": lambda mp, gw: mp.setattr(gw.services.spend_logs, "submit_nowait",
                                           _once(gw.services.spend_logs.submit_nowait)),  # type: ignore[union-attr]
    "metrics": lambda mp, gw: mp.setattr(gw.services.metrics, "observe_request",
                                         _once(gw.services.metrics.observe_request)),
    "log": lambda mp, gw: mp.setattr(settlement, "_log_line", _once(settlement._log_line)),
}


@pytest.mark.parametrize("step", list(STEPS))
async def test_an_exception_at_any_step_of_settlement_settles_the_rest(
    one_slot: tuple[Gateway, str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, step: str,
) -> None:
    gateway, key = one_slot
    STEPS[step](monkeypatch, gateway)
    with caplog.at_level(logging.INFO, "triogate.requests"):
        response = await ask(gateway, key, f"fail at {step}")
        assert response.status_code == 200
        with trio.fail_after(10):
            await gateway.services.settler.wait_drained()
    monkeypatch.undo()
    failed = [r for r in caplog.records if r.getMessage().startswith("a settlement step")]
    assert [(r.step, r.error) for r in failed] == [(step, "RuntimeError")]  # type: ignore[attr-defined]
    assert gateway.services.metrics.registry.get_sample_value(
        "triogate_settlement_errors_total", {"step": step}) == 1
    if step == "hand_off":
        # The settler never got the batch: nothing was settled in Redis, but the row
        # (what is known) is written. Nothing more can be asked of settlement here.
        assert len(await spend_rows(gateway, 1)) == 1
        return
    # The row is lost only when handing it to the writer itself failed.
    lost = step == "spend_log"
    await assert_settled(gateway, key, 0 if lost else 1, row_lost=lost)


async def test_an_answer_dropped_before_it_is_sent_still_settles(
    one_slot: tuple[Gateway, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A complete answer settles once its bytes are written. An error after the handler
    returned it (here in the CORS step, once) drops it unsent: it settles all the same,
    charged what the upstream did, and the key's one parallel slot is free again."""
    gateway, key = one_slot
    from triogate.api.asgi import GatewayASGI

    original = GatewayASGI._cors
    calls = {"n": 0}

    def failing_once(self: GatewayASGI, request: Any) -> dict[str, str]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("an error after the handler returned")
        return original(self, request)

    monkeypatch.setattr(GatewayASGI, "_cors", failing_once)
    with pytest.raises(httpx.HTTPError):  # the server answers 500 or drops the connection
        response = await ask(gateway, key, "dropped before its send")
        response.raise_for_status()
    await assert_settled(gateway, key, 1)
