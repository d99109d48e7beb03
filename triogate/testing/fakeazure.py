"""A fake Azure OpenAI resource and Entra ID token endpoint, on real HTTP, for tests.

It speaks Azure's wire format as its REST reference describes it: deployments addressed
in the path (``POST /openai/deployments/{deployment}/chat/completions`` and
``/embeddings``), a required ``api-version`` query parameter, the key in an ``api-key``
header or an Entra ID bearer token, Azure's error bodies (``{"error": {"code": ...,
"message": ...}}``, the content filter's ``content_filter`` code with its
``innererror``), ``prompt_filter_results`` and ``content_filter_results`` in answers, and
a first stream chunk with no choices. Answers themselves are the fake upstream's
(:mod:`.fakeupstream`), so usage is counted in words.

The token endpoint, ``POST /{tenant}/oauth2/v2.0/token``, grants client credentials
(form-encoded) with tokens that expire after ``token_lifetime_s``; an expired or unknown
token is refused with 401.

In tests::

    async with open_fake_azure(deployments={"gpt-4o-prod"}, api_key="k") as azure:
        azure.fail_next("throttle")
        ... azure.base_url ...
"""

from __future__ import annotations

import contextlib
import itertools
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import attrs
import orjson
import trio

from triogate.testing.asgi import read_body, send_json, serving
from triogate.testing.fakeupstream import (
    FakeUpstream,
    ReceivedRequest,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.asgi import Receive, Scope, Send

_FILTERED = {"hate": {"filtered": False, "severity": "safe"},
             "self_harm": {"filtered": False, "severity": "safe"},
             "sexual": {"filtered": False, "severity": "safe"},
             "violence": {"filtered": False, "severity": "safe"}}

#: Error bodies Azure answers, by the kind a test asks for: (status, body, headers).
ERRORS: dict[str, tuple[int, dict[str, Any], list[tuple[bytes, bytes]]]] = {
    "auth": (401, {"error": {"code": "401", "message": "Access denied due to invalid "
                             "subscription key or wrong API endpoint. Make sure to provide a "
                             "valid key for an active subscription and use a correct "
                             "regional API endpoint for your resource."}}, []),
    "throttle": (429, {"error": {"code": "429", "message": "Requests to the ChatCompletions_"
                                 "Create Operation under Azure OpenAI API version 2024-10-21 "
                                 "have exceeded token rate limit of your current OpenAI S0 "
                                 "pricing tier. Please retry after 1 second."}},
                 [(b"retry-after", b"1"), (b"retry-after-ms", b"1000")]),
    "context_length": (400, {"error": {
        "message": "This model's maximum context length is 128000 tokens. However, your "
                   "messages resulted in 130511 tokens. Please reduce the length of the "
                   "messages.", "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"}}, []),
    "content_filter": (400, {"error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
                   "content management policy. Please modify your prompt and retry.",
        "type": None, "param": "prompt", "code": "content_filter", "status": 400,
        "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {
            **_FILTERED, "violence": {"filtered": True, "severity": "high"}}}}}, []),
    "server": (500, {"error": {"code": "InternalServerError", "message": "The service is "
                               "temporarily unable to process your request. Please try "
                               "again later."}}, []),
}


@attrs.define(eq=False, kw_only=True)
class FakeAzure:
    """The fake resource's state and controls; it is also the ASGI app.

    Attributes:
        deployments: the deployment names that exist (others answer DeploymentNotFound).
        api_key: the resource key accepted in ``api-key``.
        static_tokens: bearer tokens always accepted (as a static ``azure_ad_token``).
        client_id, client_secret: the credentials the token endpoint grants.
        token_lifetime_s: ``expires_in`` of granted tokens.
        requests, token_requests: what the resource and the token endpoint received.
    """

    deployments: set[str]
    api_key: str = "azure-resource-key"
    static_tokens: set[str] = attrs.Factory(set)
    client_id: str = "client-id"
    client_secret: str = "client-secret"
    token_lifetime_s: float = 3600.0
    base_url: str = ""
    requests: list[ReceivedRequest] = attrs.Factory(list)
    token_requests: list[dict[str, str]] = attrs.Factory(list)
    _tokens: dict[str, float] = attrs.Factory(dict)
    _failures: list[str] = attrs.Factory(list)
    _answers: FakeUpstream = attrs.Factory(FakeUpstream)
    _serial: itertools.count[int] = attrs.Factory(itertools.count)

    def fail_next(self, kind: str, n: int = 1) -> None:
        """Answer the next ``n`` API requests with the error ``kind`` (see ``ERRORS``)."""
        self._failures.extend([kind] * n)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._answers(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        raw = await read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        path = scope["path"]
        if path.endswith("/oauth2/v2.0/token"):
            await self._token(raw, headers, send)
            return
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        self.requests.append(ReceivedRequest(method=scope["method"], path=path, query=query,
                                             headers=headers, json=body))
        await self._api(scope["method"], path, query, headers, body, receive, send)

    async def _api(self, method: str, path: str, query: dict[str, str],
                   headers: dict[str, str], body: Any, receive: Receive, send: Send) -> None:
        parts = path.strip("/").split("/")
        route = "/".join(parts[3:])
        if method != "POST" or parts[:2] != ["openai", "deployments"] or len(parts) < 4 or (
                route not in ("chat/completions", "embeddings")):
            await _error(send, 404, {"error": {"code": "404", "message": "Resource not found"}})
            return
        if not query.get("api-version"):
            await _error(send, 404, {"error": {"code": "404", "message": "Resource not found"}})
            return
        if not self._authorised(headers):
            status, error, extra = ERRORS["auth"]
            await _error(send, status, error, extra)
            return
        deployment = parts[2]
        if deployment not in self.deployments:
            await _error(send, 404, {"error": {
                "code": "DeploymentNotFound", "message": "The API deployment for this "
                "resource does not exist. If you created the deployment within the last 5 "
                "minutes, please wait a moment and try again."}})
            return
        if not isinstance(body, dict):
            await _error(send, 400, {"error": {"code": "BadRequest",
                                               "message": "the body is not a JSON object"}})
            return
        if self._failures:
            status, error, extra = ERRORS[self._failures.pop(0)]
            await _error(send, status, error, extra)
            return
        body = {**body, "model": deployment}  # Azure answers with the deployment's model
        if route == "embeddings":
            await self._answers._embeddings(body, receive, send)
        else:
            await self._answers._chat(body, receive, _AzureAnswer(send))

    def _authorised(self, headers: dict[str, str]) -> bool:
        if "api-key" in headers:
            return headers["api-key"] == self.api_key
        token = headers.get("authorization", "").removeprefix("Bearer ")
        if token in self.static_tokens:
            return True
        expires = self._tokens.get(token)
        return expires is not None and trio.current_time() < expires

    async def _token(self, raw: bytes, headers: dict[str, str], send: Send) -> None:
        form = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
        self.token_requests.append(form)
        if "application/x-www-form-urlencoded" not in headers.get("content-type", ""):
            await send_json(send, 400, {"error": "invalid_request",
                                         "error_description": "AADSTS900144: form body "
                                         "expected"})
            return
        if form.get("grant_type") != "client_credentials" or not form.get("scope"):
            await send_json(send, 400, {"error": "invalid_request",
                                         "error_description": "AADSTS900144: The request "
                                         "body must contain grant_type and scope."})
            return
        if form.get("client_id") != self.client_id or form.get(
                "client_secret") != self.client_secret:
            await send_json(send, 401, {"error": "invalid_client",
                                         "error_description": "AADSTS7000215: Invalid client "
                                         "secret provided."})
            return
        token = f"entra-token-{next(self._serial)}"
        self._tokens[token] = trio.current_time() + self.token_lifetime_s
        lifetime = int(self.token_lifetime_s)
        await send_json(send, 200, {"token_type": "Bearer", "expires_in": lifetime,
                                     "ext_expires_in": lifetime, "access_token": token})


class _AzureAnswer:
    """Wraps ``send``: adds Azure's filter results to an answer of the fake upstream."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._start: dict[str, Any] | None = None
        self._streaming = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._start = message
            self._streaming = (b"content-type", b"text/event-stream") in message["headers"]
            if self._streaming:
                await self._send(message)
                first = {"id": "", "object": "", "created": 0, "model": "", "choices": [],
                         "prompt_filter_results": [{"prompt_index": 0,
                                                    "content_filter_results": _FILTERED}]}
                await self._send({"type": "http.response.body", "more_body": True,
                                  "body": b"data: " + orjson.dumps(first) + b"\n\n"})
            return
        if self._streaming or self._start is None:
            await self._send(message)
            return
        answer = orjson.loads(message["body"])
        answer["prompt_filter_results"] = [{"prompt_index": 0,
                                            "content_filter_results": _FILTERED}]
        for choice in answer.get("choices") or ():
            choice["content_filter_results"] = _FILTERED
        payload = orjson.dumps(answer)
        headers = [(k, v) for k, v in self._start["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(payload)).encode()))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": payload})


async def _error(send: Send, status: int, body: dict[str, Any],
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send_json(send, status, body, [(b"apim-request-id", b"fake"), *(headers or [])])


@contextlib.asynccontextmanager
async def open_fake_azure(host: str = "127.0.0.1", **settings: Any) -> AsyncIterator[FakeAzure]:
    """Serve a :class:`FakeAzure` in a nursery of the caller's task; stop on exit."""
    async with serving(FakeAzure(**settings), host) as azure:
        yield azure
