"""The Anthropic Messages API as an upstream.

Native for messages; chat completions and Responses API requests are translated (see
:mod:`.translate`). Anthropic has no embeddings endpoint.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from triogate.errors import ProviderStatusError
from triogate.providers.streaming import check_streamable
from triogate.providers.translate import MessagesHub
from triogate.providers.upstream import complete_via_hub, open_hub_stream

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractAsyncContextManager

    import httpx

    from triogate.config import Deployment
    from triogate.providers.records import Api, Completion, ProviderStream

DEFAULT_API_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProvider:
    """Calls ``{api_base}/v1/messages``.

    Args:
        client: the pooled client shared by every Anthropic deployment.
        clock: wall-clock seconds, for the ``created`` field of translated answers.
    """

    def __init__(
        self, client: httpx.AsyncClient, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._client = client
        self._clock = clock
        self._hub = MessagesHub()

    @staticmethod
    def _url(deployment: Deployment) -> str:
        return (deployment.api_base or DEFAULT_API_BASE).rstrip("/") + "/v1/messages"

    @staticmethod
    def _headers(deployment: Deployment) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if deployment.api_key:
            headers["x-api-key"] = deployment.api_key
        return headers

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """One call (a checkpoint). Raises ProviderError subclasses, or ValueError."""
        if api in ("embeddings", "moderations"):
            raise ProviderStatusError(
                400,
                f'{{"error": {{"message": "Anthropic has no {api} API", '
                '"type": "invalid_request_error"}}',
                message=f"Anthropic has no {api} API",
            )
        return await complete_via_hub(
            self._client,
            self._hub,
            api,
            body,
            deployment,
            url=self._url(deployment),
            headers=self._headers(deployment),
            created_s=int(self._clock()),
        )

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AbstractAsyncContextManager[ProviderStream]:
        """A streamed message, translated to ``api``'s events.

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
            url=self._url(deployment),
            headers=self._headers(deployment),
            created_s=int(self._clock()),
        )
