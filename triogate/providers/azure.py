"""Azure OpenAI as an upstream (``model: azure/<deployment>``).

Azure speaks OpenAI's chat completions and embeddings, addressed by deployment:
``{api_base}/openai/deployments/{deployment}/chat/completions?api-version=...``, with the
key in an ``api-key`` header or an Entra ID bearer token (:mod:`.azure_auth`). Anthropic
messages and Responses API requests go through chat completions, as for other
OpenAI-compatible upstreams. Azure's errors (its content filter's 400s, 429s with
``retry-after``) keep their status and body, so they map as any upstream's do.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from triogate.config import AZURE_API_VERSION, AzureSettings
from triogate.providers.azure_auth import AzureTokens
from triogate.providers.http import egress_of
from triogate.providers.openai import embed
from triogate.providers.streaming import check_streamable
from triogate.providers.translate import ChatHub
from triogate.providers.upstream import complete_via_hub, open_hub_stream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    import httpx

    from triogate.config import Deployment
    from triogate.providers.rawsse import RawStream
    from triogate.providers.records import Api, Completion, ProviderStream
    from triogate.providers.streaming import TranslatedStream


class AzureProvider:
    """Calls an Azure OpenAI resource's deployments.

    Args:
        client: the pooled client shared by every Azure deployment (and token requests).
        clock: wall-clock seconds, for the ``created`` field of translated answers.
    """

    def __init__(
        self, client: httpx.AsyncClient, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._client = client
        self._clock = clock
        self._hub = ChatHub()
        self.tokens = AzureTokens(client)

    @staticmethod
    def _settings(deployment: Deployment) -> AzureSettings:
        return deployment.azure or AzureSettings(api_version=AZURE_API_VERSION)

    def _url(self, deployment: Deployment, path: str) -> str:
        base = (deployment.api_base or "").rstrip("/")
        name = quote(deployment.upstream_model, safe="")
        version = quote(self._settings(deployment).api_version, safe="")
        return f"{base}/openai/deployments/{name}{path}?api-version={version}"

    async def _headers(self, deployment: Deployment) -> dict[str, str]:
        token = await self.tokens.bearer(self._settings(deployment), egress_of(deployment))
        if token is not None:
            return {"authorization": f"Bearer {token}"}
        return {"api-key": deployment.api_key} if deployment.api_key else {}

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """One call (a checkpoint). Raises ProviderError subclasses, or ValueError."""
        headers = await self._headers(deployment)
        if api == "embeddings":
            return await embed(self._client, body, deployment,
                               url=self._url(deployment, "/embeddings"), headers=headers)
        return await complete_via_hub(
            self._client, self._hub, api, body, deployment,
            url=self._url(deployment, "/chat/completions"), headers=headers,
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
        return self._open_stream(api, body, deployment)

    @contextlib.asynccontextmanager
    async def _open_stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AsyncIterator[TranslatedStream | RawStream]:
        headers = await self._headers(deployment)
        async with open_hub_stream(
            self._client, self._hub, api, body, deployment,
            url=self._url(deployment, "/chat/completions"), headers=headers,
            created_s=int(self._clock()),
        ) as stream:
            yield stream
