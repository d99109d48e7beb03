"""HTML that escapes by default: :class:`Html` is trusted markup, everything else is text.

``el("td", value)`` escapes ``value`` unless it is :class:`Html` (made only by ``el``,
``join`` and ``raw`` on constants). Attribute values are escaped too, and URL attributes
(``href``, ``action``, ``src``) accept only same-site paths, so no ``javascript:`` URL
can be built from data. No template engine: the views are Python functions.
"""

from __future__ import annotations

import datetime
import html
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

_URL_ATTRS = frozenset({"href", "action", "src", "formaction"})
_VOID = frozenset({"input", "br", "meta", "link", "img", "hr"})


class Html(str):
    """A string that is already markup (never built from data without escaping)."""

    __slots__ = ()


def raw(markup: str) -> Html:
    """Trusted markup: constants of the views only, never data."""
    return Html(markup)


def esc(value: Any) -> Html:
    """``value`` as markup: Html stays, anything else is escaped text (None → empty)."""
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value), quote=True))


def safe_url(url: str) -> str:
    """A same-site path; anything else (``javascript:``, ``//host``) becomes ``#``."""
    if (url.startswith("/") and not url.startswith("//")) or url.startswith(("?", "#")):
        return url
    return "#"


def attrs_of(attributes: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for name, value in attributes.items():
        name = name.rstrip("_").replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f" {name}")
            continue
        text = str(value)
        if name in _URL_ATTRS:
            text = safe_url(text)
        parts.append(f' {name}="{html.escape(text, quote=True)}"')
    return "".join(parts)


def el(tag: str, *children: Any, **attributes: Any) -> Html:
    """``<tag attrs>children</tag>``; children are escaped unless Html; lists are joined."""
    opening = f"<{tag}{attrs_of(attributes)}>"
    if tag in _VOID:
        return Html(opening)
    return Html(opening + join(children) + f"</{tag}>")


def join(items: Iterable[Any], sep: str = "") -> Html:
    """Items as markup, each escaped unless Html (nested lists flattened)."""
    out: list[str] = []
    for item in items:
        if isinstance(item, list | tuple):
            out.append(join(item))
        elif item is not None:
            out.append(esc(item))
    return Html(sep.join(out))


def url(path: str, **query: Any) -> str:
    """``path?query`` without the empty parameters."""
    params = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{path}?{urlencode(params)}" if params else path


# ------------------------------------------------------------------------- formatting

def usd(nanousd: int | None) -> str:
    """``$1.2345`` from nano-USD (4 decimals); below a cent every significant digit, exact
    (``$0.0000022``, never rounded to ``$0.000000``); ``$0`` for nothing; ``—`` when unknown."""
    if nanousd is None:
        return "—"
    if nanousd == 0:
        return "$0"
    if abs(nanousd) < 10_000_000:
        sign = "-" if nanousd < 0 else ""
        return f"{sign}$0.{abs(nanousd):09d}".rstrip("0")
    return f"${nanousd / 1e9:,.4f}"


def when(epoch_ms: int | None) -> str:
    """``2026-12-01 11:03:44`` (UTC) or ``—``."""
    if not epoch_ms:
        return "—"
    t = datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S")


def number(value: float | None, digits: int = 0) -> str:
    """``1,234`` or ``1,234.5``; ``—`` when unknown."""
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def limit(value: Any) -> str:
    """A limit: ``1,000``; ``—`` for none."""
    if value is None or value == "":
        return "—"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------ components

def table(headers: Iterable[Any], rows: Iterable[Iterable[Any]], *, empty: str = "Nothing yet.",
          caption: str | None = None, numeric: Iterable[int] = (),
          wrap: Iterable[int] = ()) -> Html:
    """A data table; ``numeric`` column indexes are right-aligned, ``wrap`` ones may break
    their text over lines (cells stay on one line otherwise)."""
    right, wrapping = set(numeric), set(wrap)

    def cls(i: int) -> str | None:
        return " ".join(c for c, on in (("num", i in right), ("wrap", i in wrapping)) if on) or None
    head = el("tr", [el("th", h, scope="col", class_=cls(i)) for i, h in enumerate(headers)])
    body = [el("tr", [el("td", c, class_=cls(i)) for i, c in enumerate(row)]) for row in rows]
    if not body:
        return el("p", empty, class_="empty")
    return el("div", el("table", el("caption", caption) if caption else None,
                        el("thead", head), el("tbody", body)), class_="table-wrap")


def field(name: str, label: str, *, value: Any = "", type_: str = "text", hint: str = "",
          required: bool = False, **extra: Any) -> Html:
    """A labelled input (every input has a label: the accessibility check relies on it)."""
    ident = f"f-{name}"
    hint_id = f"{ident}-hint" if hint else None
    return el(
        "div",
        el("label", label, for_=ident),
        el("input", id=ident, name=name, type=type_, value=value, required=required,
           aria_describedby=hint_id, **extra),
        el("small", hint, id=hint_id) if hint else None,
        class_="field",
    )


def select(name: str, label: str, options: Iterable[tuple[str, str]], selected: str = ""
           ) -> Html:
    """A labelled select."""
    ident = f"f-{name}"
    return el("div", el("label", label, for_=ident), el(
        "select", [el("option", text, value=value, selected=value == selected)
                   for value, text in options], id=ident, name=name), class_="field")


def csrf_input(token: str) -> Html:
    return el("input", type="hidden", name="csrf", value=token)


def post_button(action: str, label: str, csrf: str, *, fields: Mapping[str, str] | None = None,
                danger: bool = False, confirm: str | None = None) -> Html:
    """A one-button form (POST with the CSRF token); ``confirm`` asks first (app.js)."""
    hidden = [el("input", type="hidden", name=k, value=v) for k, v in (fields or {}).items()]
    return el("form", csrf_input(csrf), hidden,
              el("button", label, type="submit", class_="btn danger" if danger else "btn"),
              method="post", action=action, class_="inline", data_confirm=confirm)


def pager(path: str, page: int, pages: int, **query: Any) -> Html:
    """Previous / next links keeping the other query parameters."""
    if pages <= 1:
        return Html("")
    prev = el("a", "← Previous", href=url(path, page=page - 1, **query)) if page > 1 else None
    nxt = el("a", "Next →", href=url(path, page=page + 1, **query)) if page < pages else None
    return el("nav", prev, el("span", f"Page {page} of {pages}"), nxt, class_="pager",
              aria_label="Pages")


def card(title: str, value: Any, note: Any = None) -> Html:
    """A figure with its name."""
    return el("div", el("div", title, class_="card-title"), el("div", value, class_="card-value"),
              el("div", note, class_="card-note") if note is not None else None, class_="card")


def badge(text: str, kind: str = "") -> Html:
    return el("span", text, class_=f"badge {kind}".strip())


def meter(used: int | float | None, cap: int | float | None, text: str) -> Html:
    """A bar of ``used`` out of ``cap`` (or just the text when there is no cap)."""
    if not cap or used is None:
        return el("span", text)
    share = max(0.0, min(1.0, used / cap))
    kind = "bad" if share >= 0.9 else "warn" if share >= 0.7 else "ok"
    return el("span", el("meter", f"{share:.0%}", value=f"{share:.3f}", min="0", max="1",
                         class_=kind, aria_label=text), " ", text, class_="meter")
