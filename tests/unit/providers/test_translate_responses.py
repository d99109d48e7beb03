"""Responses API -> chat requests, and chat -> Responses objects and stream events."""

from __future__ import annotations

from typing import Any

import pytest

from triogate.providers.records import Usage
from triogate.providers.translate_responses import (
    ChatToResponsesStream,
    chat_to_responses_response,
    responses_to_chat_request,
)

from .helpers import responses_text

FN = {"type": "function", "name": "lookup", "description": "find", "parameters": {"type": "object"}}
CHAT_FN = {
    "type": "function",
    "function": {"name": "lookup", "description": "find", "parameters": {"type": "object"}},
}

REQUESTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "string input, instructions, settings",
        {
            "model": "m",
            "input": "hi",
            "instructions": "be brief",
            "max_output_tokens": 20,
            "temperature": 0.3,
            "top_p": 0.8,
            "user": "u",
            "stream": True,
            "store": False,
        },
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
            "max_tokens": 20,
            "temperature": 0.3,
            "top_p": 0.8,
            "user": "u",
            "stream": True,
        },
    ),
    (
        "message items with parts; developer is system; images stay parts",
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "rules"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look "},
                        {
                            "type": "input_image",
                            "image_url": "https://x.test/i.png",
                            "detail": "low",
                        },
                    ],
                },
                {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                {"role": "user", "content": [{"type": "input_text", "text": "and?"}]},
            ],
        },
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "rules"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look "},
                        {
                            "type": "image_url",
                            "image_url": {"url": "https://x.test/i.png", "detail": "low"},
                        },
                    ],
                },
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and?"},
            ],
        },
    ),
    (
        "function calls merge into one assistant turn; outputs become tool messages",
        {
            "model": "m",
            "tools": [FN],
            "tool_choice": {"type": "function", "name": "lookup"},
            "input": [
                {"role": "user", "content": "find x"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "lookup",
                    "arguments": '{"a":1}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "r1"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "r2"}],
                },
            ],
        },
        {
            "model": "m",
            "tools": [CHAT_FN],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "messages": [
                {"role": "user", "content": "find x"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"a":1}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "r1"},
                {"role": "tool", "tool_call_id": "c2", "content": "r2"},
            ],
        },
    ),
    (
        "json schema output format",
        {
            "model": "m",
            "input": "hi",
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "s",
                    "schema": {"type": "object"},
                    "strict": True,
                }
            },
        },
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True},
            },
        },
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "chat"), REQUESTS, ids=lambda v: v if isinstance(v, str) else ""
)
def test_responses_request_to_chat(name: str, body: dict[str, Any], chat: dict[str, Any]) -> None:
    assert responses_to_chat_request(body) == chat


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "web_search"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input_file",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "role"),
    ],
)
def test_unsupported_responses_requests_raise_value_error(body: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        responses_to_chat_request(body)


USAGE = Usage(input_tokens=5, output_tokens=3)
REQUEST = {"model": "group", "input": "hi", "instructions": "be brief", "temperature": 0.5}


def chat_response(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-r1",
        "object": "chat.completion",
        "model": "gpt",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def test_chat_response_to_responses_object() -> None:
    out = chat_to_responses_response(
        chat_response({"role": "assistant", "content": "hello"}),
        request=REQUEST,
        usage=USAGE,
        created_s=9,
    )
    assert out["id"] == "resp_r1" and out["object"] == "response" and out["status"] == "completed"
    assert out["created_at"] == 9 and out["model"] == "gpt"
    assert out["instructions"] == "be brief" and out["temperature"] == 0.5
    assert out["output"] == [
        {
            "id": "msg_r1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        }
    ]
    assert out["usage"]["input_tokens"] == 5 and out["usage"]["output_tokens"] == 3
    assert out["usage"]["total_tokens"] == 8
    assert out["incomplete_details"] is None


def test_tool_calls_become_function_call_items_and_length_is_incomplete() -> None:
    call = {"id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    out = chat_to_responses_response(
        chat_response({"role": "assistant", "content": "", "tool_calls": [call]}, "length"),
        request=REQUEST,
        usage=USAGE,
        created_s=0,
    )
    assert out["output"] == [
        {
            "id": "fc_9",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_9",
            "name": "lookup",
            "arguments": "{}",
        }
    ]
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-r2",
        "object": "chat.completion.chunk",
        "model": "gpt",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    translator = ChatToResponsesStream(request=REQUEST, created_s=1)
    return [o for e in events for o in translator.feed(e)] + translator.finish(USAGE)


def test_text_stream_events() -> None:
    out = run(
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk({}, "stop"),
        ]
    )
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert responses_text(out) == "Hello"
    assert out[0]["response"]["status"] == "in_progress" and out[0]["response"]["output"] == []
    assert out[6]["text"] == "Hello" and out[7]["part"]["text"] == "Hello"
    assert all(e["item_id"] == "msg_r2" for e in out[3:8])
    final = out[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 3
    assert final["output"][0]["content"][0]["text"] == "Hello"


def test_text_then_tool_call_stream_events() -> None:
    out = run(
        [
            chunk({"content": "Looking"}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "function": {"name": "lookup", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    kinds = [e["type"] for e in out]
    assert kinds[kinds.index("response.output_item.done") + 1] == "response.output_item.added"
    args = [e for e in out if e["type"] == "response.function_call_arguments.delta"]
    assert [e["output_index"] for e in args] == [1, 1] and "".join(
        e["delta"] for e in args
    ) == '{"q":1}'
    done = next(e for e in out if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"q":1}'
    final = out[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["call_id"] == "call_1" and final["output"][1]["status"] == "completed"


def test_length_finish_ends_with_response_incomplete() -> None:
    out = run([chunk({"content": "cut"}), chunk({}, "length")])
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_stream_still_completes() -> None:
    out = run([])
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
