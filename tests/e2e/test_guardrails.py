"""Guardrails (``guardrails:`` in the config, as LiteLLM documents them) over real HTTP:
the built-in content filter (deny list, PII masking) and LiteLLM's generic guardrail API
against a guardrail service running on loopback; pre-, during- and post-call; verdicts
on the spend row; errors in the API's own shape."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anthropic
import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway, spend_rows
from tests.e2e.json_receiver import JsonService, open_json_service
from tests.e2e.test_dashboard_http import sign_in

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

PII = "write to ada@example.com or call +1 415 555 0100, card 4111 1111 1111 1111"


def content_filter(name: str, mode: str | list[str] = "pre_call", *, default_on: bool = True,
                   **params: Any) -> dict[str, Any]:
    return {"guardrail_name": name, "litellm_params": {
        "guardrail": "litellm_content_filter", "mode": mode, "default_on": default_on,
        **params}}


def pii_filter() -> dict[str, Any]:
    return content_filter("pii", patterns=[
        {"pattern_type": "prebuilt", "pattern_name": name, "action": "MASK"}
        for name in ("email", "phone", "credit_card")])


def deny_filter(mode: str = "pre_call", word: str = "forbidden") -> dict[str, Any]:
    return content_filter("deny", mode, blocked_words=[{"keyword": word, "action": "BLOCK"}],
                          patterns=[{"pattern_type": "regex", "name": "ticket",
                                     "pattern": r"TICKET-\d{4}", "action": "BLOCK"}])


def generic(url: str, mode: str = "pre_call", *, default_on: bool = False) -> dict[str, Any]:
    return {"guardrail_name": "svc", "litellm_params": {
        "guardrail": "generic_guardrail_api", "mode": mode, "default_on": default_on,
        "api_base": url, "api_key": "guard-key", "timeout": 2,
        "additional_provider_specific_params": {"policy": "strict"}}}


def guard_answer(path: str, body: Any) -> tuple[int, Any]:
    """The guardrail service: blocks 'nope', rewrites 'secret', passes the rest."""
    text = " ".join(body["texts"])
    if "nope" in text:
        return 200, {"action": "BLOCKED", "blocked_reason": "nope is not allowed here"}
    if "secret" in text:
        return 200, {"action": "GUARDRAIL_INTERVENED",
                     "texts": [t.replace("secret", "[hidden]") for t in body["texts"]]}
    return 200, {"action": "NONE"}


@pytest.fixture
async def service() -> AsyncIterator[JsonService]:
    async with open_json_service(guard_answer) as svc:
        yield svc


@asynccontextmanager
async def make_gateway(tmp_path: Path, redis_url: str, upstream: FakeUpstream,
                       guardrails: list[dict[str, Any]]) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            guardrails=guardrails)
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            yield gateway


def oai(gateway: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY, max_retries=0)


async def ask(gateway: Gateway, content: str, **extra: Any) -> Any:
    with trio.fail_after(20):
        return await oai(gateway).chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": content}], max_tokens=40,
            **extra)


async def refused(gateway: Gateway, content: str, **extra: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(gateway, content, **extra)
    assert isinstance(caught.value.body, dict)
    return caught.value.body


async def test_a_deny_list_blocks_before_the_model_is_called(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    async with make_gateway(tmp_path, redis_url, upstream,
                            [pii_filter(), deny_filter()]) as gateway:
        error = await refused(gateway, "tell me the Forbidden word")
        assert error["message"] == ("Violated guardrail policy 'deny': content matched "
                                    "'forbidden'")
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "guardrail_violation"
        assert "ticket" in (await refused(gateway, "see TICKET-1234"))["message"]
        # The Anthropic API's own error shape.
        client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=MASTER_KEY,
                                          max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:
            with trio.fail_after(20):
                await client.messages.create(
                    model="claude-test", max_tokens=20,
                    messages=[{"role": "user", "content": "forbidden fruit"}])
        body = caught.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["message"].startswith("Violated guardrail policy 'deny'")
        assert not upstream.requests  # never called
        assert (await ask(gateway, "a harmless question")).choices
        rows = await spend_rows(gateway, 4)
        by_status = sorted((r.status, r.http_status) for r in rows)
        assert by_status == [("rejected", 400)] * 3 + [("success", 200)]
        ok = next(r for r in rows if r.status == "success")
        # Each guardrail ran (as its own participant of the admission scope), in order.
        assert ok.guardrails == ('[{"guardrail_name":"pii","mode":"pre_call",'
                                 '"status":"passed"},{"guardrail_name":"deny",'
                                 '"mode":"pre_call","status":"passed"}]')


async def test_pii_is_masked_before_the_upstream_sees_it(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, [pii_filter()]) as gateway:
        answer = await ask(gateway, PII)
        sent = upstream.requests[-1].json["messages"][0]["content"]
        assert sent == ("write to [EMAIL_REDACTED] or call [PHONE_REDACTED], card "
                        "[CREDIT_CARD_REDACTED]")
        assert "ada@example.com" not in answer.choices[0].message.content
        # The Anthropic API: system prompt and content blocks alike.
        client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=MASTER_KEY,
                                          max_retries=0)
        with trio.fail_after(20):
            await client.messages.create(
                model="claude-test", max_tokens=20, system="reply to bob@example.org",
                messages=[{"role": "user", "content": [{"type": "text", "text": PII}]}])
        body = upstream.requests[-1].json
        assert "bob@example.org" not in str(body["system"])
        assert "[EMAIL_REDACTED]" in str(body["system"])
        assert "4111" not in str(body["messages"])
        await spend_rows(gateway, 2)
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            logs = (await http.get("/spend/logs", headers={
                "authorization": f"Bearer {MASTER_KEY}"})).json()
        verdicts = [g for row in logs for g in row["guardrails"]]
        assert verdicts and all(v["status"] == "masked" for v in verdicts)
        assert {v["message"] for v in verdicts} >= {"masked: email, phone, credit_card"}


async def test_the_generic_guardrail_api_blocks_rewrites_and_passes(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, [generic(service.url)]) as gateway:
        # Not on by default: a request that does not name it is not checked.
        assert (await ask(gateway, "nope, unchecked")).choices
        assert not service.posts
        named = {"extra_body": {"guardrails": ["svc"]}}
        error = await refused(gateway, "nope", **named)
        assert error["message"] == "Violated guardrail policy 'svc': nope is not allowed here"
        path, headers, body = service.posts[-1]
        assert path == "/beta/litellm_basic_guardrail_api"
        assert headers["x-api-key"] == "guard-key"
        assert body["texts"] == ["nope"] and body["input_type"] == "request"
        assert body["additional_provider_specific_params"] == {"policy": "strict"}
        assert body["model"] == "gpt-test" and body["litellm_call_id"]
        await ask(gateway, "my secret plan", **named)
        assert upstream.requests[-1].json["messages"][0]["content"] == "my [hidden] plan"
        assert "guardrails" not in upstream.requests[-1].json  # a gateway-only field
        assert (await ask(gateway, "fine", **named)).choices
        error = await refused(gateway, "x", extra_body={"guardrails": ["nosuch"]})
        assert error["param"] == "guardrails" and "nosuch" in error["message"]
        # The dashboard's configuration page shows the guardrail, not its key.
        async with httpx.AsyncClient(base_url=gateway.url) as http:
            await sign_in(http, MASTER_KEY)
            page = await http.get("/ui/config")
        assert page.status_code == 200
        assert "generic_guardrail_api" in page.text and "guard-key" not in page.text


async def test_an_unreachable_guardrail_service_blocks(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    with trio.socket.socket() as sock:  # a port nothing listens on
        await sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with make_gateway(tmp_path, redis_url, upstream,
                            [generic(url, default_on=True)]) as gateway:
        error = await refused(gateway, "hello")
        assert "could not be reached" in error["message"]
        assert not upstream.requests


async def test_post_call_masks_or_blocks_the_answer(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    masking = content_filter("answers", "post_call", blocked_words=[
        {"keyword": "Fake", "action": "MASK"}])
    async with make_gateway(tmp_path, redis_url, upstream,
                            [masking, deny_filter("post_call", "banana")]) as gateway:
        answer = (await ask(gateway, "hello there")).choices[0].message.content
        assert answer.startswith("[FAKE_REDACTED] reply from")
        # The model answered (and is paid for), but the answer is refused.
        error = await refused(gateway, "say banana")
        assert error["message"] == ("Violated guardrail policy 'deny': content matched "
                                    "'banana'")
        rows = await spend_rows(gateway, 2)
        blocked = next(r for r in rows if r.status == "error")
        assert blocked.http_status == 400 and blocked.cost_nanousd > 0
        assert '"mode":"post_call","status":"blocked"' in (blocked.guardrails or "")


async def test_post_call_reads_a_stream_before_any_event_leaves(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    """``stream: true`` is no way around a post-call guardrail: the answer is checked
    whole, then streamed (masked); a block is a 400 before any event."""
    masking = content_filter("answers", "post_call", blocked_words=[
        {"keyword": "Fake", "action": "MASK"}])
    async with make_gateway(tmp_path, redis_url, upstream,
                            [masking, deny_filter("post_call", "banana")]) as gateway:
        with trio.fail_after(20):
            stream = await oai(gateway).chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hello there"}],
                max_tokens=40, stream=True, stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.startswith("[FAKE_REDACTED] reply from")
        assert "Fake" not in text
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens > 0
        # The upstream was asked for the whole answer, not a stream.
        assert "stream" not in upstream.requests[-1].json
        assert "stream_options" not in upstream.requests[-1].json

        with trio.fail_after(20), pytest.raises(anthropic.BadRequestError) as caught:
            async with anthropic.AsyncAnthropic(
                    base_url=gateway.url, api_key=MASTER_KEY, max_retries=0).messages.stream(
                    model="gpt-test", max_tokens=40,
                    messages=[{"role": "user", "content": "say banana"}]) as events:
                async for _ in events:
                    pass
        assert "Violated guardrail policy 'deny'" in str(caught.value)

        rows = await spend_rows(gateway, 2)
        streamed = next(r for r in rows if r.status == "success")
        assert streamed.output_tokens == usage.completion_tokens
        assert streamed.cost_nanousd > 0
        blocked = next(r for r in rows if r.status == "error")
        assert blocked.http_status == 400 and blocked.cost_nanousd > 0  # answered: paid
        assert '"mode":"post_call","status":"blocked"' in (blocked.guardrails or "")


async def test_a_stream_checked_whole_is_refused_by_a_during_call_guardrail(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, [
            generic(service.url, "during_call", default_on=True),
            deny_filter("post_call", "banana")]) as gateway:
        with pytest.raises(openai.BadRequestError) as caught, trio.fail_after(20):
            await oai(gateway).chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "nope"}],
                max_tokens=20, stream=True)
        assert "nope is not allowed here" in str(caught.value)
        (row,) = await spend_rows(gateway, 1)
        assert row.http_status == 400 and row.cost_nanousd > 0


async def test_during_call_runs_next_to_the_model_call(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream,
                            [generic(service.url, "during_call", default_on=True)]) as gateway:
        assert (await ask(gateway, "fine")).choices
        error = await refused(gateway, "nope")
        assert "nope is not allowed here" in error["message"]
        assert len(upstream.requests) == 2  # called: it ran next to the guardrail
        with pytest.raises(openai.BadRequestError):
            with trio.fail_after(20):
                stream = await oai(gateway).chat.completions.create(
                    model="gpt-test", messages=[{"role": "user", "content": "nope"}],
                    max_tokens=20, stream=True)
                async for _ in stream:
                    pass
        rows = await spend_rows(gateway, 3)
        assert sorted(r.http_status or 0 for r in rows) == [200, 400, 400]
