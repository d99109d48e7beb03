"""Upstream model providers: OpenAI-compatible, Anthropic, the clouds', and a mock.

Every provider implements :class:`triogate.providers.records.Provider`. :func:`build_providers`
creates them with one pooled httpx client per provider kind, for the app nursery to own.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import httpx

from triogate.config import OPENAI_COMPATIBLE
from triogate.providers.anthropic import AnthropicProvider
from triogate.providers.azure import AzureProvider
from triogate.providers.bedrock import BedrockProvider
from triogate.providers.gemini import GeminiProvider
from triogate.providers.mock import MockProvider
from triogate.providers.openai import OpenAIProvider
from triogate.providers.transport import CONNECT_TIMEOUT_S, UpstreamTransport, register

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.config import GatewayConfig
    from triogate.providers.records import Provider

#: Seconds an idle upstream connection is kept.
KEEPALIVE_EXPIRY_S = 30.0
#: The client-wide default; each request passes its deployment's own timeout.
DEFAULT_TIMEOUT_S = 600.0


def new_upstream_client(*, max_connections: int) -> httpx.AsyncClient:
    """An httpx client fit for LLM upstreams.

    httpx's defaults (5 s timeout, 20 keep-alive connections) suit web APIs, not long
    generations under bursts. HTTP/1.1 only; environment proxies are ignored (trust_env
    off) so that configuration lives in one place. The transport under it is
    :class:`~triogate.providers.transport.UpstreamTransport` (an O(1) pool), not
    httpcore's, whose per-request pool scan grew with concurrency (docs/benchmarks.md).
    """
    transport = UpstreamTransport(
        max_connections=max_connections,
        # As many idle as may be open: a cap below the in-flight calls closes connections
        # after every burst and opens them again in the next (at 1,024 client connections
        # ~2 % of the worker went to connecting). Idle ones expire after 30 s.
        max_keepalive_connections=max_connections,
        keepalive_expiry_s=KEEPALIVE_EXPIRY_S,
    )
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        transport=transport,
        follow_redirects=False,
        trust_env=False,
    )
    return register(client, transport)


@contextlib.asynccontextmanager
async def build_providers(
    config: GatewayConfig, *, max_connections: int = 1000
) -> AsyncIterator[dict[str, Provider]]:
    """Providers by kind ("openai", "anthropic", "mock", "azure", LiteLLM's
    OpenAI-compatible names, "gemini", "vertex_ai", "bedrock"); clients closed on exit.

    Args:
        config: the gateway configuration (read for nothing yet but kept so that
            per-kind settings can come from it without changing callers).
        max_connections: per client (per provider kind).
    """
    del config
    async with (
        new_upstream_client(max_connections=max_connections) as openai_client,
        new_upstream_client(max_connections=max_connections) as anthropic_client,
        new_upstream_client(max_connections=max_connections) as azure_client,
        new_upstream_client(max_connections=max_connections) as google_client,
        new_upstream_client(max_connections=max_connections) as bedrock_client,
    ):
        openai = OpenAIProvider(openai_client)
        providers: dict[str, Provider] = {
            "openai": openai,
            "anthropic": AnthropicProvider(anthropic_client),
            "mock": MockProvider(seed=0),
            # Azure OpenAI; LiteLLM's OpenAI-compatible names share the OpenAI provider.
            "azure": AzureProvider(azure_client),
            **dict.fromkeys(OPENAI_COMPATIBLE, openai),
        }
        # The cloud providers: Gemini API, Vertex AI (one token cache per process), Bedrock.
        providers["gemini"] = GeminiProvider(google_client, vertex=False)
        providers["vertex_ai"] = GeminiProvider(google_client, vertex=True)
        providers["bedrock"] = BedrockProvider(bedrock_client)
        yield providers
