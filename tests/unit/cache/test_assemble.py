"""assemble on streams as triogate's translators and the mock provider produce them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.unit.providers.helpers import make_deployment
from triogate.cache.replay import assemble, replay
from triogate.config import MockSettings
from triogate.providers.mock import MockProvider
from triogate.providers.records import Usage
from triogate.providers.translate import ChatPassthrough
from triogate.providers.translate_chat_messages import ChatToMessagesStream, MessagesToChatStream
from triogate.providers.translate_responses import ChatToResponsesStream

from .sdk import sdk_final
from .test_replay import comparable

if TYPE_CHECKING:
    from trio.testing import MockClock

CREATED_S = 1_700_000_000
USAGE = Usage(input_tokens=12, output_tokens=9)
BASE = {"id": "chatcmpl-up1", "object": "chat.completion.chunk", "created": CREATED_S,
        "model": "up-model"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                 "logprobs": None}]}


def call(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


# An upstream's chat chunks: text, then two tool calls (the first in pieces), then usage.
UPSTREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": "check."}),
    chunk(call(0, id="call_1", type="function", function={"name": "weather", "arguments": ""})),
    chunk(call(0, function={"arguments": '{"city":'})),
    chunk(call(0, function={"arguments": '"Paris"}'})),
    chunk(call(1, id="call_2", type="function", function={"name": "now", "arguments": "{}"})),
    chunk({}, "tool_calls"),
    {**BASE, "choices": [], "usage": USAGE.to_chat()},
]
TEXT_ONLY = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hello "}),
    chunk({"content": "world"}),
    chunk({}, "stop"),
    {**BASE, "choices": [], "usage": USAGE.to_chat()},
]
REQUEST = {"model": "group", "input": "hi"}


def translate(translator: Any, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [event for c in chunks for event in translator.feed(c)]
    return out + translator.finish(USAGE)


def streams() -> list[tuple[str, str, list[dict[str, Any]]]]:
    anthropic = translate(ChatToMessagesStream(input_tokens=12, model="up-model"), UPSTREAM)
    return [
        ("chat passthrough", "chat", translate(ChatPassthrough(created_s=CREATED_S), UPSTREAM)),
        ("chat from anthropic", "chat",
         translate(MessagesToChatStream(created_s=CREATED_S), anthropic)),
        ("messages from chat", "messages", anthropic),
        ("responses from chat (text)", "responses",
         translate(ChatToResponsesStream(request=REQUEST, created_s=CREATED_S), TEXT_ONLY)),
        ("responses from chat (tools)", "responses",
         translate(ChatToResponsesStream(request=REQUEST, created_s=CREATED_S), UPSTREAM)),
    ]


STREAMS = streams()
IDS = [s[0] for s in STREAMS]


@pytest.mark.parametrize(("label", "api", "events"), STREAMS, ids=IDS)
def test_assemble_agrees_with_the_sdk_on_a_translated_stream(
    label: str, api: str, events: list[dict[str, Any]]
) -> None:
    body = assemble(api, events)  # type: ignore[arg-type]
    assert body is not None
    assert comparable(body) == comparable(sdk_final(api, events))


@pytest.mark.parametrize(("label", "api", "events"), STREAMS, ids=IDS)
def test_a_replay_of_the_assembled_stream_gives_the_sdk_the_same_answer(
    label: str, api: str, events: list[dict[str, Any]]
) -> None:
    body = assemble(api, events)  # type: ignore[arg-type]
    assert body is not None
    replayed = replay(api, body)  # type: ignore[arg-type]
    assert comparable(sdk_final(api, replayed)) == comparable(sdk_final(api, events))
    assert assemble(api, replayed) == body  # type: ignore[arg-type]


def test_assembled_chat_keeps_the_tool_calls_in_order_without_stream_indexes() -> None:
    body = assemble("chat", STREAMS[0][2])
    assert body is not None
    message = body["choices"][0]["message"]
    assert message["content"] == "Let me check."
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["usage"] == USAGE.to_chat()
    assert body["object"] == "chat.completion"


def test_repeated_ids_and_names_in_tool_call_chunks_are_not_doubled() -> None:
    repeat = {"id": "call_1", "type": "function"}
    events = [
        chunk({"role": "assistant"}),
        chunk(call(0, **repeat, function={"name": "f", "arguments": '{"a"'})),
        chunk(call(0, **repeat, function={"name": "f", "arguments": ":1}"})),
        chunk({}, "tool_calls"),
    ]
    body = assemble("chat", events)
    assert body is not None
    assert body["choices"][0]["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    ]


def choice_chunk(index: int, delta: dict[str, Any], finish: str | None = None,
                 **extra: Any) -> dict[str, Any]:
    return {**BASE, **extra, "choices": [{"index": index, "delta": delta,
                                          "finish_reason": finish, "logprobs": None}]}


# Content alone (the fast path), content after a null, a refusal and a tool call between
# pieces, two choices interleaved, head fields first named late.
INTERLEAVED = [
    choice_chunk(0, {"role": "assistant", "content": None}),
    choice_chunk(1, {"role": "assistant"}),
    choice_chunk(0, {"content": "He"}),
    choice_chunk(1, {"content": "Bon"}),
    choice_chunk(0, {"content": "llo"}),
    choice_chunk(1, {"refusal": "no"}, system_fingerprint="fp_1"),
    choice_chunk(1, {"content": "jour"}),
    choice_chunk(0, call(0, id="call_1", type="function",
                         function={"name": "f", "arguments": "{}"})),
    choice_chunk(0, {"content": " world"}, service_tier="default"),
    choice_chunk(0, {"content": ""}),
    choice_chunk(1, {}, "stop"),
    choice_chunk(0, {}, "tool_calls"),
    {**BASE, "choices": [], "usage": USAGE.to_chat()},
]


def test_content_pieces_of_interleaved_choices_join_in_order_around_other_deltas() -> None:
    events = INTERLEAVED
    body = assemble("chat", events)
    assert body is not None
    first, second = (c["message"] for c in body["choices"])
    assert first == {"role": "assistant", "content": "Hello world", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert list(first) == ["role", "content", "tool_calls"]
    assert second == {"role": "assistant", "content": "Bonjour", "refusal": "no"}
    assert (body["system_fingerprint"], body["service_tier"]) == ("fp_1", "default")
    # (the SDK takes the head fields from the first chunk only)
    assert comparable(body)["choices"] == comparable(sdk_final("chat", events))["choices"]
    assert assemble("chat", replay("chat", body)) == body


def test_a_content_piece_before_the_role_is_kept() -> None:
    events = [chunk({"content": "a"}), chunk({"content": "b"}), chunk({"role": "assistant"}),
              chunk({"content": "c"}), chunk({}, "stop")]
    body = assemble("chat", events)
    assert body is not None
    assert body["choices"][0]["message"] == {"content": "abc", "role": "assistant"}


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_a_streamed_mock_answer_assembles_into_the_non_streamed_one(
    api: str, autojump_clock: MockClock
) -> None:
    deployment = make_deployment("mock", mock=MockSettings(response="The quick brown fox "
                                                           "jumps over the lazy dog."))
    body = {"model": "group-a", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100}
    if api == "responses":
        body = {"model": "group-a", "input": "hi", "max_output_tokens": 100}

    def fresh() -> MockProvider:
        return MockProvider(clock=lambda: float(CREATED_S))

    completion = await fresh().complete(api, body, deployment)  # type: ignore[arg-type]
    async with fresh().stream(api, body, deployment) as stream:  # type: ignore[arg-type]
        events = [event async for event in stream]
    assert assemble(api, events) == completion.body  # type: ignore[arg-type]


# --------------------------------------------------------------------------- refusals

FINISHED_CHAT = TEXT_ONLY
ANTHROPIC = translate(ChatToMessagesStream(input_tokens=12, model="m"), TEXT_ONLY)
RESPONSES = translate(ChatToResponsesStream(request=REQUEST, created_s=CREATED_S), TEXT_ONLY)
ERROR_CHUNK = {"error": {"message": "boom", "type": "server_error"}}


def _with_delta(events: list[dict[str, Any]], delta: dict[str, Any]) -> list[dict[str, Any]]:
    at = next(i for i, e in enumerate(events) if e["type"] == "content_block_delta")
    return [*events[:at], {"type": "content_block_delta", "index": 0, "delta": delta},
            *events[at:]]


INCOMPLETE: list[tuple[str, str, list[dict[str, Any]]]] = [
    ("chat: nothing", "chat", []),
    ("chat: no finish_reason", "chat", FINISHED_CHAT[:3]),
    ("chat: an error chunk", "chat", [*FINISHED_CHAT[:2], ERROR_CHUNK]),
    ("chat: one of two choices unfinished", "chat", [
        *FINISHED_CHAT[:4],
        {**BASE, "choices": [{"index": 1, "delta": {"content": "x"}, "finish_reason": None}]},
    ]),
    ("messages: nothing", "messages", []),
    ("messages: no message_stop", "messages", ANTHROPIC[:-1]),
    ("messages: an error event", "messages",
     [*ANTHROPIC[:3], {"type": "error", "error": {"type": "overloaded_error"}}]),
    ("messages: an unknown delta", "messages",
     _with_delta(ANTHROPIC, {"type": "future_delta", "x": 1})),
    ("messages: a delta for a block never started", "messages",
     [ANTHROPIC[0], {"type": "content_block_delta", "index": 3,
                     "delta": {"type": "text_delta", "text": "x"}}, *ANTHROPIC[1:]]),
    ("messages: broken tool JSON", "messages", [
        ANTHROPIC[0],
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "input_json_delta", "partial_json": '{"a":'}},
        {"type": "content_block_stop", "index": 0},
        *ANTHROPIC[-2:],
    ]),
    ("messages: events after message_stop", "messages", [*ANTHROPIC, ANTHROPIC[2]]),
    ("responses: nothing", "responses", []),
    ("responses: no response.completed", "responses", RESPONSES[:-1]),
    ("responses: response.failed", "responses",
     [*RESPONSES[:-1], {**RESPONSES[-1], "type": "response.failed"}]),
    ("responses: an error event", "responses",
     [*RESPONSES, {"type": "error", "message": "boom", "sequence_number": 99}]),
    ("embeddings never stream", "embeddings", FINISHED_CHAT),
]


@pytest.mark.parametrize(("label", "api", "events"), INCOMPLETE, ids=[r[0] for r in INCOMPLETE])
def test_a_stream_that_did_not_finish_cleanly_is_not_an_answer(
    label: str, api: str, events: list[dict[str, Any]]
) -> None:
    assert assemble(api, events) is None  # type: ignore[arg-type]


def test_the_finished_versions_of_those_streams_are_answers() -> None:
    assert assemble("chat", FINISHED_CHAT) is not None
    assert assemble("messages", ANTHROPIC) is not None
    assert assemble("responses", RESPONSES) is not None


def test_a_responses_stream_with_an_empty_final_output_takes_the_finished_items() -> None:
    final = {**RESPONSES[-1], "response": {**RESPONSES[-1]["response"], "output": []}}
    body = assemble("responses", [*RESPONSES[:-1], final])
    assert body is not None
    assert body["output"] == RESPONSES[-1]["response"]["output"]
