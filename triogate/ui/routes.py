"""The dashboard's routes, merged into the gateway's table by one line in ``api/routes.py``.

:func:`routes` returns ``{(method, path): handler}``; every handler is the one
:class:`Dashboard` entry point, which signs in, checks the session, the role and (for a
POST) the origin and the CSRF token, then runs the view. A view answers HTML; nothing of
the dashboard speaks the API's JSON error shapes.
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import TYPE_CHECKING, final
from urllib.parse import parse_qsl

from triogate.api.errors import ApiError
from triogate.api.http import Response
from triogate.errors import StoreError
from triogate.ui import pages_detail, pages_entities, pages_overview, pages_spend, pages_system
from triogate.ui import session as sess
from triogate.ui.bridge import UiError
from triogate.ui.context import Ctx, read_flash
from triogate.ui.html import Html, csrf_input, el, field, url
from triogate.ui.layout import SECURITY_HEADERS, Flash, document, html_response
from triogate.ui.stats import Sampler

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Request
    from triogate.api.services import Services

    View = Callable[[Ctx], Awaitable[Response]]

logger = logging.getLogger("triogate.ui")

MAX_FORM_BYTES = 64 * 1024
_KINDS = ("keys", "teams", "users", "customers", "tags")
#: The kinds a team admin reaches (its teams, their keys).
TEAM_KINDS = ("keys", "teams")

#: (method, path) → (view, what the principal must be allowed, one of: read / write /
#: self / team). Team admins reach their teams and their teams' keys; the admin API then
#: decides which rows (``bridge.call`` runs it as the signed-in person).
VIEWS: dict[tuple[str, str], tuple[View, tuple[sess.Action, ...]]] = {
    ("GET", "/ui"): (pages_overview.overview, ("read",)),
    ("GET", "/ui/spend"): (pages_spend.spend, ("read",)),
    ("GET", "/ui/spend.csv"): (pages_spend.spend_csv, ("read",)),
    ("GET", "/ui/deployments"): (pages_system.deployments, ("read",)),
    ("GET", "/ui/config"): (pages_system.config_page, ("read",)),
    ("GET", "/ui/mine"): (pages_detail.own_key, ("self",)),
}
for _kind in _KINDS:
    _reads: tuple[sess.Action, ...] = ("read", "team") if _kind in TEAM_KINDS else ("read",)
    _writes: tuple[sess.Action, ...] = ("write", "team") if _kind == "keys" else ("write",)
    VIEWS[("GET", f"/ui/{_kind}")] = (pages_entities.list_page, _reads)
    VIEWS[("GET", f"/ui/{_kind}/view")] = (pages_entities.view, _reads)
    VIEWS[("GET", f"/ui/{_kind}/new")] = (pages_entities.new_page, _writes)
    VIEWS[("POST", f"/ui/{_kind}/new")] = (pages_entities.create, _writes)
    for _verb in ("update", "block", "unblock", "delete"):
        VIEWS[("POST", f"/ui/{_kind}/{_verb}")] = (pages_entities.change, _writes)

STATIC = {"/ui/static/app.css": "text/css; charset=utf-8",
          "/ui/static/app.js": "text/javascript; charset=utf-8"}


@final
class Dashboard:
    """The dashboard of one gateway process (its :class:`Sampler` holds a minute of
    metric snapshots)."""

    def __init__(self) -> None:
        self.sampler = Sampler()

    async def handle(self, services: Services, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path in STATIC:
            return _static(path)
        secret = sess.secret_of(services)
        cookies = sess.parse_cookies(request.headers.get("cookie", ""))
        ctx = Ctx(services=services, request=request, secret=secret, sampler=self.sampler,
                  flashes=read_flash(secret, cookies) if request.method == "GET" else ())
        if path == "/ui/login":
            if request.method == "POST":
                return await _sign_in(ctx, cookies)
            return _sign_in_page(ctx, cookies)
        session = sess.read_session(secret, cookies, now_s=time.time())
        if session is not None and await sess.is_revoked(services, session):
            session = None
        principal = (await sess.principal_of(services, session.subject)
                     if session is not None else None)
        if session is None or principal is None:
            if request.method != "GET":
                return _plain(403, "Your session has ended: sign in again.")
            return ctx.redirect(url("/ui/login", next=request.path))
        ctx = Ctx(services=services, request=request, secret=secret, sampler=self.sampler,
                  principal=principal, session=session, flashes=ctx.flashes)
        if request.method == "POST":
            form = await _form(request)
            if not sess.same_origin(request.headers) or not sess.csrf_ok(
                    secret, session.nonce, form.get("csrf")):
                return _plain(403, "This form has expired or came from another site. Go back, "
                                   "reload the page and try again.")
            ctx = Ctx(services=services, request=request, secret=secret, sampler=self.sampler,
                      principal=principal, session=session, form=form)
            if path == "/ui/logout":
                await sess.revoke(services, session, now_s=time.time())
                return _sign_out(ctx)
        if path == "/ui" and not principal.can("read"):
            return ctx.redirect(_home(principal))
        found = VIEWS.get((request.method, path))
        if found is None:
            return _plain(404 if not any(p == path for _, p in VIEWS) else 405, "Not found.")
        view, need = found
        if not principal.can_any(need):
            return _plain(403, "Your role does not allow this page.")
        try:
            return await view(ctx)
        except UiError as exc:
            return ctx.page("Error", Html(""), active="", status=exc.status,
                            flashes=(Flash(text=exc.message, kind="error"),))
        except StoreError as exc:
            logger.warning("dashboard: database unavailable: %s", exc)
            return ctx.page("Error", Html(""), active="", status=503, flashes=(Flash(
                text="The database did not answer; try again shortly.", kind="error"),))


def routes() -> dict[tuple[str, str], Callable[[Services, Request], Awaitable[Response]]]:
    """Every dashboard path (with and without a trailing slash for ``/ui``)."""
    dashboard = Dashboard()
    paths = {p for _, p in VIEWS} | set(STATIC) | {"/ui/", "/ui/login", "/ui/logout"}
    table: dict[tuple[str, str], Callable[[Services, Request], Awaitable[Response]]] = {}
    for path in paths:
        for method in ("GET", "POST"):
            table[(method, path)] = dashboard.handle
    return table


#: The static files' bytes, read once at import (a few kB): serving them reads no file on
#: the loop.
_STATIC_BODIES = {
    path: resources.files("triogate.ui").joinpath("static").joinpath(
        path.rsplit("/", 1)[1]).read_bytes()
    for path in STATIC
}


def _static(path: str) -> Response:
    body = _STATIC_BODIES[path]
    return Response(body, content_type=STATIC[path], headers={
        "cache-control": "public, max-age=300", "x-content-type-options": "nosniff"})


def _plain(status: int, message: str) -> Response:
    body = document("triogate", el("main", el("h1", message),
                                   el("p", el("a", "Back to the dashboard", href="/ui")),
                                   id="main", class_="signin"))
    return html_response(body, status=status)


async def _form(request: Request) -> dict[str, str]:
    try:
        raw = await request.body(MAX_FORM_BYTES)
    except ApiError:
        return {}
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


def _next(value: str) -> str:
    return value if value.startswith("/ui") and not value.startswith("/ui/log") else "/ui"


def _sign_in_page(ctx: Ctx, cookies: dict[str, str], *, status: int = 200,
                  error: str | None = None) -> Response:
    value, token = sess.new_pre_session(ctx.secret, now_s=time.time())
    next_path = _next(ctx.form.get("next") or ctx.query.get("next", "/ui"))
    messages = [el("div", f.text, class_=f"flash {f.kind}", role="status") for f in ctx.flashes]
    if ctx.services.config.master_key is None:
        messages.append(el("div", "This gateway has no master key: sign in with the key of a "
                           "proxy_admin user to manage it, or any other virtual key to read "
                           "its own page. Set general_settings.master_key to sign in with "
                           "it.", class_="flash info", role="status"))
    if ctx.query.get("signed_out") == "1":
        messages.append(el("div", "You are signed out.", class_="flash ok", role="status"))
    if error:
        messages.append(el("div", error, class_="flash error", role="alert"))
    form = el("form", csrf_input(token), el("input", type="hidden", name="next", value=next_path),
              field("key", "Master key or virtual key", type_="password", required=True,
                    autocomplete="current-password", autofocus=True,
                    hint="The master key or a proxy_admin's key opens everything; a "
                         "proxy_admin_viewer's key reads everything; a team admin's key "
                         "manages its teams' keys; any other key shows its own spend."),
              el("button", "Sign in", type="submit", class_="btn primary"),
              method="post", action="/ui/login")
    body = document("Sign in", el("main", el("div", "triogate", class_="brand-big"),
                                  el("h1", "Sign in to the dashboard"), messages,
                                  el("div", form, class_="panel"), id="main", class_="signin"))
    headers = {**SECURITY_HEADERS, "set-cookie": sess.cookie(
        sess.PRE_COOKIE, value, max_age_s=sess.PRE_TTL_S, secure=ctx.secure)}
    return html_response(body, status=status, headers=headers)


async def _sign_in(ctx: Ctx, cookies: dict[str, str]) -> Response:
    form = await _form(ctx.request)
    ctx = Ctx(services=ctx.services, request=ctx.request, secret=ctx.secret,
              sampler=ctx.sampler, form=form)
    nonce = sess.read_pre_session(ctx.secret, cookies, now_s=time.time())
    if (nonce is None or not sess.same_origin(ctx.request.headers)
            or not sess.csrf_ok(ctx.secret, nonce, form.get("csrf"))):
        return _sign_in_page(ctx, cookies, status=403,
                             error="The sign-in form expired. Please try again.")
    client = str((ctx.request.scope.get("client") or ("-",))[0])
    if await sess.sign_in_blocked(ctx.services, client):
        return _sign_in_page(ctx, cookies, status=429,
                             error="Too many failed attempts: wait a minute and try again.")
    try:
        principal = await sess.ui_principal(ctx.services, form.get("key", ""))
    except StoreError:
        return _sign_in_page(ctx, cookies, status=503,
                             error="The database did not answer; try again shortly.")
    if principal is None:
        logger.info("dashboard: sign-in refused")
        await sess.note_failed_sign_in(ctx.services, client)
        return _sign_in_page(ctx, cookies, status=401,
                             error="That key cannot sign in (unknown, blocked or expired).")
    _, value = sess.new_session(ctx.secret, principal, now_s=time.time())
    to = _next(form.get("next", "/ui")) if principal.can("read") else _home(principal)
    logger.info("dashboard: signed in", extra={"role": principal.role})
    headers = {"location": to}
    response = Response(b"", status=303, content_type="text/plain", headers=headers)
    response.headers["set-cookie"] = sess.cookie(sess.COOKIE, value,
                                                 max_age_s=sess.SESSION_TTL_S, secure=ctx.secure)
    return response


def _home(principal: sess.UiPrincipal) -> str:
    """Where a principal that may not read every page starts."""
    return "/ui/teams" if principal.can("team") else "/ui/mine"


def _sign_out(ctx: Ctx) -> Response:
    """Clear the session cookie (one Set-Cookie per response: the sign-in page says it)."""
    response = ctx.redirect("/ui/login?signed_out=1")
    response.headers["set-cookie"] = sess.cookie(sess.COOKIE, "", max_age_s=0,
                                                 secure=ctx.secure)
    return response
