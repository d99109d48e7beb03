"""The fake Azure OpenAI resource checked by the official ``openai.AsyncAzureOpenAI``
client: if the fake and the SDK disagree on paths, headers or shapes, these fail."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio

from triogate.testing.fakeazure import open_fake_azure

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.fakeazure import FakeAzure

pytestmark = [pytest.mark.integration]

VERSION = "2024-10-21"
MESSAGES = [{"role": "user", "content": "hello from the Azure SDK"}]


@pytest.fixture
async def azure() -> AsyncIterator[FakeAzure]:
    async with open_fake_azure(deployments={"gpt-4o-prod", "embed-prod"},
                               static_tokens={"static-token"}) as fake:
        yield fake


def sdk(azure: FakeAzure, **auth: object) -> openai.AsyncAzureOpenAI:
    auth = auth or {"api_key": azure.api_key}
    return openai.AsyncAzureOpenAI(azure_endpoint=azure.base_url, api_version=VERSION,
                                   max_retries=0, **auth)


async def test_chat_with_the_key_in_the_api_key_header(azure: FakeAzure) -> None:
    with trio.fail_after(20):
        reply = await sdk(azure).chat.completions.create(model="gpt-4o-prod",
                                                         messages=MESSAGES)
    assert reply.model == "gpt-4o-prod"
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    sent = azure.requests[-1]
    assert sent.path == "/openai/deployments/gpt-4o-prod/chat/completions"
    assert sent.query == {"api-version": VERSION}
    assert sent.headers["api-key"] == azure.api_key
    assert "authorization" not in sent.headers


async def test_stream_opens_with_a_chunk_without_choices(azure: FakeAzure) -> None:
    with trio.fail_after(20):
        stream = await sdk(azure).chat.completions.create(
            model="gpt-4o-prod", messages=MESSAGES, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert chunks[0].choices == []
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


async def test_embeddings(azure: FakeAzure) -> None:
    with trio.fail_after(20):
        reply = await sdk(azure).embeddings.create(model="embed-prod", input=["a b", "c"])
    assert [d.index for d in reply.data] == [0, 1]
    assert azure.requests[-1].path == "/openai/deployments/embed-prod/embeddings"


async def test_entra_id_tokens_from_the_token_endpoint(azure: FakeAzure) -> None:
    async def token() -> str:
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{azure.base_url}/tenant/oauth2/v2.0/token", data={
                "grant_type": "client_credentials", "client_id": azure.client_id,
                "client_secret": azure.client_secret,
                "scope": "https://cognitiveservices.azure.com/.default"})
        assert response.status_code == 200, response.text
        return str(response.json()["access_token"])

    with trio.fail_after(20):
        await sdk(azure, azure_ad_token_provider=token).chat.completions.create(
            model="gpt-4o-prod", messages=MESSAGES)
        await sdk(azure, azure_ad_token="static-token").chat.completions.create(
            model="gpt-4o-prod", messages=MESSAGES)
        with pytest.raises(openai.AuthenticationError):
            await sdk(azure, azure_ad_token="forged").chat.completions.create(
                model="gpt-4o-prod", messages=MESSAGES)
    assert azure.requests[0].headers["authorization"].startswith("Bearer entra-token-")
    assert "api-key" not in azure.requests[0].headers


@pytest.mark.parametrize(("kind", "error", "code"), [
    ("throttle", openai.RateLimitError, "429"),
    ("content_filter", openai.BadRequestError, "content_filter"),
    ("context_length", openai.BadRequestError, "context_length_exceeded"),
    ("server", openai.InternalServerError, "InternalServerError"),
])
async def test_errors_as_the_sdk_reads_them(
    azure: FakeAzure, kind: str, error: type[openai.APIStatusError], code: str
) -> None:
    azure.fail_next(kind)
    with trio.fail_after(20), pytest.raises(error) as raised:
        await sdk(azure).chat.completions.create(model="gpt-4o-prod",
                                                 messages=MESSAGES)
    assert raised.value.code == code


async def test_wrong_key_missing_version_and_unknown_deployment(azure: FakeAzure) -> None:
    with trio.fail_after(20):
        with pytest.raises(openai.AuthenticationError):
            await sdk(azure, api_key="wrong").chat.completions.create(
                model="gpt-4o-prod", messages=MESSAGES)
        with pytest.raises(openai.NotFoundError) as raised:
            await sdk(azure).chat.completions.create(model="nope",
                                                     messages=MESSAGES)
        assert raised.value.code == "DeploymentNotFound"
        async with httpx.AsyncClient() as http:
            response = await http.post(
                f"{azure.base_url}/openai/deployments/gpt-4o-prod/chat/completions",
                json={"messages": MESSAGES}, headers={"api-key": azure.api_key})
    assert response.status_code == 404


async def test_the_token_endpoint_refuses_a_wrong_secret(azure: FakeAzure) -> None:
    with trio.fail_after(20):
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{azure.base_url}/t/oauth2/v2.0/token", data={
                "grant_type": "client_credentials", "client_id": azure.client_id,
                "client_secret": "wrong", "scope": "x"})
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"
