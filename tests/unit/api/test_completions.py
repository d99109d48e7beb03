"""Legacy completions ⇄ chat: the request and the answer, chunks included."""

from __future__ import annotations

import pytest

from triogate.api.completions import from_chat, to_chat
from triogate.api.errors import ApiError


def test_a_prompt_becomes_one_user_message_with_openais_default_max_tokens() -> None:
    out = to_chat({"model": "m", "prompt": ["Once"], "temperature": 0, "stop": ["\\n"],
                   "logit_bias": {}})
    assert out == {"model": "m", "temperature": 0, "stop": ["\\n"], "logit_bias": {},
                   "messages": [{"role": "user", "content": "Once"}], "max_tokens": 16}


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": [1, 2]}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({}, "prompt"),
    ({"prompt": "a", "echo": True}, "echo"), ({"prompt": "a", "suffix": "z"}, "suffix"),
    ({"prompt": "a", "best_of": 2}, "best_of"), ({"prompt": "a", "logprobs": 2}, "logprobs"),
])
def test_what_chat_cannot_express_is_a_400(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        to_chat({"model": "m", **body})
    assert (info.value.status, info.value.param) == (400, param)


def test_answers_and_chunks_become_text_completions() -> None:
    answer = from_chat({"id": "chatcmpl-1", "created": 5, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"},
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                              "total_tokens": 2}})
    assert answer == {"id": "cmpl-1", "object": "text_completion", "created": 5,
                      "model": "m", "choices": [{"text": "hi", "index": 0, "logprobs": None,
                                                 "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                "total_tokens": 2}}
    chunk = from_chat({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role":
                       "assistant"}, "finish_reason": None}]}, delta=True)
    assert chunk["choices"][0]["text"] == ""
