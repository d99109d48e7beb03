"""Upstream errors of the cloud providers, said the way the rest of the gateway reads them.

Two kinds need a word: a refused credential that the provider answers with 400 (the
Gemini API's invalid key) is a 401, and a prompt longer than the model takes (each
provider has its own sentence for it) is answered in OpenAI's shape with the code
``context_length_exceeded``, so that routing's context-window fallbacks and the client
both recognise it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import orjson

from triogate.errors import ProviderStatusError

if TYPE_CHECKING:
    from collections.abc import Iterator

_AUTH_MARKERS = ("api key not valid", "api_key_invalid", "unrecognizedclientexception",
                 "security token included in the request is invalid",
                 "signature we calculated does not match")
_CONTEXT_MARKERS = ("exceeds the maximum number of tokens", "input is too long",
                    "too many input tokens", "prompt is too long", "input token count")


def message_of(body: str) -> str:
    """The human message in a Google (``error.message``) or AWS (``message``) error body."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:1000]
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        for key in ("message", "Message"):
            if isinstance(parsed.get(key), str):
                return str(parsed[key])
    return body[:1000]


def normalised(error: ProviderStatusError) -> ProviderStatusError:
    """``error`` with its status and body as the gateway's other providers give them: the
    body always ``{"error": {"message": ...}}`` (AWS sends ``{"message": ...}``)."""
    text = error.body.lower()
    message = message_of(error.body)
    status, code = error.status, None
    if status in (400, 403) and any(m in text for m in _AUTH_MARKERS):
        status = 401
    elif status in (400, 413) and any(m in text for m in _CONTEXT_MARKERS):
        status, code = 400, "context_length_exceeded"
    try:
        parsed = orjson.loads(error.body)
    except orjson.JSONDecodeError:
        parsed = None
    shaped = isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)
    if status == error.status and code is None and shaped:
        return error
    body: dict[str, object] = {"message": message, "type": "invalid_request_error"
                               if 400 <= status < 500 else "upstream_error"}
    if code is not None:
        body.update(param="messages", code=code)
    return ProviderStatusError(status, orjson.dumps({"error": body}), message=str(error))


@contextlib.contextmanager
def cloud_errors() -> Iterator[None]:
    """Re-raise a ProviderStatusError :func:`normalised` (the original as its cause)."""
    try:
        yield
    except ProviderStatusError as exc:
        better = normalised(exc)
        if better is exc:
            raise
        raise better from exc
