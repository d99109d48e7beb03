"""The mock provider: deterministic replies, exact timing on MockClock, seeded failures."""

from __future__ import annotations

import base64
import random
import struct
from typing import TYPE_CHECKING, Any

import pytest
import trio

from triogate.config import MockSettings
from triogate.errors import ProviderStatusError
from triogate.providers.mock import MockProvider, embedding_vector, split_text
from triogate.providers.records import Usage
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens

from .helpers import STREAM_TEXT, completion_text, make_deployment

if TYPE_CHECKING:
    from trio.testing import MockClock

CHAT = {
    "model": "group-a",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one two three four five six seven eight nine ten"},
    ],
}
BODIES = {
    "chat": CHAT,
    "messages": {
        "model": "group-a",
        "max_tokens": 100,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "one two three four five six seven eight nine ten"}
        ],
    },
    "responses": {
        "model": "group-a",
        "instructions": "be brief",
        "input": "one two three four five six seven eight nine ten",
    },
}
EXPECTED_TEXT = "Mock reply from mock-model to: one two three four five six seven eight"


def mock_deployment(**settings: Any):  # type: ignore[no-untyped-def]
    return make_deployment(
        "mock",
        upstream_model="mock-model",
        api_base=None,
        api_key=None,
        mock=MockSettings(**settings),
    )


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_complete_every_api_with_derived_text_and_usage(
    api: str, autojump_clock: MockClock
) -> None:
    completion = await MockProvider().complete(api, BODIES[api], mock_deployment())  # type: ignore[arg-type]
    assert completion_text(api, completion.body) == EXPECTED_TEXT
    assert completion.usage == Usage(
        input_tokens=estimate_input_tokens(api, BODIES[api]),
        output_tokens=count_output_tokens(EXPECTED_TEXT),
    )


async def test_complete_takes_exactly_the_latency(autojump_clock: MockClock) -> None:
    start = trio.current_time()
    await MockProvider().complete("chat", CHAT, mock_deployment(latency_s=1.5))
    assert trio.current_time() - start == 1.5


@pytest.mark.parametrize(
    ("settings", "body_extra", "text"),
    [
        ({"response": "configured"}, {}, "configured"),
        ({"response": "configured"}, {"mock_response": "per request"}, "per request"),
        ({}, {"mock_response": ""}, ""),
    ],
)
async def test_configured_and_per_request_responses(
    settings: dict[str, Any], body_extra: dict[str, Any], text: str, autojump_clock: MockClock
) -> None:
    completion = await MockProvider().complete(
        "chat", {**CHAT, **body_extra}, mock_deployment(**settings)
    )
    assert completion.body["choices"][0]["message"]["content"] == text


@pytest.mark.parametrize("tokens", [1, 5, 40, 1000])
async def test_output_tokens_are_exact(tokens: int, autojump_clock: MockClock) -> None:
    completion = await MockProvider().complete("chat", CHAT, mock_deployment(output_tokens=tokens))
    text = completion.body["choices"][0]["message"]["content"]
    assert completion.usage.output_tokens == tokens == count_output_tokens(text)
    assert completion.body["usage"]["completion_tokens"] == tokens


async def test_max_tokens_cuts_the_reply(autojump_clock: MockClock) -> None:
    completion = await MockProvider().complete("chat", {**CHAT, "max_tokens": 3}, mock_deployment())
    assert completion.body["choices"][0]["finish_reason"] == "length"
    assert completion.usage.output_tokens == 3
    assert completion.body["choices"][0]["message"]["content"] == EXPECTED_TEXT[:12]


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_stream_text_equals_complete_text(api: str, autojump_clock: MockClock) -> None:
    provider = MockProvider()
    async with provider.stream(api, BODIES[api], mock_deployment()) as stream:  # type: ignore[arg-type]
        events = [e async for e in stream]
    assert STREAM_TEXT[api](events) == EXPECTED_TEXT
    assert stream.usage.reported
    assert stream.usage.output_tokens == count_output_tokens(EXPECTED_TEXT)


async def test_stream_timing_is_exact(autojump_clock: MockClock) -> None:
    deployment = mock_deployment(latency_s=2.0, first_token_s=0.5)
    start = trio.current_time()
    arrivals: list[tuple[float, str]] = []
    async with MockProvider().stream("chat", CHAT, deployment) as stream:
        async for event in stream:
            for choice in event["choices"]:
                if choice["delta"].get("content"):
                    arrivals.append((trio.current_time() - start, choice["delta"]["content"]))
    pieces = split_text(EXPECTED_TEXT)
    assert [text for _, text in arrivals] == pieces and len(pieces) == 8
    times = [t for t, _ in arrivals]
    assert times[0] == 0.5 and times[-1] == 2.0
    assert times == pytest.approx([0.5 + i * 1.5 / 7 for i in range(8)])
    assert trio.current_time() - start == 2.0


async def test_first_token_defaults_to_a_quarter_of_the_latency(autojump_clock: MockClock) -> None:
    start = trio.current_time()
    async with MockProvider().stream("chat", CHAT, mock_deployment(latency_s=4.0)) as stream:
        first_text_at = None
        async for event in stream:
            if first_text_at is None and any(c["delta"].get("content") for c in event["choices"]):
                first_text_at = trio.current_time() - start
    assert first_text_at == 1.0
    assert trio.current_time() - start == 4.0


async def test_usage_mid_stream_counts_what_was_streamed(autojump_clock: MockClock) -> None:
    async with MockProvider().stream("chat", CHAT, mock_deployment(latency_s=1.0)) as stream:
        seen = ""
        async for event in stream:
            seen += "".join(c["delta"].get("content") or "" for c in event["choices"])
            if len(seen) > 10:
                break
    assert stream.usage == Usage(
        input_tokens=estimate_input_tokens("chat", CHAT),
        output_tokens=count_output_tokens(seen),
        reported=False,
    )


async def test_failures_follow_the_seeded_random(autojump_clock: MockClock) -> None:
    deployment = mock_deployment(failure_rate=0.3, failure_status=503)

    async def outcomes(seed: int) -> list[bool]:
        provider, out = MockProvider(seed=seed), []
        for _ in range(60):
            try:
                await provider.complete("chat", CHAT, deployment)
                out.append(True)
            except ProviderStatusError as exc:
                assert exc.status == 503 and "mock failure" in exc.body
                out.append(False)
        return out

    draws = random.Random(7)
    assert await outcomes(7) == [draws.random() >= 0.3 for _ in range(60)]
    assert await outcomes(7) == await outcomes(7)
    assert await outcomes(7) != await outcomes(8)


async def test_stream_failure_raises_on_entering(autojump_clock: MockClock) -> None:
    with pytest.raises(ProviderStatusError) as info:
        async with MockProvider().stream(
            "messages", BODIES["messages"], mock_deployment(failure_rate=1.0, failure_status=429)
        ):
            pytest.fail("entered a failing stream")
    assert info.value.status == 429 and info.value.retryable


async def test_embeddings_are_deterministic(autojump_clock: MockClock) -> None:
    provider = MockProvider()
    body = {"model": "group-a", "input": ["alpha", "beta", "alpha"]}
    first = await provider.complete("embeddings", body, mock_deployment())
    again = await MockProvider(seed=99).complete("embeddings", body, mock_deployment())
    vectors = [d["embedding"] for d in first.body["data"]]
    assert vectors == [d["embedding"] for d in again.body["data"]]
    assert vectors[0] == vectors[2] != vectors[1] and len(vectors[0]) == 16
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0)
    assert first.usage == Usage(
        input_tokens=estimate_input_tokens("embeddings", body), output_tokens=0
    )
    assert first.body["usage"]["prompt_tokens"] == first.usage.input_tokens


async def test_embeddings_base64_and_dimensions(autojump_clock: MockClock) -> None:
    body = {"model": "g", "input": "alpha", "encoding_format": "base64", "dimensions": 4}
    out = await MockProvider().complete("embeddings", body, mock_deployment())
    raw = base64.b64decode(out.body["data"][0]["embedding"])
    assert struct.unpack("<4f", raw) == pytest.approx(
        embedding_vector("mock-model\0alpha", 4), rel=1e-6
    )


async def test_embeddings_cannot_stream() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        MockProvider().stream("embeddings", {"input": "x"}, mock_deployment())


async def test_untranslatable_request_is_a_value_error(autojump_clock: MockClock) -> None:
    with pytest.raises(ValueError, match="previous_response_id"):
        await MockProvider().complete(
            "responses", {"input": "x", "previous_response_id": "r"}, mock_deployment()
        )


TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 3}},
    "required": ["n"]}}}


@pytest.mark.parametrize(("extra", "called"), [
    ({"tools": [TOOL]}, True),
    ({"tools": [TOOL], "tool_choice": "none"}, False),
    ({"tools": [TOOL], "mock_response": "as asked"}, False),
    ({"tools": [TOOL], "messages": [*CHAT["messages"], {"role": "tool", "content": "7",
                                                         "tool_call_id": "c"}]}, False),
    ({"tools": [TOOL], "tool_choice": "required", "messages": [
        *CHAT["messages"], {"role": "tool", "content": "7", "tool_call_id": "c"}]}, True),
])
async def test_when_the_mock_calls_a_tool(extra: dict[str, Any], called: bool) -> None:
    completion = await MockProvider().complete("chat", {**CHAT, **extra}, mock_deployment())
    message = completion.body["choices"][0]["message"]
    assert bool(message.get("tool_calls")) == called
    if called:
        assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"n":3}'}
        assert completion.body["choices"][0]["finish_reason"] == "tool_calls"
        assert completion.usage.output_tokens == count_output_tokens('{"n":3}')
