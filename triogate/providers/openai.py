"""OpenAI-compatible upstreams: OpenAI itself, vLLM, llama.cpp, Ollama, other gateways.

Native for chat completions and embeddings; Anthropic messages and Responses API requests
go through chat completions (see :mod:`.translate`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from triogate.errors import ProviderProtocolError
from triogate.providers.http import egress_of, post_json, upstream_body
from triogate.providers.records import Completion, Usage
from triogate.providers.streaming import check_streamable
from triogate.providers.tokens import estimate_input_tokens
from triogate.providers.translate import ChatHub
from triogate.providers.upstream import complete_via_hub, open_hub_stream

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    import httpx

    from triogate.config import Deployment
    from triogate.providers.records import Api, ProviderStream

DEFAULT_API_BASE = "https://api.openai.com/v1"


class OpenAIProvider:
    """Calls ``{api_base}/chat/completions`` and ``{api_base}/embeddings``.

    Args:
        client: the pooled client shared by every OpenAI-compatible deployment.
        clock: wall-clock seconds, for the ``created`` field of translated answers.
    """

    def __init__(
        self, client: httpx.AsyncClient, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._client = client
        self._clock = clock
        self._hub = ChatHub()

    @staticmethod
    def _url(deployment: Deployment, path: str) -> str:
        return (deployment.api_base or DEFAULT_API_BASE).rstrip("/") + path

    @staticmethod
    def _headers(deployment: Deployment) -> dict[str, str]:
        return {"authorization": f"Bearer {deployment.api_key}"} if deployment.api_key else {}

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """One call (a checkpoint). Raises ProviderError subclasses, or ValueError."""
        if api == "embeddings":
            return await self._embed(body, deployment)
        if api == "moderations":
            return await self._moderate(body, deployment)
        return await complete_via_hub(
            self._client,
            self._hub,
            api,
            body,
            deployment,
            url=self._url(deployment, "/chat/completions"),
            headers=self._headers(deployment),
            created_s=int(self._clock()),
        )

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AbstractAsyncContextManager[ProviderStream]:
        """A streamed chat completion, translated to ``api``'s events.

        Raises:
            ValueError: at once, for embeddings.
        """
        check_streamable(api)
        return open_hub_stream(
            self._client,
            self._hub,
            api,
            body,
            deployment,
            url=self._url(deployment, "/chat/completions"),
            headers=self._headers(deployment),
            created_s=int(self._clock()),
        )

    async def _moderate(self, body: Mapping[str, Any], deployment: Deployment) -> Completion:
        """``POST {api_base}/moderations``: the answer as the upstream gave it."""
        response = await post_json(
            self._client,
            self._url(deployment, "/moderations"),
            headers=self._headers(deployment),
            body=upstream_body(body, deployment),
            timeout_s=deployment.timeout_s,
            egress=egress_of(deployment),
        )
        if not isinstance(response.get("results"), list):
            raise ProviderProtocolError("upstream moderations reply has no results list")
        # Moderations report no usage: the input is counted, for TPM and any price set.
        usage = Usage(input_tokens=estimate_input_tokens("moderations", body),
                      output_tokens=0, reported=False)
        return Completion(body=response, usage=usage)

    async def _embed(self, body: Mapping[str, Any], deployment: Deployment) -> Completion:
        return await embed(self._client, body, deployment,
                           url=self._url(deployment, "/embeddings"),
                           headers=self._headers(deployment))


async def embed(
    client: httpx.AsyncClient, body: Mapping[str, Any], deployment: Deployment, *,
    url: str, headers: Mapping[str, str],
) -> Completion:
    """An OpenAI-shaped embeddings call (a checkpoint); usage estimated when not reported."""
    response = await post_json(
        client, url, headers=headers, body=upstream_body(body, deployment),
        timeout_s=deployment.timeout_s,
    )
    if not isinstance(response.get("data"), list):
        raise ProviderProtocolError("upstream embeddings reply has no data list")
    usage = Usage.from_chat({"completion_tokens": 0, **(response.get("usage") or {})})
    if usage is None:
        usage = Usage(
            input_tokens=estimate_input_tokens("embeddings", body),
            output_tokens=0,
            reported=False,
        )
    return Completion(body=response, usage=usage)
