"""Chat <-> Gemini generateContent and chat <-> Bedrock Converse translations."""

from __future__ import annotations

import orjson
import pytest

from triogate.config import parse_config
from triogate.errors import ProviderStatusError, TranslationError
from triogate.providers.bedrock import BedrockProvider
from triogate.providers.cloud_errors import normalised
from triogate.providers.params import drop_unsupported
from triogate.providers.records import Usage
from triogate.providers.translate_bedrock import (
    ConverseToChat,
    chat_to_converse_request,
    converse_to_chat_response,
    converse_usage,
    embedding_family,
)
from triogate.providers.translate_gemini import (
    GeminiToChat,
    chat_to_gemini_request,
    gemini_to_chat_response,
    gemini_usage,
)
from triogate.routing.retries import is_context_window_error

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Find",
                                         "parameters": {"type": "object"}}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "look"},
                                 {"type": "image_url",
                                  "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"found": true}'},
    {"role": "user", "content": "and then?"},
]


def test_chat_to_gemini_request() -> None:
    out = chat_to_gemini_request({"messages": CONVERSATION, "tools": [TOOL],
                                  "tool_choice": "required", "max_tokens": 9, "stop": "END",
                                  "temperature": 0.3, "response_format": {"type": "json_object"}})
    assert out["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert out["contents"] == [
        {"role": "user", "parts": [{"text": "look"},
                                   {"inlineData": {"mimeType": "image/jpeg", "data": "AAAA"}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {"q": "x"}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "lookup", "response": {"found": True}}},
            {"text": "and then?"}]},
    ]
    assert out["tools"] == [{"functionDeclarations": [
        {"name": "lookup", "description": "Find", "parametersJsonSchema": {"type": "object"}}]}]
    assert out["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert out["generationConfig"] == {"temperature": 0.3, "maxOutputTokens": 9,
                                       "stopSequences": ["END"],
                                       "responseMimeType": "application/json"}


@pytest.mark.parametrize("body", [{"n": 2, "messages": []},
                                  {"messages": [{"role": "user", "content": [
                                      {"type": "input_audio", "input_audio": {}}]}]}])
def test_what_gemini_cannot_take_is_refused(body: dict[str, object]) -> None:
    with pytest.raises(TranslationError):
        chat_to_gemini_request(body)


def test_gemini_answer_to_chat() -> None:
    answer = {"candidates": [{"content": {"role": "model", "parts": [
        {"text": "thinking...", "thought": True}, {"text": "Hi"},
        {"functionCall": {"name": "lookup", "args": {"q": 1}}}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2,
                          "thoughtsTokenCount": 3}, "responseId": "r1", "modelVersion": "g"}
    usage = gemini_usage(answer["usageMetadata"])
    assert usage == Usage(input_tokens=4, output_tokens=5)
    chat = gemini_to_chat_response(answer, usage=usage, created_s=7)
    (choice,) = chat["choices"]
    assert choice["message"]["content"] == "Hi" and choice["finish_reason"] == "tool_calls"
    assert orjson.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"q": 1}
    assert chat["id"] == "chatcmpl-r1" and chat["usage"]["completion_tokens"] == 5


def test_a_blocked_prompt_is_a_content_filter_finish() -> None:
    blocked = {"promptFeedback": {"blockReason": "SAFETY"},
               "usageMetadata": {"promptTokenCount": 3}}
    chat = gemini_to_chat_response(blocked, usage=Usage(input_tokens=3, output_tokens=0),
                                   created_s=0)
    assert chat["choices"][0]["finish_reason"] == "content_filter"
    chunks = GeminiToChat(created_s=0, model="g").feed(blocked)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == (
        "content_filter")


def test_gemini_stream_to_chat_chunks() -> None:
    to_chat = GeminiToChat(created_s=1, model="g")
    first = to_chat.feed({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}],
                          "usageMetadata": {"promptTokenCount": 2}, "responseId": "abc"})
    assert [c["choices"][0]["delta"] for c in first] == [{"role": "assistant", "content": ""},
                                                         {"content": "Hel"}]
    assert all("usage" not in c for c in first)  # the usage so far is not final
    last = to_chat.feed({"candidates": [{"content": {"parts": [{"text": "lo"}]},
                                         "finishReason": "MAX_TOKENS"}],
                         "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 2}})
    assert last[-2]["choices"][0]["finish_reason"] == "length"
    assert last[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert {c["id"] for c in first + last} == {"chatcmpl-abc"}


def test_chat_to_converse_request() -> None:
    out = chat_to_converse_request({"messages": CONVERSATION, "tools": [TOOL],
                                    "tool_choice": {"type": "function",
                                                    "function": {"name": "lookup"}},
                                    "max_completion_tokens": 9, "top_p": 0.5})
    assert out["system"] == [{"text": "Be brief."}]
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]
    assert out["messages"][0]["content"][1] == {
        "image": {"format": "jpeg", "source": {"bytes": "AAAA"}}}
    assert out["messages"][1]["content"] == [
        {"toolUse": {"toolUseId": "call_1", "name": "lookup", "input": {"q": "x"}}}]
    assert out["messages"][2]["content"] == [
        {"toolResult": {"toolUseId": "call_1", "content": [{"text": '{"found": true}'}]}},
        {"text": "and then?"}]
    assert out["inferenceConfig"] == {"maxTokens": 9, "topP": 0.5}
    assert out["toolConfig"] == {"tools": [{"toolSpec": {
        "name": "lookup", "description": "Find", "inputSchema": {"json": {"type": "object"}}}}],
        "toolChoice": {"tool": {"name": "lookup"}}}


def test_an_image_url_is_refused_for_bedrock() -> None:
    with pytest.raises(TranslationError, match="base64"):
        chat_to_converse_request({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]})


def test_converse_answer_and_stream_to_chat() -> None:
    answer = {"output": {"message": {"role": "assistant", "content": [
        {"text": "Hi"}, {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {}}}]}},
        "stopReason": "tool_use", "usage": {"inputTokens": 5, "outputTokens": 3,
                                           "cacheReadInputTokens": 2}}
    usage = converse_usage(answer["usage"])
    assert usage == Usage(input_tokens=7, output_tokens=3)
    chat = converse_to_chat_response(answer, model="m", usage=usage, created_s=0, ident="x")
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["choices"][0]["message"]["tool_calls"][0]["id"] == "t1"
    to_chat = ConverseToChat(created_s=0, model="m", ident="x")
    chunks = [c for e in [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockStart": {"contentBlockIndex": 1, "start": {
            "toolUse": {"toolUseId": "t1", "name": "lookup"}}}},
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{}"}}}},
        {"messageStop": {"stopReason": "tool_use"}},
        {"metadata": {"usage": {"inputTokens": 5, "outputTokens": 3}}},
    ] for c in to_chat.feed(e)]
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:3]]
    assert calls[0]["id"] == "t1" and calls[1] == {"index": 0, "function": {"arguments": "{}"}}
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[4]["usage"]["prompt_tokens"] == 5


def test_an_exception_event_is_the_status_it_stands_for() -> None:
    to_chat = ConverseToChat(created_s=0, model="m", ident="x")
    with pytest.raises(ProviderStatusError) as caught:
        to_chat.feed({"exception": "throttlingException", "message": "slow down"})
    assert caught.value.status == 429 and "slow down" in caught.value.body


@pytest.mark.parametrize(("model", "family"), [
    ("amazon.titan-embed-text-v2:0", "titan"), ("cohere.embed-multilingual-v3", "cohere"),
    ("us.cohere.embed-english-v3", "cohere")])
def test_embedding_families(model: str, family: str) -> None:
    assert embedding_family(model) == family
    with pytest.raises(TranslationError):
        embedding_family("anthropic.claude-3-haiku-20240307-v1:0")


@pytest.mark.parametrize("provider", ["gemini", "vertex_ai", "bedrock"])
def test_drop_params_leaves_out_what_the_cloud_models_cannot_take(provider: str) -> None:
    body = {"n": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "input_audio", "input_audio": {}}]}]}
    with pytest.raises(TranslationError):
        chat_to_converse_request(body) if provider == "bedrock" else chat_to_gemini_request(body)
    kept = drop_unsupported("chat", body, provider)
    assert "n" not in kept and kept["messages"][0]["content"] == [{"type": "text", "text": "hi"}]
    chat_to_converse_request(kept) if provider == "bedrock" else chat_to_gemini_request(kept)


@pytest.mark.parametrize(("status", "body", "expected"), [
    (400, '{"error": {"code": 400, "message": "The input token count (9) exceeds the maximum '
          'number of tokens allowed (5).", "status": "INVALID_ARGUMENT"}}', 400),
    (400, '{"message": "Input is too long for requested model."}', 400),
    (400, '{"error": {"code": 400, "message": "API key not valid. Please pass a valid API '
          'key.", "status": "INVALID_ARGUMENT"}}', 401),
    (403, '{"message": "The request signature we calculated does not match"}', 401),
    (429, '{"message": "Too many requests, please wait before trying again."}', 429),
])
def test_cloud_errors_are_normalised(status: int, body: str, expected: int) -> None:
    error = normalised(ProviderStatusError(status, body))
    assert error.status == expected
    assert is_context_window_error(error) == ("too long" in body or "exceeds" in body)
    assert "message" in orjson.loads(error.body).get("error", {})


@pytest.mark.parametrize(("model", "path"), [
    ("bedrock/anthropic.claude-3-haiku-20240307-v1:0",
     "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"),
    ("bedrock/converse/us.meta.llama3-2-1b-instruct-v1:0",
     "/model/us.meta.llama3-2-1b-instruct-v1%3A0/converse"),
    ("bedrock/invoke/anthropic.claude-3-haiku-20240307-v1:0",
     "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"),
    ("bedrock/arn:aws:bedrock:us-east-1:1:inference-profile/x",
     "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fx/converse"),
])
def test_bedrock_model_routes(model: str, path: str) -> None:
    config = parse_config({"model_list": [{"model_name": "m", "litellm_params": {
        "model": model, "aws_region_name": "eu-west-1", "aws_access_key_id": "a",
        "aws_secret_access_key": "s", "input_cost_per_token": 1e-6,
        "output_cost_per_token": 2e-6}}]})
    url = BedrockProvider._url(config.deployments[0], "converse")
    assert url == f"https://bedrock-runtime.eu-west-1.amazonaws.com{path}"


def test_an_error_in_a_gemini_stream_keeps_its_status() -> None:
    to_chat = GeminiToChat(created_s=0, model="g")
    with pytest.raises(ProviderStatusError) as caught:
        to_chat.feed({"error": {"code": 429, "message": "Resource has been exhausted",
                                "status": "RESOURCE_EXHAUSTED"}})
    assert caught.value.status == 429 and "exhausted" in caught.value.body
