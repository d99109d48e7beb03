"""The HTTP boundary: one upstream POST, whole or streamed, and its failures mapped.

Every provider raises only :class:`triogate.errors.ProviderError` subclasses;
:func:`map_exceptions` is the one place where httpx's exceptions become ours.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import trio

from triogate.errors import (
    ProviderConnectError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
)
from triogate.providers.egress import DIRECT, Egress
from triogate.providers.http1 import DEFAULT_MAX_BODY_BYTES, UpstreamFramingError
from triogate.providers.records import GATEWAY_ONLY_FIELDS
from triogate.providers.transport import CONNECT_TIMEOUT_S, transport_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping

    from triogate.config import Deployment


def egress_of(deployment: Deployment) -> Egress:
    """The deployment's proxy and TLS verification."""
    if deployment.proxy is None and deployment.ssl_verify is True:
        return DIRECT
    return Egress(deployment.proxy, deployment.ssl_verify)


@contextlib.contextmanager
def map_exceptions() -> Iterator[None]:
    """Turn transport and parsing failures into ProviderError subclasses.

    Messages carry the exception's own text (httpx never puts request headers, hence
    never the api key, in it) and the original stays reachable as ``__cause__``.
    """
    try:
        yield
    except UpstreamFramingError as exc:  # framing, size, coding: the reply cannot be read
        raise ProviderProtocolError(f"upstream reply is not valid: {exc}") from exc
    except (httpx.TimeoutException, trio.TooSlowError) as exc:
        raise ProviderTimeout(f"upstream timed out: {type(exc).__name__} {exc}") from exc
    except (httpx.TransportError, trio.BrokenResourceError, OSError) as exc:
        # ConnectError, ReadError, WriteError, RemoteProtocolError, ... (TimeoutException
        # is a TransportError too, but is caught above).
        raise ProviderConnectError(
            f"upstream connection failed: {type(exc).__name__} {exc}"
        ) from exc
    except (httpx.DecodingError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProviderProtocolError(f"upstream reply is not valid: {exc}") from exc


def parse_json_object(content: bytes) -> dict[str, Any]:
    """Decode an upstream JSON body that must be an object.

    Raises:
        ProviderProtocolError: not JSON, or JSON but not an object.
    """
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise ProviderProtocolError(f"upstream reply is not JSON: {content[:200]!r}") from exc
    if not isinstance(value, dict):
        raise ProviderProtocolError(f"upstream reply is not a JSON object: {content[:200]!r}")
    return value


def upstream_body(hub_request: Mapping[str, Any], deployment: Deployment) -> dict[str, Any]:
    """The body to send: the group's model name replaced by the deployment's model."""
    body = {k: v for k, v in hub_request.items() if k not in GATEWAY_ONLY_FIELDS}
    body["model"] = deployment.upstream_model
    return body


def upstream_status_error(
    status: int, content: bytes, headers: Mapping[str, str]
) -> ProviderStatusError:
    """The upstream's error, its text kept, with our credentials blanked out.

    Some upstreams echo the key they refused (or part of it) in the error text; the
    error travels to logs and clients, the key must not.
    """
    text = content.decode(errors="replace")
    for name, value in headers.items():
        if name.lower() in ("authorization", "x-api-key", "api-key", "x-goog-api-key"):
            secret = value.removeprefix("Bearer ").strip()
            if secret:
                text = text.replace(secret, "***")
    return ProviderStatusError(status, text)


def request_timeout(seconds: float) -> httpx.Timeout:
    """httpx timeouts for one request: connect bounded apart, ``seconds`` for the rest.

    For streams ``seconds`` bounds each wait *between* chunks (httpx's read timeout),
    not the whole stream: a long generation that keeps sending is healthy.
    """
    return httpx.Timeout(seconds, connect=min(CONNECT_TIMEOUT_S, seconds))


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    timeout_s: float,
    egress: Egress = DIRECT,
) -> dict[str, Any]:
    """POST ``body`` as JSON and return the JSON object answered (a checkpoint).

    ``timeout_s`` bounds the whole call (trio deadline), not just each read.

    Raises:
        ProviderTimeout, ProviderConnectError, ProviderStatusError, ProviderProtocolError.
    """
    fast = transport_of(client)
    if fast is not None:  # the gateway's own client: skip httpx's layers (bounds itself)
        with map_exceptions():
            status, content = await fast.post(
                url, headers={"content-type": "application/json", **headers},
                content=orjson.dumps(body), timeout_s=timeout_s, egress=egress,
            )
    else:  # another transport (a test's): its decoded body is bounded all the same
        with map_exceptions(), trio.fail_after(timeout_s):
            request = client.build_request(
                "POST", url, content=orjson.dumps(body),
                headers={"content-type": "application/json", **headers},
                timeout=request_timeout(timeout_s), extensions={"triogate_egress": egress})
            response = await client.send(request, stream=True)
            try:
                status = response.status_code
                content = await read_bounded(response, DEFAULT_MAX_BODY_BYTES)
            finally:
                await response.aclose()
    if status >= 400:
        raise upstream_status_error(status, content, headers)
    return parse_json_object(content)


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    """``response``'s (decoded) body, refused past ``limit`` bytes."""
    parts: list[bytes] = []
    total = 0
    async for part in response.aiter_bytes():
        total += len(part)
        if total > limit:
            raise UpstreamFramingError(f"upstream body larger than {limit} bytes")
        parts.append(part)
    return b"".join(parts)


# Upstream JSON of the wrong shape (a list where an object belongs, ...) fails inside the
# translators with one of these; at the boundary it is the upstream's protocol error.
SHAPE_ERRORS = (KeyError, TypeError, AttributeError, IndexError)


@contextlib.contextmanager
def reply_shape() -> Iterator[None]:
    """Where an upstream reply is read: a reply of the wrong shape (see ``SHAPE_ERRORS``)
    raises ProviderProtocolError."""
    try:
        yield
    except SHAPE_ERRORS as exc:
        raise ProviderProtocolError(f"upstream reply has an unexpected shape: {exc!r}") from exc


@contextlib.asynccontextmanager
async def open_sse_response(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    timeout_s: float,
    egress: Egress = DIRECT,
) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and yield the streaming response once its status is known good.

    Leaving the block closes the response: a body not read to its end drops the
    connection instead of returning it to the pool half-read.

    Raises:
        ProviderStatusError: the upstream answered an error status (its body attached).
        ProviderTimeout, ProviderConnectError: as :func:`map_exceptions`.
    """
    all_headers = {"content-type": "application/json", "accept": "text/event-stream",
                   **headers}
    fast = transport_of(client)
    with map_exceptions():
        if fast is not None:  # the gateway's own client: skip httpx's layers (as post_json)
            response = await fast.open_stream(url, headers=all_headers,
                                              content=orjson.dumps(body), timeout_s=timeout_s,
                                              egress=egress)
        else:
            request = client.build_request("POST", url, content=orjson.dumps(body),
                                           headers=all_headers,
                                           timeout=request_timeout(timeout_s),
                                           extensions={"triogate_egress": egress})
            response = await client.send(request, stream=True)
    try:
        if response.status_code >= 400:
            limit = fast.max_body_bytes if fast is not None else DEFAULT_MAX_BODY_BYTES
            with map_exceptions():
                content = await read_bounded(response, limit)
            raise upstream_status_error(response.status_code, content, headers)
        yield response
    finally:
        await response.aclose()
