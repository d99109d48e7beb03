"""Vertex AI access tokens: a service account's JWT exchanged by the JWT bearer grant.

The service-account JSON (``vertex_credentials``: the document, or its file's path) gives
``client_email``, ``private_key`` and ``token_uri``. A JWT signed with the key (RS256) is
posted to the token URL (RFC 7523); the access token answered is cached in the process and
fetched again :data:`REFRESH_BEFORE_S` before it expires, so a request waits for the token
endpoint only when the process has none fresh. No Redis is involved.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from triogate.errors import ProviderError, ProviderProtocolError, ProviderStatusError
from triogate.providers.egress import DIRECT, Egress
from triogate.providers.http import map_exceptions, request_timeout

if TYPE_CHECKING:
    from collections.abc import Callable

    import httpx

    from triogate.config_cloud import CloudParams

GOOGLE_TOKEN_URL = "https://oauth2.googleapis.com/token"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
#: A token is fetched again when it has less than this left.
REFRESH_BEFORE_S = 300.0
#: The lifetime asked of the assertion (Google's maximum).
ASSERTION_LIFETIME_S = 3600


def _b64url(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def signed_assertion(account: dict[str, Any], *, audience: str, now: float) -> str:
    """The RS256 JWT asking ``audience`` for a cloud-platform token for ``account``."""
    key = serialization.load_pem_private_key(account["private_key"].encode(), password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("the service account's private_key is not an RSA key")
    header = {"alg": "RS256", "typ": "JWT"}
    if account.get("private_key_id"):
        header["kid"] = str(account["private_key_id"])
    issued = int(now)
    claims = {"iss": account["client_email"], "scope": SCOPE, "aud": audience,
              "iat": issued, "exp": issued + ASSERTION_LIFETIME_S}
    signing_input = _b64url(orjson.dumps(header)) + b"." + _b64url(orjson.dumps(claims))
    signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return (signing_input + b"." + _b64url(signature)).decode()


@attrs.frozen
class _Token:
    value: str
    expires_at: float


class GoogleTokens:
    """Access tokens per service account and token URL, cached for the process.

    Args:
        client: the HTTP client to reach the token endpoint with.
        clock: wall-clock seconds (token lifetimes).
    """

    def __init__(self, client: httpx.AsyncClient, *, clock: Callable[[], float] = time.time
                 ) -> None:
        self._client = client
        self._clock = clock
        self._accounts: dict[str, dict[str, Any]] = {}
        self._tokens: dict[tuple[str, str], _Token] = {}
        self._locks: dict[tuple[str, str], trio.Lock] = {}
        #: Token requests made (for tests: a cached token makes none).
        self.fetches = 0

    async def _account(self, source: str | dict[str, Any]) -> dict[str, Any]:
        if isinstance(source, dict):
            return source
        account = self._accounts.get(source)
        if account is None:
            text = source
            if not source.lstrip().startswith("{"):
                try:
                    text = await trio.Path(source).read_text()
                except OSError as exc:
                    raise ProviderError(
                        f"cannot read vertex_credentials file: {exc.strerror}") from None
            try:
                account = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise ProviderError("vertex_credentials is not a JSON document") from None
            if not isinstance(account, dict) or not {"client_email", "private_key"} <= set(
                    account):
                raise ProviderError("vertex_credentials has no client_email and private_key")
            self._accounts[source] = account
        return account

    async def token(self, cloud: CloudParams, *, timeout_s: float,
                    egress: Egress = DIRECT) -> str:
        """A fresh access token for ``cloud``'s service account (a checkpoint), the token
        endpoint reached through ``egress`` (the deployment's proxy and TLS trust).

        Raises:
            ProviderStatusError: the token endpoint refused (401 for the client's view).
            ProviderError: unreadable credentials; ProviderTimeout, ProviderConnectError.
        """
        assert cloud.vertex_credentials is not None
        account = await self._account(cloud.vertex_credentials)
        url = cloud.vertex_token_url or str(account.get("token_uri") or GOOGLE_TOKEN_URL)
        key = (str(account["client_email"]), url)
        token = self._tokens.get(key)
        if token is not None and token.expires_at - REFRESH_BEFORE_S > self._clock():
            return token.value
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:  # one fetch per account at a time; the others take its token
            token = self._tokens.get(key)
            if token is not None and token.expires_at - REFRESH_BEFORE_S > self._clock():
                return token.value
            token = await self._fetch(account, url, timeout_s, egress)
            self._tokens[key] = token
            return token.value

    async def _fetch(self, account: dict[str, Any], url: str, timeout_s: float,
                     egress: Egress) -> _Token:
        now = self._clock()
        try:
            # Google's endpoint wants its own URL as the audience, wherever it is reached.
            assertion = signed_assertion(account, audience=GOOGLE_TOKEN_URL, now=now)
        except (ValueError, TypeError, KeyError) as exc:
            raise ProviderError(f"vertex_credentials private_key is unusable: {exc}") from None
        self.fetches += 1
        with map_exceptions(), trio.fail_after(timeout_s):
            response = await self._client.post(
                url, data={"grant_type": JWT_BEARER, "assertion": assertion},
                timeout=request_timeout(timeout_s), extensions={"triogate_egress": egress})
            content = await response.aread()
        if response.status_code >= 400:
            # The endpoint's text only (it never echoes the assertion's key).
            raise ProviderStatusError(401, content, message="the Google token endpoint refused "
                                      f"the service account ({response.status_code})")
        try:
            answer = orjson.loads(content)
            value, lifetime = str(answer["access_token"]), float(answer.get("expires_in", 3600))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ProviderProtocolError("the Google token endpoint's answer has no "
                                        "access_token") from exc
        return _Token(value=value, expires_at=now + lifetime)
