"""List, create, view, change and delete keys, teams, users, customers and tags.

Every change is one admin API call (``bridge.call``): the same validation and the same
propagation as ``curl``. A new key's raw value is rendered once, in the response to the
form that created it (not a redirect: it never enters a URL or a cookie), with a copy
button; afterwards only its hint is shown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.ui import bridge, forms
from triogate.ui import session as sess
from triogate.ui.bridge import UiError
from triogate.ui.entities import KINDS, SCAN_MAX, Kind, columns, info, list_rows, matches
from triogate.ui.html import Html, csrf_input, el, pager, table
from triogate.ui.layout import Flash, section
from triogate.ui.pages_detail import detail

if TYPE_CHECKING:
    from triogate.api.http import Response
    from triogate.ui.context import Ctx

PAGE_SIZE = 25


def kind_of(ctx: Ctx) -> Kind:
    return KINDS[ctx.request.path.split("/")[2]]


def _page_number(ctx: Ctx) -> int:
    raw = ctx.query.get("page", "1")
    return max(1, int(raw)) if raw.isdigit() and len(raw) < 7 else 1


async def list_page(ctx: Ctx) -> Response:
    """GET /ui/<kind>?q=&page=."""
    kind = kind_of(ctx)
    q = ctx.query.get("q", "").strip()[:200]
    try:
        every = await list_rows(ctx.services, kind, ctx.caller)
        rows = [r for r in every if matches(kind, r, q)]
    except UiError as exc:
        return ctx.page(kind.plural, Html(""), active=kind.name, status=exc.status,
                        flashes=(Flash(text=exc.message, kind="error"),))
    page = _page_number(ctx)
    pages = max(1, -(-len(rows) // PAGE_SIZE))
    page = min(page, pages)
    headers, cells = columns(kind, ctx.services.clock_ms())
    shown = rows[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    search = el("form", el("div", el("label", f"Search {kind.plural.lower()}", for_="q"),
                           el("input", id="q", name="q", type="search", value=q),
                           class_="field"),
                el("button", "Search", type="submit", class_="btn"),
                method="get", action=f"/ui/{kind.name}", class_="search", role="search")
    may_create = ctx.principal is not None and (
        ctx.principal.can("write") or (kind.name == "keys" and ctx.principal.can("team")))
    new = (el("a", f"New {kind.singular}", href=f"/ui/{kind.name}/new", class_="btn primary")
           if may_create else None)
    capped = f" (searched the first {SCAN_MAX:,})" if len(every) >= SCAN_MAX else ""
    noun = kind.singular if len(rows) == 1 else kind.plural.lower()
    count = el("p", f"{len(rows):,} {noun}" + (f" matching “{q}”" if q else "")
               + capped, class_="note")
    body = section(kind.plural, search, count,
                   table(headers, [cells(r) for r in shown],
                         empty=f"No {kind.plural.lower()} yet."),
                   pager(f"/ui/{kind.name}", page, pages, q=q))
    return ctx.page(kind.plural, body, active=kind.name, actions=new)


def _new_form(ctx: Ctx, kind: Kind, values: dict[str, Any] | None = None) -> Html:
    id_part: Html | None = None
    if kind.name in forms.ID_FIELDS:
        name, label, required = forms.ID_FIELDS[kind.name]
        value = (values or {}).get(name, "")
        id_part = el("div", el("div", el("label", label, for_=f"f-{name}"),
                               el("input", id=f"f-{name}", name=name, value=value,
                                  required=required, autocomplete="off"),
                               el("small", "Generated when left empty.") if not required
                               else None, class_="field"), class_="form-grid")
    return el("form", csrf_input(ctx.csrf),
              el("input", type="hidden", name="once", value=sess.once_token()), id_part,
              forms.render_fields(kind.name, values, creating=True),
              el("div", el("button", f"Create {kind.singular}", type="submit",
                           class_="btn primary"),
                 el("a", "Cancel", href=f"/ui/{kind.name}", class_="btn"), class_="actions"),
              method="post", action=f"/ui/{kind.name}/new")


async def new_page(ctx: Ctx) -> Response:
    """GET /ui/<kind>/new."""
    kind = kind_of(ctx)
    # A team's page links here with its team_id filled in.
    values = ({"team_id": ctx.query["team_id"][:200]}
              if kind.name == "keys" and ctx.query.get("team_id") else None)
    return ctx.page(f"New {kind.singular}", section("Details", _new_form(ctx, kind, values)),
                    active=kind.name)


async def create(ctx: Ctx) -> Response:
    """POST /ui/<kind>/new."""
    kind = kind_of(ctx)
    if not await sess.use_once(ctx.services, ctx.form.get("once", "")):
        return ctx.redirect(f"/ui/{kind.name}", flash=Flash(
            text=f"That form was already sent: the {kind.singular} was created once, not "
                 "twice. Find it in this list.", kind="info"))
    try:
        body = forms.body_of(kind.name, ctx.form, creating=True)
        if kind.name in forms.ID_FIELDS:
            name = forms.ID_FIELDS[kind.name][0]
            if ctx.form.get(name, "").strip():
                body[name] = ctx.form[name].strip()
        created = await bridge.call(ctx.services, kind.name, "new", caller=ctx.caller,
                                    body=body)
    except (UiError, forms.FormError) as exc:
        message = exc.message if isinstance(exc, UiError) else str(exc)
        return ctx.page(f"New {kind.singular}", section("Details", _new_form(ctx, kind,
                        dict(ctx.form))), active=kind.name,
                        status=exc.status if isinstance(exc, UiError) else 400,
                        flashes=(Flash(text=message, kind="error"),))
    ident = kind.ident(created)
    if kind.name != "keys":
        return ctx.redirect(kind.view_url(ident), flash=Flash(
            text=f"Created {kind.singular} {kind.label(created)}.", kind="ok"))
    secret = el("div", el("code", created.get("key", ""), id="new-key"),
                el("button", "Copy", type="button", class_="btn", data_copy="new-key"),
                class_="secret")
    content = section(
        "Your new key", el("p", "Copy it now: it is shown this once and never again. "
                                "triogate keeps only its hash."), secret,
        el("div", el("a", "Open the key's page", href=kind.view_url(ident), class_="btn"),
           el("a", "Back to keys", href="/ui/keys", class_="btn"), class_="actions"))
    return ctx.page("Key created", content, active="keys",
                    flashes=(Flash(text=f"Created key {kind.label(created)}.", kind="ok"),))


async def view(ctx: Ctx) -> Response:
    """GET /ui/<kind>/view?id=."""
    kind = kind_of(ctx)
    ident = ctx.query.get("id", "")
    try:
        row = await info(ctx.services, kind, ident, ctx.caller) if ident else None
    except UiError as exc:
        return ctx.page(kind.plural, Html(""), active=kind.name, status=exc.status,
                        flashes=(Flash(text=exc.message, kind="error"),))
    if row is None:
        return ctx.redirect(f"/ui/{kind.name}")
    return await detail(ctx, kind, ident, row)


async def change(ctx: Ctx) -> Response:
    """POST /ui/<kind>/(update|block|unblock|delete) with ``id``."""
    kind = kind_of(ctx)
    verb = ctx.request.path.rsplit("/", 1)[1]
    ident = ctx.form.get("id", "")
    back = kind.view_url(ident)
    try:
        if verb == "update":
            body: dict[str, Any] = {kind.ref: ident,
                                    **forms.body_of(kind.name, ctx.form, creating=False)}
        elif verb == "delete":
            body = {kind.delete_field: [ident]}
        else:
            body = {kind.ref: ident}
        await bridge.call(ctx.services, kind.name, verb, caller=ctx.caller, body=body)
    except (UiError, forms.FormError) as exc:
        message = exc.message if isinstance(exc, UiError) else str(exc)
        return ctx.redirect(back, flash=Flash(text=message, kind="error"))
    if verb == "delete":
        return ctx.redirect(f"/ui/{kind.name}", flash=Flash(
            text=f"Deleted {kind.singular} {ident[:12] if kind.name == 'keys' else ident}.",
            kind="ok"))
    done = {"update": "Saved", "block": "Blocked", "unblock": "Unblocked"}[verb]
    return ctx.redirect(back, flash=Flash(text=f"{done}.", kind="ok"))
