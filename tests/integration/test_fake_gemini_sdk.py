"""The Gemini fake checked by Google's own SDK (google-genai) and auth library.

If the fake and the SDK disagree on the wire format (paths, field names, the SSE stream,
function calls, usage, errors, the service-account token grant), these tests fail.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import pytest
import trio
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from google.oauth2 import service_account

from triogate.testing.fakegemini import open_fake_gemini

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.fakegemini import FakeGemini

pytestmark = [pytest.mark.integration]

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@pytest.fixture
async def fake() -> AsyncIterator[FakeGemini]:
    async with open_fake_gemini(api_key="gemini-key") as server:
        yield server


def _client(fake: FakeGemini, key: str = "gemini-key") -> genai.Client:
    """A client for the fake (keep a reference: the SDK closes it when collected)."""
    options = types.HttpOptions(base_url=fake.base_url,
                                retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=options)


async def _in_thread(fn: Any) -> Any:
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn)


async def test_generate_content_text_image_and_usage(fake: FakeGemini) -> None:
    def run() -> Any:
        client = _client(fake)
        return client.models.generate_content(
            model="gemini-2.0-flash",
            contents=[types.Part.from_text(text="describe this picture please"),
                      types.Part.from_bytes(data=PNG, mime_type="image/png")],
            config=types.GenerateContentConfig(system_instruction="Be brief.",
                                               max_output_tokens=40, temperature=0.2))

    reply = await _in_thread(run)
    assert reply.text.startswith("Fake reply from gemini-2.0-flash.")
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP
    usage = reply.usage_metadata
    assert usage.prompt_token_count > 0 and usage.candidates_token_count > 0
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    sent = fake.requests[-1]
    assert sent.path.endswith("/models/gemini-2.0-flash:generateContent")
    assert sent.headers["x-goog-api-key"] == "gemini-key"
    image = sent.json["contents"][0]["parts"][1]["inlineData"]
    assert base64.urlsafe_b64decode(image["data"]) == PNG and image["mimeType"] == "image/png"
    assert sent.json["generationConfig"]["maxOutputTokens"] == 40


async def test_stream_generate_content_over_sse(fake: FakeGemini) -> None:
    def run() -> list[Any]:
        client = _client(fake)
        return list(client.models.generate_content_stream(
            model="gemini-2.0-flash", contents="tell me about trio nurseries"))

    chunks = await _in_thread(run)
    assert len(chunks) > 3
    text = "".join(c.text or "" for c in chunks)
    assert text.startswith("Fake reply from gemini-2.0-flash. You said: tell me")
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    assert chunks[-1].usage_metadata.candidates_token_count == len(text.split())
    assert fake.requests[-1].query == {"alt": "sse"}


async def test_function_call(fake: FakeGemini) -> None:
    weather = types.FunctionDeclaration(
        name="get_weather", description="The weather in a city",
        parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]})

    def run() -> Any:
        client = _client(fake)
        return client.models.generate_content(
            model="gemini-2.0-flash", contents="weather in Paris",
            config=types.GenerateContentConfig(
                tools=[types.Tool(function_declarations=[weather])],
                tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
                    mode=types.FunctionCallingConfigMode.ANY)),
                automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True)))

    reply = await _in_thread(run)
    call = reply.function_calls[0]
    assert call.name == "get_weather" and call.args == {"query": "weather in Paris"}
    sent = fake.requests[-1].json
    declared = sent["tools"][0]["functionDeclarations"][0]
    assert declared["parametersJsonSchema"]["required"] == ["city"]
    assert sent["toolConfig"]["functionCallingConfig"]["mode"] == "ANY"


async def test_embeddings_single_and_batch(fake: FakeGemini) -> None:
    def run() -> tuple[Any, Any]:
        client = _client(fake)
        one = client.models.embed_content(model="text-embedding-004", contents="hello world")
        many = client.models.embed_content(
            model="text-embedding-004", contents=["one", "two", "three"],
            config=types.EmbedContentConfig(output_dimensionality=4))
        return one, many

    one, many = await _in_thread(run)
    assert len(one.embeddings) == 1 and len(one.embeddings[0].values) == 8
    assert [len(e.values) for e in many.embeddings] == [4, 4, 4]
    paths = [r.path for r in fake.requests]
    assert any(p.endswith(":batchEmbedContents") for p in paths)


async def test_errors_in_googles_shape(fake: FakeGemini) -> None:
    fake.fail_next(1, status=429, message="Resource has been exhausted (e.g. check quota).")

    def run(key: str) -> Any:
        try:
            client = _client(fake, key)
            client.models.generate_content(model="gemini-2.0-flash", contents="hi")
        except genai_errors.APIError as exc:
            return exc
        raise AssertionError("no error")

    throttled = await _in_thread(lambda: run("gemini-key"))
    assert throttled.code == 429 and throttled.status == "RESOURCE_EXHAUSTED"
    assert "exhausted" in throttled.message
    refused = await _in_thread(lambda: run("wrong-key"))
    assert refused.code == 400 and "API key not valid" in refused.message


async def test_vertex_sdk_with_a_service_account_token(fake: FakeGemini) -> None:
    account = fake.service_account()

    def run() -> Any:
        credentials = service_account.Credentials.from_service_account_info(
            account, scopes=["https://www.googleapis.com/auth/cloud-platform"])
        client = genai.Client(vertexai=True, project="test-project", location="us-central1",
                              credentials=credentials,
                              http_options=types.HttpOptions(base_url=fake.base_url,
                                                             api_version="v1"))
        return client.models.generate_content(model="gemini-1.5-pro", contents="hello vertex")

    reply = await _in_thread(run)
    assert reply.text.startswith("Fake reply from gemini-1.5-pro.")
    assert fake.token_requests == 1
    sent = fake.requests[-1]
    assert sent.path == ("/v1/projects/test-project/locations/us-central1/publishers/google/"
                         "models/gemini-1.5-pro:generateContent")
    assert sent.headers["authorization"].startswith("Bearer ya29.fake-")
