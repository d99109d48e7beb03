"""Microsoft Entra ID bearer tokens for Azure OpenAI deployments.

A deployment either gives a static token (``azure_ad_token``) or client credentials
(``tenant_id``, ``client_id``, ``client_secret``): those are exchanged at the token endpoint
(OAuth 2.0 client credentials grant, scope ``https://cognitiveservices.azure.com/.default``)
and the token is kept in this process until shortly before it expires. Requests for the
same credentials while a token is fetched wait for that one fetch. Nothing here touches
Redis: a token fetch happens in the model call, never on the request's Redis path.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import attrs
import orjson
import trio

from triogate.errors import ProviderProtocolError, ProviderStatusError
from triogate.providers.egress import DIRECT, Egress
from triogate.providers.http import map_exceptions, request_timeout

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from triogate.config import AzureSettings

SCOPE = "https://cognitiveservices.azure.com/.default"
#: A token is replaced this long before it expires (or at half its life, if shorter).
REFRESH_MARGIN_S = 300.0
#: Bound of one token request.
TOKEN_TIMEOUT_S = 30.0


@attrs.frozen
class _Token:
    value: str
    refresh_at: float


class AzureTokens:
    """Bearer tokens by credentials, fetched once and refreshed before they expire.

    Args:
        client: the HTTP client for the token endpoint.
        clock: seconds, monotonic (trio's clock by default).
    """

    def __init__(
        self, client: httpx.AsyncClient, *, clock: Callable[[], float] = trio.current_time
    ) -> None:
        self._client = client
        self._clock = clock
        self._tokens: dict[str, _Token] = {}
        self._locks: dict[str, trio.Lock] = {}
        #: Token requests sent (for tests and metrics).
        self.fetches = 0

    async def bearer(self, settings: AzureSettings, egress: Egress = DIRECT) -> str | None:
        """The bearer token for ``settings``, or None when it authenticates by api key.
        The token endpoint is reached the deployment's way out (``egress``: its proxy and
        TLS trust), as the deployment itself is.

        Raises:
            ProviderStatusError: the token endpoint refused the credentials (401).
            ProviderTimeout, ProviderConnectError, ProviderProtocolError.
        """
        if settings.ad_token:
            return settings.ad_token
        if settings.token_url is None:
            return None
        key = hashlib.sha256(
            f"{settings.token_url}\0{settings.client_id}\0{settings.client_secret}".encode()
        ).hexdigest()
        token = self._tokens.get(key)
        if token is not None and self._clock() < token.refresh_at:
            return token.value
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            token = self._tokens.get(key)
            if token is None or self._clock() >= token.refresh_at:
                token = await self._fetch(settings, egress)
                self._tokens[key] = token
        return token.value

    async def _fetch(self, settings: AzureSettings, egress: Egress) -> _Token:
        assert settings.token_url is not None
        form = {"grant_type": "client_credentials", "client_id": settings.client_id or "",
                "client_secret": settings.client_secret or "", "scope": SCOPE}
        self.fetches += 1
        started = self._clock()
        with map_exceptions(), trio.fail_after(TOKEN_TIMEOUT_S):
            response = await self._client.post(
                settings.token_url, data=form, timeout=request_timeout(TOKEN_TIMEOUT_S),
                extensions={"triogate_egress": egress})
            content = await response.aread()
        if response.status_code >= 400:
            text = content.decode(errors="replace")
            if settings.client_secret:
                text = text.replace(settings.client_secret, "***")
            # Refused credentials are the gateway's, not the client's: a 401 (see api.errors).
            raise ProviderStatusError(
                401, text, message=f"Entra ID token request failed ({response.status_code})")
        try:
            body = orjson.loads(content)
            value, lifetime_s = str(body["access_token"]), float(body["expires_in"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ProviderProtocolError("Entra ID token reply has no access_token") from exc
        margin_s = min(REFRESH_MARGIN_S, lifetime_s / 2)
        return _Token(value, started + lifetime_s - margin_s)
