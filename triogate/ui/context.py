"""What a view gets: the services, the request, who is signed in, the CSRF token, the form."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, final

import attrs

from triogate.api.http import Response
from triogate.ui import session as sess
from triogate.ui.html import Html, safe_url
from triogate.ui.layout import Flash, html_response, page

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.ui.stats import Sampler

FLASH_COOKIE = "triogate_ui_flash"


@final
@attrs.frozen(kw_only=True)
class Ctx:
    """One dashboard request, signed in (or on its way to)."""

    services: Services
    request: Request
    secret: bytes
    sampler: Sampler
    principal: sess.UiPrincipal | None = None
    session: sess.Session | None = None
    form: Mapping[str, str] = attrs.field(factory=dict)
    flashes: tuple[Flash, ...] = ()

    @property
    def caller(self) -> Caller:
        """Who the admin API sees for the signed-in person."""
        assert self.principal is not None
        return self.principal.caller

    @property
    def csrf(self) -> str:
        return self.session.csrf(self.secret) if self.session else ""

    @property
    def query(self) -> Mapping[str, str]:
        return self.request.query

    @property
    def secure(self) -> bool:
        """Whether the browser reached us over TLS (directly or through a proxy)."""
        scheme = self.request.scope.get("scheme", "http")
        return bool(scheme == "https"
                    or self.request.headers.get("x-forwarded-proto", "") == "https")

    def with_flash(self, flash: Flash) -> Ctx:
        return attrs.evolve(self, flashes=(*self.flashes, flash))

    def page(self, title: str, content: Html, *, active: str, status: int = 200,
             refresh_s: int | None = None, actions: Html | None = None,
             flashes: tuple[Flash, ...] = ()) -> Response:
        assert self.principal is not None
        body = page(title, content, principal=self.principal, csrf=self.csrf, active=active,
                    flashes=self.flashes + flashes, refresh_s=refresh_s, actions=actions)
        headers = {}
        if self.flashes:  # shown: forget it
            headers["set-cookie"] = sess.cookie(FLASH_COOKIE, "", max_age_s=0, secure=self.secure)
        return html_response(body, status=status, headers=headers)

    def redirect(self, to: str, *, flash: Flash | None = None) -> Response:
        """303 to a dashboard path, carrying a one-time message in a signed cookie."""
        headers = {"location": safe_url(to)}
        if flash is not None:
            value = sess.sign(self.secret, {"t": flash.text, "k": flash.kind,
                                            "exp": time.time() + 60})
            headers["set-cookie"] = sess.cookie(FLASH_COOKIE, value, max_age_s=60,
                                                secure=self.secure)
        return Response(b"", status=303, content_type="text/plain", headers=headers)


def read_flash(secret: bytes, cookies: Mapping[str, str]) -> tuple[Flash, ...]:
    payload = sess.unsign(secret, cookies.get(FLASH_COOKIE, ""), now_s=time.time())
    if not payload or not isinstance(payload.get("t"), str):
        return ()
    kind = payload.get("k") if payload.get("k") in ("info", "ok", "error") else "info"
    return (Flash(text=payload["t"], kind=str(kind)),)
