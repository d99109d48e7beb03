"""Chat completions <-> Anthropic messages: request, response and stream tables."""

from __future__ import annotations

from typing import Any

import pytest

from triogate.providers.records import Usage
from triogate.providers.streaming import Passthrough
from triogate.providers.translate_chat_messages import (
    DEFAULT_MAX_TOKENS,
    FINISH_TO_STOP,
    STOP_TO_FINISH,
    ChatToMessagesStream,
    MessagesToChatStream,
    chat_to_messages_request,
    chat_to_messages_response,
    messages_to_chat_request,
    messages_to_chat_response,
)

from .helpers import chat_text, messages_text

USER = {"role": "user", "content": "hello"}
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "find", "parameters": {"type": "object"}},
}
ANTHROPIC_TOOL = {"name": "lookup", "description": "find", "input_schema": {"type": "object"}}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"q":"x"}'},
}
TOOL_USE = {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"q": "x"}}

# (name, chat request, messages request): chat -> messages must give exactly the latter.
CHAT_TO_MESSAGES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "system and default max_tokens",
        {"model": "m", "messages": [{"role": "system", "content": "be brief"}, USER]},
        {"model": "m", "system": "be brief", "messages": [USER], "max_tokens": DEFAULT_MAX_TOKENS},
    ),
    (
        "developer and several system messages become blocks",
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "a"},
                {"role": "developer", "content": "b"},
                USER,
            ],
        },
        {
            "model": "m",
            "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "messages": [USER],
            "max_tokens": DEFAULT_MAX_TOKENS,
        },
    ),
    (
        "sampling, stop string, max_completion_tokens, user",
        {
            "model": "m",
            "messages": [USER],
            "max_completion_tokens": 50,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": "END",
            "user": "u-1",
            "stream": True,
        },
        {
            "model": "m",
            "messages": [USER],
            "max_tokens": 50,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u-1"},
            "stream": True,
        },
    ),
    (
        "stop list and max_tokens",
        {"model": "m", "messages": [USER], "max_tokens": 7, "stop": ["a", "b"]},
        {"model": "m", "messages": [USER], "max_tokens": 7, "stop_sequences": ["a", "b"]},
    ),
    (
        "text parts and images",
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                        {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                    ],
                }
            ],
        },
        {
            "model": "m",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                    ],
                }
            ],
        },
    ),
    (
        "tools, required choice, no parallel calls",
        {
            "model": "m",
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {
            "model": "m",
            "messages": [USER],
            "max_tokens": DEFAULT_MAX_TOKENS,
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        },
    ),
    (
        "named tool choice",
        {
            "model": "m",
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        },
        {
            "model": "m",
            "messages": [USER],
            "max_tokens": DEFAULT_MAX_TOKENS,
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "tool", "name": "lookup"},
        },
    ),
    (
        "tool calls and results; results merge into one user turn",
        {
            "model": "m",
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "content": "let me look",
                    "tool_calls": [CALL, {**CALL, "id": "call_2"}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
                {
                    "role": "tool",
                    "tool_call_id": "call_2",
                    "content": [{"type": "text", "text": "r2"}],
                },
                {"role": "user", "content": "thanks"},
            ],
        },
        {
            "model": "m",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "let me look"},
                        TOOL_USE,
                        {**TOOL_USE, "id": "call_2"},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "r1"},
                        {"type": "tool_result", "tool_use_id": "call_2", "content": "r2"},
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        },
    ),
]


@pytest.mark.parametrize(
    ("name", "chat", "messages"), CHAT_TO_MESSAGES, ids=lambda v: v if isinstance(v, str) else ""
)
def test_chat_to_messages_request(
    name: str, chat: dict[str, Any], messages: dict[str, Any]
) -> None:
    assert chat_to_messages_request(chat) == messages


# (name, messages request, chat request)
MESSAGES_TO_CHAT: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "system string, sampling, stop sequences, user id",
        {
            "model": "m",
            "system": "be brief",
            "messages": [USER],
            "max_tokens": 9,
            "temperature": 0.2,
            "top_p": 0.5,
            "top_k": 5,
            "stop_sequences": ["X"],
            "metadata": {"user_id": "u"},
            "stream": True,
        },
        {
            "model": "m",
            "messages": [{"role": "system", "content": "be brief"}, USER],
            "max_tokens": 9,
            "temperature": 0.2,
            "top_p": 0.5,
            "stop": ["X"],
            "user": "u",
            "stream": True,
        },
    ),
    (
        "system blocks become system messages; text blocks become a string",
        {
            "model": "m",
            "max_tokens": 1,
            "system": [{"type": "text", "text": "a"}],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}],
                }
            ],
        },
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "hi"}],
        },
    ),
    (
        "images",
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"},
                        },
                    ],
                }
            ],
        },
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "see"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                    ],
                }
            ],
        },
    ),
    (
        "tool use, tool results first, thinking dropped",
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "let me look"},
                        TOOL_USE,
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "call_1",
                            "content": [{"type": "text", "text": "r1"}],
                        },
                        {"type": "text", "text": "thanks"},
                    ],
                },
            ],
        },
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [
                USER,
                {"role": "assistant", "content": "let me look", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
                {"role": "user", "content": "thanks"},
            ],
        },
    ),
    (
        "tools and choices",
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [USER],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        },
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
    ),
    (
        "named tool",
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [USER],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "tool", "name": "lookup"},
        },
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [USER],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        },
    ),
]


@pytest.mark.parametrize(
    ("name", "messages", "chat"), MESSAGES_TO_CHAT, ids=lambda v: v if isinstance(v, str) else ""
)
def test_messages_to_chat_request(
    name: str, messages: dict[str, Any], chat: dict[str, Any]
) -> None:
    assert messages_to_chat_request(messages) == chat


@pytest.mark.parametrize(
    "chat",
    [
        c
        for _, c, _ in CHAT_TO_MESSAGES
        if "stop" not in c
        and "user" not in c
        and len([m for m in c["messages"] if m["role"] in ("system", "developer")]) <= 1
    ],
)
def test_chat_survives_a_round_trip_through_messages(chat: dict[str, Any]) -> None:
    back = messages_to_chat_request(chat_to_messages_request(chat))
    expected = dict(chat)
    expected.setdefault("max_tokens", DEFAULT_MAX_TOKENS)

    # parts that are all text come back as a plain string: compare texts
    def norm(m: dict[str, Any]) -> dict[str, Any]:
        c = m.get("content")
        if isinstance(c, list) and all(p["type"] == "text" for p in c):
            return {**m, "content": "".join(p["text"] for p in c)}
        return m

    assert [norm(m) for m in back["messages"]] == [norm(m) for m in expected["messages"]]
    assert back.get("tools") == expected.get("tools")


@pytest.mark.parametrize(
    ("translate", "body", "match"),
    [
        (chat_to_messages_request, {"messages": [USER], "n": 2}, "n > 1"),
        (
            chat_to_messages_request,
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
                ]
            },
            "input_audio",
        ),
        (chat_to_messages_request, {"messages": [{"role": "function", "content": "x"}]}, "role"),
        (
            chat_to_messages_request,
            {"messages": [USER], "tools": [TOOL], "tool_choice": "sometimes"},
            "tool_choice",
        ),
        (
            messages_to_chat_request,
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "document",
        ),
        (messages_to_chat_request, {"messages": [{"role": "system", "content": "x"}]}, "role"),
    ],
)
def test_untranslatable_requests_raise_value_error(
    translate: Any, body: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        translate(body)


# --------------------------------------------------------------------------- responses

USAGE = Usage(input_tokens=11, output_tokens=7)


@pytest.mark.parametrize(("stop_reason", "finish_reason"), sorted(STOP_TO_FINISH.items()))
def test_messages_response_to_chat_maps_stop_reason(stop_reason: str, finish_reason: str) -> None:
    message = {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }
    chat = messages_to_chat_response(message, usage=USAGE, created_s=123)
    assert chat == {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 123,
        "model": "claude",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


@pytest.mark.parametrize(("finish_reason", "stop_reason"), sorted(FINISH_TO_STOP.items()))
def test_chat_response_to_messages_maps_finish_reason(finish_reason: str, stop_reason: str) -> None:
    chat = {
        "id": "chatcmpl-xyz",
        "model": "gpt",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": finish_reason,
            }
        ],
    }
    assert chat_to_messages_response(chat, usage=USAGE) == {
        "id": "msg_xyz",
        "type": "message",
        "role": "assistant",
        "model": "gpt",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 7},
    }


def test_tool_calls_map_both_ways_in_responses() -> None:
    chat = {
        "id": "chatcmpl-1",
        "model": "gpt",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [CALL]},
            }
        ],
    }
    message = chat_to_messages_response(chat, usage=USAGE)
    assert message["content"] == [TOOL_USE]
    assert message["stop_reason"] == "tool_use"
    back = messages_to_chat_response(message, usage=USAGE, created_s=0)
    assert back["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
    }
    assert back["choices"][0]["finish_reason"] == "tool_calls"


def test_invalid_tool_arguments_are_kept_not_lost() -> None:
    chat = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "message": {
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{not json"}}]
                }
            }
        ],
    }
    assert chat_to_messages_response(chat, usage=USAGE)["content"][0]["input"] == {
        "_raw_arguments": "{not json"
    }


# --------------------------------------------------------------------------- streams


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


CHAT_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}),
    chunk({}, "tool_calls"),
    {
        "id": "chatcmpl-s1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt",
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    },
]

MESSAGES_STREAM = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_s1",
            "type": "message",
            "role": "assistant",
            "model": "gpt",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 0},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"q":'},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '"x"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"input_tokens": 11, "output_tokens": 7},
    },
    {"type": "message_stop"},
]


def run(
    translator: Any, events: list[dict[str, Any]], usage: Usage = USAGE
) -> list[dict[str, Any]]:
    return [out for e in events for out in translator.feed(e)] + translator.finish(usage)


def test_chat_chunks_to_anthropic_events() -> None:
    assert run(ChatToMessagesStream(input_tokens=3), CHAT_STREAM) == MESSAGES_STREAM


def test_anthropic_events_to_chat_chunks() -> None:
    out = run(MessagesToChatStream(created_s=1), [*MESSAGES_STREAM, {"type": "ping"}])
    assert [c["id"] for c in out] == ["chatcmpl-s1"] * len(out)
    assert chat_text(out) == "Hello"
    calls = [tc for c in out for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    assert calls[0] == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": ""},
    }
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"q":"x"}'
    assert [ch["finish_reason"] for c in out for ch in c["choices"] if ch["finish_reason"]] == [
        "tool_calls"
    ]
    assert out[-1]["choices"] == [] and out[-1]["usage"] == USAGE.to_chat()


def test_stream_round_trip_keeps_text_and_tool_calls() -> None:
    there = run(ChatToMessagesStream(input_tokens=3), CHAT_STREAM)
    back = run(MessagesToChatStream(created_s=1), there)
    assert chat_text(back) == chat_text(CHAT_STREAM) == messages_text(there) == "Hello"
    strip = lambda cs: [{k: v for k, v in c.items() if k != "logprobs"} for c in cs]  # noqa: E731
    assert [strip(c["choices"]) for c in back[1:]] == [strip(c["choices"]) for c in CHAT_STREAM[1:]]


def test_an_empty_chat_stream_still_makes_a_whole_anthropic_stream() -> None:
    out = ChatToMessagesStream(input_tokens=3, model="m").finish(USAGE)
    assert [e["type"] for e in out] == ["message_start", "message_delta", "message_stop"]
    assert out[1]["delta"]["stop_reason"] == "end_turn"
    assert out[1]["usage"] == {"input_tokens": 11, "output_tokens": 7}


def test_passthrough_changes_nothing() -> None:
    assert run(Passthrough(), MESSAGES_STREAM) == MESSAGES_STREAM
