"""Token estimates: ceil(chars / 4) over the text a model reads."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from triogate.providers.tokens import (
    count_output_tokens,
    estimate_input_tokens,
    estimate_tokens,
    tokens_for_chars,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 400, 100), ("x" * 401, 101)],
)
def test_estimate_tokens_is_ceil_of_quarter_length(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens
    assert count_output_tokens(text) == tokens


@given(st.text())
def test_estimate_is_at_least_one_for_non_empty_text(text: str) -> None:
    assert estimate_tokens(text) == math.ceil(len(text) / 4)
    assert (estimate_tokens(text) >= 1) == bool(text)


def test_tokens_for_chars_matches_estimate() -> None:
    assert [tokens_for_chars(n) for n in range(9)] == [0, 1, 1, 1, 1, 2, 2, 2, 2]


CHAT_BODY = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "abcd"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "efgh"},
                {"type": "image_url", "image_url": {"url": "data:" + "x" * 999}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "ab", "arguments": "cd"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "ijkl"},
    ],
}


@pytest.mark.parametrize(
    ("api", "body", "chars"),
    [
        # system 4 + user 4 (image skipped) + tool call name/args 4 + tool result 4
        ("chat", CHAT_BODY, 16),
        ("messages", {"system": "abcdefgh", "messages": [{"role": "user", "content": "ijkl"}]}, 12),
        (
            "messages",
            {
                "system": [{"type": "text", "text": "ab"}],
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "cd"}
                        ],
                    }
                ],
            },
            4,
        ),
        ("responses", {"instructions": "abcd", "input": "efghi"}, 9),
        (
            "responses",
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": "ab"}]},
                    {"type": "function_call_output", "call_id": "c", "output": "cdef"},
                ]
            },
            6,
        ),
        ("embeddings", {"input": "abcdefgh"}, 8),
        ("embeddings", {"input": ["abcd", "efgh", "i"]}, 9),
        ("embeddings", {"input": [1, 2, 3]}, 12),  # token ids count as tokens
    ],
)
def test_estimate_input_tokens_counts_the_text(api: str, body: dict, chars: int) -> None:
    assert estimate_input_tokens(api, body) == tokens_for_chars(chars)


def test_tools_count_as_their_json() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    body = {"messages": [{"role": "user", "content": "abcd"}], "tools": tools}
    assert estimate_input_tokens("chat", body) == tokens_for_chars(4 + len(orjson.dumps(tools)))
