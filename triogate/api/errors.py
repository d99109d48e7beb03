"""Errors in each API's own shape: the only code that knows what a 429 looks like.

OpenAI::    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
Anthropic:: {"type": "error", "error": {"type": ..., "message": ...}}

Handlers raise :class:`ApiError` for what the client did wrong; rejections
(:class:`~triogate.governance.decisions.Rejected`) and provider failures are mapped here.
Nothing rendered here carries a stack trace, a key or a prompt.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import orjson

from triogate.errors import (
    ProviderConnectError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.governance.decisions import Rejected

Style = Literal["openai", "anthropic"]

_DEFAULT_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "service_unavailable",
    504: "timeout",
}


class ApiError(Exception):
    """Raised by handlers for a request that cannot be served; rendered, never logged as a bug.

    Args:
        status: HTTP status.
        message: what the client is told (precise, no secrets).
        error_type: the error ``type``; defaults from the status.
        code, param: OpenAI's optional fields.
        headers: extra response headers (``retry-after``, …).
    """

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or _DEFAULT_TYPES.get(status, "api_error")
        self.code = code
        self.param = param
        self.headers = dict(headers or {})


def render(error: ApiError, style: Style) -> bytes:
    """The error body in ``style``."""
    if style == "anthropic":
        return orjson.dumps(
            {"type": "error", "error": {"type": error.error_type, "message": error.message}}
        )
    return orjson.dumps(
        {
            "error": {
                "message": error.message,
                "type": error.error_type,
                "param": error.param,
                "code": error.code if error.code is not None else str(error.status),
            }
        }
    )


def from_rejection(rejected: Rejected) -> ApiError:
    """A check's refusal as an API error (``Retry-After`` in whole seconds, rounded up)."""
    headers = dict(rejected.headers)
    if rejected.retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(rejected.retry_after_s)))
    return ApiError(
        rejected.status,
        rejected.message,
        rejected.error_type,
        code=rejected.reason,
        headers=headers,
    )


def from_provider(exc: ProviderError) -> ApiError:
    """An upstream failure, after retries and fallbacks, as the client should see it.

    Upstream 429 stays 429 and other request errors (400, 404, 413, 422) pass through with
    the upstream's message: they are about the request. The upstream refusing the
    gateway's own credentials (401/403) is not the client's fault: 502.
    """
    if isinstance(exc, ProviderTimeout):
        return ApiError(504, "the upstream model did not answer in time", "timeout")
    if isinstance(exc, ProviderConnectError):
        return ApiError(502, "could not reach the upstream model", "api_error")
    if isinstance(exc, ProviderProtocolError):
        return ApiError(502, "the upstream model sent a reply that could not be read", "api_error")
    if isinstance(exc, ProviderStatusError):
        message = _upstream_message(exc.body) or str(exc)
        if exc.status == 429:
            return ApiError(429, f"upstream rate limit: {message}", "rate_limit_error",
                            code="upstream_rate_limited")
        if exc.status in (401, 403):
            return ApiError(502, "the upstream model refused the gateway's credentials",
                            "api_error", code="upstream_auth_failed")
        if 400 <= exc.status < 500:
            # Azure's content filter keeps its code, as OpenAI's clients know it.
            code = "content_filter" if '"content_filter"' in exc.body else "upstream_error"
            return ApiError(exc.status, message, _DEFAULT_TYPES.get(exc.status,
                            "invalid_request_error"), code=code)
        return ApiError(502, f"upstream error {exc.status}: {message}", "api_error",
                        code="upstream_error")
    return ApiError(502, "the upstream model call failed", "api_error")


def _upstream_message(body: str) -> str | None:
    """The message inside an OpenAI- or Anthropic-shaped error body, if there is one."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:500] or None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:1000]
    return None
