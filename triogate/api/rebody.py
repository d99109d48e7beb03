"""A request whose JSON body a route rewrites before the model flow reads it.

The Azure-style routes take the model from the path; legacy completions arrive in
another shape. Both hand the ordinary handlers a request whose ``json()`` answers the
rewritten body; everything else (headers, key, disconnects) is the client's request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import trio

if TYPE_CHECKING:
    from collections.abc import Callable

    from triogate.api.http import Request


class _Rebodied:
    def __init__(self, request: Request, rewrite: Callable[[dict[str, Any]], dict[str, Any]]
                 ) -> None:
        self._request = request
        self._rewrite = rewrite

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)

    async def json(self, max_bytes: int) -> dict[str, Any]:
        return self._rewrite(await self._request.json(max_bytes))


def rebodied(request: Request, rewrite: Callable[[dict[str, Any]], dict[str, Any]]
             ) -> Request:
    """``request`` with its JSON body passed through ``rewrite`` (which may raise ApiError)."""
    return cast("Request", _Rebodied(request, rewrite))


class _WithBody:
    def __init__(self, request: Request, body: dict[str, Any]) -> None:
        self._request = request
        self._body = body

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)

    async def json(self, max_bytes: int) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return dict(self._body)


def with_body(request: Request, body: dict[str, Any]) -> Request:
    """``request`` whose ``json()`` answers ``body`` (already read). Attributes set on the
    result (``trace_id``, ``authenticated``) are its own; the rest is ``request``'s."""
    return cast("Request", _WithBody(request, body))
