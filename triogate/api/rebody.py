"""A request whose JSON body a route rewrites before the model flow reads it.

The Azure-style routes take the model from the path; legacy completions arrive in
another shape. Both hand the ordinary handlers a request whose ``json()`` answers the
rewritten body; everything else (headers, key, disconnects) is the client's request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

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
