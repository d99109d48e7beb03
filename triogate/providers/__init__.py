"""Upstream model providers: OpenAI-compatible, Anthropic, the clouds', and a mock.

Every provider implements :class:`triogate.providers.records.Provider`. :func:`build_providers`
creates them with one pooled httpx client per provider kind, for the app nursery to own.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import httpx

from triogate.config import OPENAI_COMPATIBLE
from triogate.providers.anthropic import AnthropicProvider
from triogate.providers.azure import AzureProvider
from triogate.providers.bedrock import BedrockProvider
from triogate.providers.egress import EnvironmentProxies
from triogate.providers.gemini import GeminiProvider
from triogate.providers.http1 import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_EVENT_BYTES
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


def new_upstream_client(
    *, max_connections: int, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    environment: EnvironmentProxies | None = None, cert_file: str | None = None,
) -> httpx.AsyncClient:
    """An httpx client fit for LLM upstreams.

    httpx's defaults (5 s timeout, 20 keep-alive connections) suit web APIs, not long
    generations under bursts. HTTP/1.1 only; no content coding is asked for (a coded
    answer is refused, not inflated). Proxies and TLS trust come from ``environment``
    and ``cert_file`` (read by the caller, once) and each request's egress, not from
    httpx's ``trust_env``. The transport under it is
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
        max_body_bytes=max_body_bytes,
        max_event_bytes=max_event_bytes,
        environment=environment,
        cert_file=cert_file,
    )
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        headers={"accept-encoding": "identity"},
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
        config: the gateway configuration (``triogate.http``'s upstream bounds).
        max_connections: per client (per provider kind).

    The environment's proxies (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``) and
    ``SSL_CERT_FILE`` are read here, once.
    """
    http = config.settings.http
    options = {
        "max_connections": max_connections,
        "max_body_bytes": http.max_upstream_body_bytes,
        "max_event_bytes": http.max_upstream_event_bytes,
        "environment": EnvironmentProxies(os.environ),
        "cert_file": os.environ.get("SSL_CERT_FILE") or None,
    }
    async with (
        new_upstream_client(**options) as openai_client,  # type: ignore[arg-type]
        new_upstream_client(**options) as anthropic_client,  # type: ignore[arg-type]
        new_upstream_client(**options) as azure_client,  # type: ignore[arg-type]
        new_upstream_client(**options) as google_client,  # type: ignore[arg-type]
        new_upstream_client(**options) as bedrock_client,  # type: ignore[arg-type]
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
