"""Server-sent events in each API's framing.

OpenAI chat completions: ``data: {json}`` per chunk and a final ``data: [DONE]``.
Anthropic messages and OpenAI responses: ``event: <type>`` + ``data: {json}`` per event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from triogate.api.errors import ApiError
    from triogate.providers.records import Api

DONE = b"data: [DONE]\n\n"


def encode(api: Api, event: dict[str, Any]) -> bytes:
    """One event as it goes on the wire."""
    data = orjson.dumps(event)
    if api == "chat":
        return b"data: " + data + b"\n\n"
    return b"event: " + str(event.get("type", "message")).encode() + b"\ndata: " + data + b"\n\n"


def end(api: Api) -> bytes:
    """What closes a stream (only chat completions have a terminator)."""
    return DONE if api == "chat" else b""


def error(api: Api, exc: ApiError) -> bytes:
    """An error after the stream started (the status line has already gone out)."""
    if api == "messages":
        body = {"type": "error", "error": {"type": exc.error_type, "message": exc.message}}
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
    payload = {"error": {"message": exc.message, "type": exc.error_type, "param": None,
                         "code": exc.code}}
    if api == "responses":
        return b"event: error\ndata: " + orjson.dumps({"type": "error", **payload}) + b"\n\n"
    return b"data: " + orjson.dumps(payload) + b"\n\n"
