"""Comma-separated models on ``/chat/completions`` (``"model": "gpt-4o,claude"``): one
answer per model, as LiteLLM's proxy returns them (a JSON array, in the order named).

Each model is its own request in every other respect: its own admission (key access,
budgets, limits), its own upstream call, its own spend row and request id. They run at
once, as tasks of this request. An answer that failed is its error object in the array;
when every one failed, the first error is the response. Streaming is refused (LiteLLM
streams only one model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import trio

from triogate.api import auth
from triogate.api.errors import ApiError, render
from triogate.api.flow import SettledAfter
from triogate.api.http import Response, new_request_id
from triogate.api.rebody import with_body

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Receive, Request, Send
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]

#: Most models one request may name.
MAX_MODELS = 8


def models_of(body: dict[str, Any]) -> list[str] | None:
    """The models of a comma-separated ``model``, or None for a single model."""
    model = body.get("model")
    if not isinstance(model, str) or "," not in model:
        return None
    names = [m.strip() for m in model.split(",")]
    if not all(names) or len(names) > MAX_MODELS:
        raise ApiError(400, f"field 'model' must name 1 to {MAX_MODELS} models, separated "
                       "by commas, none empty", param="model")
    return list(dict.fromkeys(names))


async def fan_out(services: Services, request: Request, body: dict[str, Any],
                  names: list[str], handler: Handler) -> Response:
    """One answer per model of ``names`` (each through ``handler``), as a JSON array."""
    if body.get("stream"):
        raise ApiError(400, "a comma-separated model list cannot be streamed",
                       param="stream")
    # The key first: a wrong key is one 401, not one per model.
    await auth.authenticate_only(services, request)
    answers: list[Any] = [None] * len(names)
    errors: list[ApiError | None] = [None] * len(names)
    parts: list[Response] = []

    async def one(i: int, name: str) -> None:
        sub = with_body(request, {**body, "model": name})
        sub.trace_id = new_request_id()  # its own request id, spend row and trace
        sub.authenticated = True
        sub.watch_disconnect = False  # the parts run at once on one connection
        try:
            response = await handler(services, sub)
            parts.append(response)
            answers[i] = orjson.loads(response.body)
        except ApiError as exc:
            errors[i] = exc
            answers[i] = orjson.loads(render(exc, "openai"))

    try:
        async with trio.open_nursery() as nursery:
            for i, name in enumerate(names):
                nursery.start_soon(one, i, name)
        first = errors[0]
        if first is not None and all(e is not None for e in errors):
            raise first
    except BaseException:
        _settle(parts)  # nothing will be sent: the answers that came settle now
        raise
    return _Answers(orjson.dumps(answers), parts)


def _settle(parts: list[Response]) -> None:
    for part in parts:
        if isinstance(part, SettledAfter):
            part.settle()


class _Answers(Response):
    """The array of answers; each model's request settles once it is written, as a
    single answer does (``flow.SettledAfter``)."""

    def __init__(self, body: bytes, parts: list[Response]) -> None:
        super().__init__(body)
        self._parts = parts

    async def send(self, send: Send, receive: Receive, *, head: bool = False) -> None:
        try:
            await super().send(send, receive, head=head)
        finally:  # sync: nothing can cancel it half-way
            _settle(self._parts)
