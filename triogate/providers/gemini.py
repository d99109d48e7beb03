"""Google's Gemini API (``gemini/<model>``, an API key) and Vertex AI (``vertex_ai/<model>``).

Both speak generateContent: the request is translated chat -> Gemini, the answer Gemini ->
chat (:mod:`.translate_gemini`) and on to the client's API (:mod:`.bridge`). Streams are
``streamGenerateContent?alt=sse``. Embeddings are ``embedContent`` /
``batchEmbedContents`` on the Gemini API and ``predict`` on Vertex AI. Vertex AI's bearer
token comes from :class:`~triogate.providers.google_auth.GoogleTokens` (cached). Claude
models on Vertex AI speak Anthropic's Messages API instead (:mod:`.vertex_claude`).
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from triogate.errors import ProviderProtocolError
from triogate.providers import bridge, vertex_claude
from triogate.providers.cloud_errors import cloud_errors
from triogate.providers.google_auth import GoogleTokens
from triogate.providers.http import (
    SHAPE_ERRORS,
    egress_of,
    open_sse_response,
    post_json,
    reply_shape,
)
from triogate.providers.records import Completion, Usage
from triogate.providers.sse_data import DataLineSource
from triogate.providers.streaming import check_streamable
from triogate.providers.tokens import estimate_input_tokens
from triogate.providers.translate_gemini import (
    GeminiToChat,
    chat_to_gemini_request,
    embedding_inputs,
    embeddings_response,
    gemini_to_chat_response,
    gemini_usage,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    import httpx

    from triogate.config import Deployment
    from triogate.providers.records import Api, ProviderStream

GEMINI_API_BASE = "https://generativelanguage.googleapis.com/v1beta"
_VERSIONED = re.compile(r"/v1[a-z0-9]*$")
DEFAULT_VERTEX_LOCATION = "us-central1"


def _model(deployment: Deployment) -> str:
    return quote(deployment.upstream_model.removeprefix("models/"), safe="-._~@")


class GeminiProvider:
    """Calls generateContent on the Gemini API (``vertex=False``) or Vertex AI.

    Args:
        client: the pooled client shared by the deployments of this kind.
        vertex: Vertex AI's URLs and OAuth tokens instead of the Gemini API's key.
        tokens: Vertex AI's token cache (made on ``client`` when not given).
        clock: wall-clock seconds, for the ``created`` field of answers.
    """

    def __init__(self, client: httpx.AsyncClient, *, vertex: bool,
                 tokens: GoogleTokens | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._vertex = vertex
        self._tokens = tokens or GoogleTokens(client)
        self._clock = clock

    @property
    def tokens(self) -> GoogleTokens:
        return self._tokens

    def _url(self, deployment: Deployment, method: str) -> str:
        if not self._vertex:
            base = (deployment.api_base or GEMINI_API_BASE).rstrip("/")
            if not _VERSIONED.search(base):  # a bare host: Gemini's current version
                base += "/v1beta"
            return f"{base}/models/{_model(deployment)}:{method}"
        cloud = deployment.cloud
        assert cloud is not None and cloud.vertex_project
        location = cloud.vertex_location or DEFAULT_VERTEX_LOCATION
        host = ("https://aiplatform.googleapis.com" if location == "global"
                else f"https://{location}-aiplatform.googleapis.com")
        publisher = "anthropic" if vertex_claude.is_claude(deployment.upstream_model) else (
            "google")
        return (f"{(deployment.api_base or host).rstrip('/')}/v1/projects/"
                f"{quote(cloud.vertex_project, safe='')}/locations/{quote(location, safe='')}"
                f"/publishers/{publisher}/models/{_model(deployment)}:{method}")

    def _claude(self, api: Api, deployment: Deployment) -> bool:
        """A Claude model on Vertex AI: Anthropic's Messages API (:mod:`.vertex_claude`)."""
        return (self._vertex and api != "embeddings"
                and vertex_claude.is_claude(deployment.upstream_model))

    async def _headers(self, deployment: Deployment) -> dict[str, str]:
        if not self._vertex:
            return {"x-goog-api-key": deployment.api_key} if deployment.api_key else {}
        assert deployment.cloud is not None
        token = await self._tokens.token(deployment.cloud, timeout_s=deployment.timeout_s,
                                         egress=egress_of(deployment))
        return {"authorization": f"Bearer {token}"}

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """One call (a checkpoint). Raises ProviderError subclasses, or ValueError."""
        if api == "embeddings":
            return await self._embed(body, deployment)
        if self._claude(api, deployment):
            return await vertex_claude.complete(
                self._client, api, body, vertex_claude.request_body(api, body, stream=False),
                deployment, url=self._url(deployment, "rawPredict"),
                headers=await self._headers(deployment), created_s=int(self._clock()))
        request = chat_to_gemini_request(bridge.chat_request(api, body))
        with cloud_errors():
            response = await post_json(
                self._client, self._url(deployment, "generateContent"),
                headers=await self._headers(deployment), body=request,
                timeout_s=deployment.timeout_s, egress=egress_of(deployment))
        with reply_shape():
            usage = gemini_usage(response.get("usageMetadata"))
            chat = gemini_to_chat_response(
                response, usage=usage or Usage(input_tokens=0, output_tokens=0),
                created_s=int(self._clock()))
            return bridge.answer(api, chat, request=body, usage=usage,
                                 created_s=int(self._clock()))

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> contextlib.AbstractAsyncContextManager[ProviderStream]:
        """A streamed generateContent, translated to ``api``'s events.

        Raises:
            ValueError: at once, for embeddings, or a request Gemini cannot express.
        """
        check_streamable(api)
        if self._claude(api, deployment):
            return self._open_claude(api, body, vertex_claude.request_body(
                api, body, stream=True), deployment)
        request = chat_to_gemini_request(bridge.chat_request(api, body))
        return self._open(api, body, request, deployment)

    @contextlib.asynccontextmanager
    async def _open_claude(self, api: Api, body: Mapping[str, Any], request: dict[str, Any],
                           deployment: Deployment) -> AsyncIterator[ProviderStream]:
        async with vertex_claude.stream(
            self._client, api, body, request, deployment,
            url=self._url(deployment, "streamRawPredict"),
            headers=await self._headers(deployment), created_s=int(self._clock()),
        ) as opened:
            yield opened

    @contextlib.asynccontextmanager
    async def _open(self, api: Api, body: Mapping[str, Any], request: dict[str, Any],
                    deployment: Deployment) -> AsyncIterator[ProviderStream]:
        created_s = int(self._clock())
        url = self._url(deployment, "streamGenerateContent") + "?alt=sse"
        async with contextlib.AsyncExitStack() as stack:
            with cloud_errors():
                response = await stack.enter_async_context(open_sse_response(
                    self._client, url, headers=await self._headers(deployment), body=request,
                    timeout_s=deployment.stream_timeout_s,
                    egress=egress_of(deployment)))
            to_chat = GeminiToChat(created_s=created_s, model=deployment.upstream_model)
            source = bridge.ChatEventSource(DataLineSource(response), to_chat)
            yield bridge.chat_stream(api, source, request=body, created_s=created_s)

    async def _embed(self, body: Mapping[str, Any], deployment: Deployment) -> Completion:
        texts = embedding_inputs(body)
        dimensions = body.get("dimensions")
        headers = await self._headers(deployment)
        if self._vertex:
            parameters = {"outputDimensionality": dimensions} if dimensions else {}
            request: dict[str, Any] = {"instances": [{"content": t} for t in texts],
                                       **({"parameters": parameters} if parameters else {})}
            with cloud_errors():
                response = await post_json(self._client, self._url(deployment, "predict"),
                                           headers=headers, body=request,
                                           timeout_s=deployment.timeout_s,
                                           egress=egress_of(deployment))
            try:
                found = [p["embeddings"] for p in response["predictions"]]
                vectors = [list(e["values"]) for e in found]
                counts = [(e.get("statistics") or {}).get("token_count") for e in found]
            except SHAPE_ERRORS as exc:
                raise ProviderProtocolError(f"upstream embeddings reply: {exc!r}") from exc
            reported = all(isinstance(c, int | float) for c in counts)
            tokens = (int(sum(c or 0 for c in counts)) if reported
                      else estimate_input_tokens("embeddings", body))
            usage = Usage(input_tokens=tokens, output_tokens=0, reported=reported)
        else:
            model = "models/" + deployment.upstream_model.removeprefix("models/")
            extra = {"outputDimensionality": dimensions} if dimensions else {}
            requests = [{"model": model, "content": {"parts": [{"text": t}]}, **extra}
                        for t in texts]
            single = len(requests) == 1
            with cloud_errors():
                response = await post_json(
                    self._client,
                    self._url(deployment, "embedContent" if single else "batchEmbedContents"),
                    headers=headers, body=requests[0] if single else {"requests": requests},
                    timeout_s=deployment.timeout_s, egress=egress_of(deployment))
            try:
                found = [response["embedding"]] if single else response["embeddings"]
                vectors = [list(e["values"]) for e in found]
            except SHAPE_ERRORS as exc:
                raise ProviderProtocolError(f"upstream embeddings reply: {exc!r}") from exc
            usage = Usage(input_tokens=estimate_input_tokens("embeddings", body),
                          output_tokens=0, reported=False)
        if len(vectors) != len(texts):
            raise ProviderProtocolError("upstream embeddings reply has the wrong count")
        out = embeddings_response(vectors, model=deployment.upstream_model, usage=usage,
                                  encoding=body.get("encoding_format"))
        return Completion(body=out, usage=usage)
