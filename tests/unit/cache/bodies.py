"""Complete answers of each API, as providers return them: the round-trip fixtures."""

from __future__ import annotations

from typing import Any

from triogate.providers.records import Usage
from triogate.providers.translate_responses import response_object

USAGE = Usage(input_tokens=12, output_tokens=7)

CHAT_TEXT: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-4o-2024-08-06",
    "system_fingerprint": "fp_1",
    "choices": [{
        "index": 0,
        "message": {"role": "assistant", "content": "Hello there", "refusal": None,
                    "annotations": []},
        "finish_reason": "stop",
        "logprobs": None,
    }],
    "usage": USAGE.to_chat(),
}

CHAT_TOOLS: dict[str, Any] = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-4o",
    "choices": [{
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "time", "arguments": '{"tz":"CET"}'}},
            ],
        },
        "finish_reason": "tool_calls",
        "logprobs": None,
    }],
    "usage": USAGE.to_chat(),
}

CHAT_N2_LOGPROBS: dict[str, Any] = {
    "id": "chatcmpl-3",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-4o",
    "service_tier": "default",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi"},
            "finish_reason": "stop",
            "logprobs": {"content": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105],
                                      "top_logprobs": []}], "refusal": None},
        },
        {
            "index": 1,
            "message": {"role": "assistant", "content": "Hello and"},
            "finish_reason": "length",
            "logprobs": {"content": [{"token": "Hello", "logprob": -0.5, "bytes": None,
                                      "top_logprobs": []}], "refusal": None},
        },
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
              "completion_tokens_details": {"reasoning_tokens": 0}},
}

MESSAGES_TEXT: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4",
    "content": [{"type": "text", "text": "Hello there"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": USAGE.to_messages(),
}

MESSAGES_TOOLS: dict[str, Any] = {
    "id": "msg_2",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4",
    "content": [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": "sig=="},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather",
         "input": {"city": "Paris", "days": [1, 2], "units": {"t": "C"}}},
        {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 20, "output_tokens": 30, "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": 8},
}

MESSAGES_CITATIONS: dict[str, Any] = {
    "id": "msg_3",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4",
    "content": [
        {"type": "text", "text": "The sky is blue.", "citations": [
            {"type": "char_location", "cited_text": "blue", "document_index": 0,
             "document_title": "Sky", "start_char_index": 10, "end_char_index": 14}]},
    ],
    "stop_reason": "stop_sequence",
    "stop_sequence": "END",
    "usage": USAGE.to_messages(),
}

_REQUEST = {"model": "gpt-4o", "input": "hi", "temperature": 0.2,
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]}


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


RESPONSES_TEXT = response_object(
    response_id="resp_1", request=_REQUEST, model="gpt-4o", created_s=1_700_000_000,
    status="completed", output=[_message("msg_1", "Hello there")], usage=USAGE,
)

RESPONSES_TOOLS = response_object(
    response_id="resp_2", request=_REQUEST, model="gpt-4o", created_s=1_700_000_000,
    status="completed",
    output=[
        _message("msg_2", "Checking."),
        {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
         "name": "weather", "arguments": '{"city":"Paris"}'},
    ],
    usage=USAGE,
)

RESPONSES_INCOMPLETE = response_object(
    response_id="resp_3", request=_REQUEST, model="gpt-4o", created_s=1_700_000_000,
    status="incomplete", output=[_message("msg_3", "Cut sh")], usage=USAGE,
    incomplete={"reason": "max_output_tokens"},
)

BODIES: list[tuple[str, str, dict[str, Any]]] = [
    ("chat text", "chat", CHAT_TEXT),
    ("chat tools", "chat", CHAT_TOOLS),
    ("chat n=2 logprobs", "chat", CHAT_N2_LOGPROBS),
    ("messages text", "messages", MESSAGES_TEXT),
    ("messages thinking tools", "messages", MESSAGES_TOOLS),
    ("messages citations", "messages", MESSAGES_CITATIONS),
    ("responses text", "responses", RESPONSES_TEXT),
    ("responses tools", "responses", RESPONSES_TOOLS),
    ("responses incomplete", "responses", RESPONSES_INCOMPLETE),
]
