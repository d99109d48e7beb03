"""The page around every view: header, navigation, messages, and the security headers."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

from triogate.api.http import Response
from triogate.ui.html import Html, el, raw

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.ui.session import UiPrincipal

#: Same-origin everything, no inline script or style, no framing, forms post here only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS: Mapping[str, str] = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

NAV = (
    ("overview", "/ui", "Overview", "read"),
    ("keys", "/ui/keys", "Keys", "read team"),
    ("teams", "/ui/teams", "Teams", "read team"),
    ("users", "/ui/users", "Users", "read"),
    ("customers", "/ui/customers", "Customers", "read"),
    ("tags", "/ui/tags", "Tags", "read"),
    ("spend", "/ui/spend", "Spend", "read"),
    ("deployments", "/ui/deployments", "Deployments", "read"),
    ("config", "/ui/config", "Configuration", "read"),
    ("mine", "/ui/mine", "My key", "self-only"),
)


@final
@attrs.frozen(kw_only=True)
class Flash:
    """A message shown above the page's content."""

    text: str
    kind: str = "info"  # info | ok | error


def html_response(body: Html, *, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    return Response(body.encode(), status=status, content_type="text/html; charset=utf-8",
                    headers={**SECURITY_HEADERS, **(headers or {})})


def document(title: str, content: Html, *, refresh_s: int | None = None) -> Html:
    return Html("<!doctype html>" + el(
        "html",
        el("head", el("meta", charset="utf-8"),
           el("meta", name="viewport", content="width=device-width, initial-scale=1"),
           el("title", f"{title} · triogate"),
           raw('<link rel="icon" href="data:,">'),  # no favicon request
           el("link", rel="stylesheet", href="/ui/static/app.css"),
           el("script", src="/ui/static/app.js", defer=True)),
        el("body", content, data_refresh=refresh_s),
        lang="en",
    ))


def page(title: str, content: Html, *, principal: UiPrincipal, csrf: str, active: str,
         flashes: tuple[Flash, ...] = (), refresh_s: int | None = None,
         actions: Html | None = None) -> Html:
    """A signed-in page: the navigation the principal may use, the title, the content."""
    links = []
    for name, href, label, need in NAV:
        allowed = (principal.key_hash is not None if need == "self-only"
                   else any(principal.can(a) for a in need.split()))  # type: ignore[arg-type]
        if allowed:
            links.append(el("li", el("a", label, href=href,
                                     aria_current="page" if name == active else None)))
    sign_out = el("form", el("input", type="hidden", name="csrf", value=csrf),
                  el("button", "Sign out", type="submit", class_="btn ghost"),
                  method="post", action="/ui/logout", class_="inline")
    header = el("header", el("a", raw("triogate"), href="/ui", class_="brand"),
                el("nav", el("ul", links), aria_label="Main"),
                el("div", el("span", principal.label, class_="who",
                             title=f"signed in as {principal.role}"), sign_out,
                   class_="account"),
                class_="top")
    messages = [el("div", f.text, class_=f"flash {f.kind}", role="alert" if f.kind == "error"
                   else "status") for f in flashes]
    heading = el("div", el("h1", title), actions, class_="title-row")
    main = el("main", heading, messages, content, id="main")
    skip = el("a", "Skip to content", href="#main", class_="skip")
    return document(title, Html(skip + header + main), refresh_s=refresh_s)


def section(title: str, *content: object, note: str | None = None) -> Html:
    return el("section", el("h2", title), el("p", note, class_="note") if note else None,
              *content, class_="panel")
