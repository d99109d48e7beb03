"""What every provider is: the Provider protocol, its records, and the HTTP boundary.

A provider takes a request body in the *client's* API shape (``api``), calls its upstream
in whatever shape that upstream speaks (translating through :mod:`.translate` when they
differ), and answers in the client's shape again. Every provider raises only
:class:`triogate.errors.ProviderError` subclasses; :func:`map_exceptions` is the one place
where httpx's exceptions become ours.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import httpx
import orjson
import trio

from triogate.errors import (
    ProviderConnectError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
)
from triogate.providers.tokens import count_output_tokens, estimate_input_tokens
from triogate.providers.transport import CONNECT_TIMEOUT_S, transport_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Mapping
    from contextlib import AbstractAsyncContextManager

    from triogate.config import Deployment
    from triogate.providers.translate import Hub

Api = Literal["chat", "messages", "responses", "embeddings"]
APIS: tuple[Api, ...] = ("chat", "messages", "responses", "embeddings")


#: Request fields that mean something to the gateway only; never sent upstream.
GATEWAY_ONLY_FIELDS = frozenset({"mock_response"})


@attrs.frozen(kw_only=True)
class Usage:
    """Tokens of one call. ``reported`` is False when triogate counted them itself."""

    input_tokens: int
    output_tokens: int
    reported: bool = True

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_chat(self) -> dict[str, int]:
        """The ``usage`` object of an OpenAI chat completion."""
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
        }

    def to_messages(self) -> dict[str, int]:
        """The ``usage`` object of an Anthropic message."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def to_responses(self) -> dict[str, Any]:
        """The ``usage`` object of an OpenAI Responses API response."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_chat(cls, usage: Any) -> Usage | None:
        """Parse an OpenAI ``usage`` object; None when absent or malformed."""
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        return cls(input_tokens=prompt, output_tokens=completion)

    @classmethod
    def from_messages(cls, usage: Any) -> Usage | None:
        """Parse an Anthropic ``usage`` object (cache reads and writes count as input)."""
        if not isinstance(usage, dict):
            return None
        inputs, outputs = usage.get("input_tokens"), usage.get("output_tokens")
        if not isinstance(inputs, int) or not isinstance(outputs, int):
            return None
        cached = sum(
            v
            for k in ("cache_creation_input_tokens", "cache_read_input_tokens")
            if isinstance(v := usage.get(k), int)
        )
        return cls(input_tokens=inputs + cached, output_tokens=outputs)


@attrs.frozen(kw_only=True)
class Completion:
    """A whole (non-streamed) answer, already in the client's API shape."""

    body: dict[str, Any]
    usage: Usage


class ProviderStream(Protocol):
    """Async iterator of events in the client's API shape (dicts).

    ``usage`` is the upstream's report once seen, else what triogate counted so far: it
    is meaningful mid-stream and after the client went away.
    """

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...

    def next_nowait(self) -> dict[str, Any] | None:
        """The next event if no read is needed for it, else None (not a checkpoint)."""
        ...

    @property
    def usage(self) -> Usage: ...


class Provider(Protocol):
    """An upstream model provider (OpenAI-compatible, Anthropic, mock)."""

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """Call the upstream and return the whole answer (a checkpoint)."""
        ...

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> AbstractAsyncContextManager[ProviderStream]:
        """Open a streamed call; leaving the context closes the upstream response."""
        ...


# --------------------------------------------------------------------------- the boundary


@contextlib.contextmanager
def map_exceptions() -> Iterator[None]:
    """Turn transport and parsing failures into ProviderError subclasses.

    Messages carry the exception's own text (httpx never puts request headers, hence
    never the api key, in it) and the original stays reachable as ``__cause__``.
    """
    try:
        yield
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
        if name.lower() in ("authorization", "x-api-key", "api-key"):
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
) -> dict[str, Any]:
    """POST ``body`` as JSON and return the JSON object answered (a checkpoint).

    ``timeout_s`` bounds the whole call (trio deadline), not just each read.

    Raises:
        ProviderTimeout, ProviderConnectError, ProviderStatusError, ProviderProtocolError.
    """
    fast = transport_of(client)
    with map_exceptions(), trio.fail_after(timeout_s):
        if fast is not None:  # the gateway's own client: skip httpx's client layers
            status, content = await fast.post(
                url, headers={"content-type": "application/json", **headers},
                content=orjson.dumps(body), timeout_s=timeout_s,
            )
        else:
            response = await client.post(
                url,
                content=orjson.dumps(body),
                headers={"content-type": "application/json", **headers},
                timeout=request_timeout(timeout_s),
            )
            status, content = response.status_code, response.content
    if status >= 400:
        raise upstream_status_error(status, content, headers)
    return parse_json_object(content)


# Upstream JSON of the wrong shape (a list where an object belongs, ...) fails inside the
# translators with one of these; at the boundary it is the upstream's protocol error.
SHAPE_ERRORS = (KeyError, TypeError, AttributeError, IndexError)


async def complete_via_hub(
    client: httpx.AsyncClient,
    hub: Hub,
    api: Api,
    body: Mapping[str, Any],
    deployment: Deployment,
    *,
    url: str,
    headers: Mapping[str, str],
    created_s: int,
) -> Completion:
    """One non-streamed call through an upstream speaking ``hub`` (a checkpoint).

    The request is translated to the hub's shape, sent with the deployment's model and
    timeout, and the answer translated back. Usage the upstream did not report is
    counted (``reported=False``).

    Raises:
        ValueError: the request cannot be expressed in the hub's API (a client error).
        ProviderError: any upstream failure (see :func:`map_exceptions`).
    """
    request = upstream_body(hub.request(api, body, stream=False), deployment)
    response = await post_json(
        client, url, headers=headers, body=request, timeout_s=deployment.timeout_s
    )
    try:
        usage = hub.reported_usage(response) or Usage(
            input_tokens=estimate_input_tokens(api, body),
            output_tokens=count_output_tokens(hub.output_text(response)),
            reported=False,
        )
        out = hub.response(api, response, request=body, usage=usage, created_s=created_s)
    except SHAPE_ERRORS as exc:
        raise ProviderProtocolError(f"upstream reply has an unexpected shape: {exc!r}") from exc
    return Completion(body=out, usage=usage)
