"""Keys, teams, users, customers and tags: what differs between them, in one table.

The dashboard names each kind by its URL segment (``keys``, ``teams``, ``users``,
``customers``, ``tags``); :data:`KINDS` says how the admin API names its id in each verb
and which columns its list shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import attrs

from triogate.ui import bridge
from triogate.ui.html import Html, badge, el, url, usd, when

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.api.admin.roles import Caller
    from triogate.api.services import Services


@final
@attrs.frozen(kw_only=True)
class Kind:
    """One kind of entity as the dashboard shows it.

    Attributes:
        name: the URL segment and the bridge's kind.
        singular, plural: how pages name it.
        id_field: the id in a rendered row (``token`` for keys).
        ref: the body/query field that names one (update, block, info).
        delete_field: the body list that ``delete`` takes.
        blockable: whether it has block/unblock.
        filter_field: the spend-log filter for its charts (``key_hash``...).
    """

    name: str
    singular: str
    plural: str
    id_field: str
    ref: str
    delete_field: str
    blockable: bool
    filter_field: str
    label_fields: tuple[str, ...]

    def ident(self, row: Mapping[str, Any]) -> str:
        return str(row.get(self.id_field) or "")

    def label(self, row: Mapping[str, Any]) -> str:
        for name in self.label_fields:
            if row.get(name):
                return str(row[name])
        return self.ident(row)

    def view_url(self, ident: str) -> str:
        return url(f"/ui/{self.name}/view", id=ident)


KINDS: Mapping[str, Kind] = {
    "keys": Kind(name="keys", singular="key", plural="Keys", id_field="token", ref="key",
                 delete_field="keys", blockable=True, filter_field="key_hash",
                 label_fields=("key_alias", "key_hint")),
    "teams": Kind(name="teams", singular="team", plural="Teams", id_field="team_id",
                  ref="team_id", delete_field="team_ids", blockable=True,
                  filter_field="team_id", label_fields=("team_alias",)),
    "users": Kind(name="users", singular="user", plural="Users", id_field="user_id",
                  ref="user_id", delete_field="user_ids", blockable=False,
                  filter_field="user_id", label_fields=("user_alias", "user_email")),
    "customers": Kind(name="customers", singular="customer", plural="Customers",
                      id_field="user_id", ref="user_id", delete_field="user_ids",
                      blockable=True, filter_field="end_user", label_fields=("alias",)),
    "tags": Kind(name="tags", singular="tag", plural="Tags", id_field="name", ref="name",
                 delete_field="names", blockable=False, filter_field="tag",
                 label_fields=("name",)),
}

INFO_PARAM = {"keys": "key", "teams": "team_id", "users": "user_id",
              "customers": "end_user_id", "tags": "name"}

#: The most rows a list page reads from the admin API (its own maximum).
LIST_MAX = 1000
#: Rows a list page reads at most (search filters them in memory): 20 API pages.
SCAN_MAX = 20_000


async def list_rows(services: Services, kind: Kind, caller: Caller) -> list[dict[str, Any]]:
    """Every row of ``kind`` that ``caller`` may list, through the admin API's ``list``, a
    page of :data:`LIST_MAX` at a time, up to :data:`SCAN_MAX` rows (oldest first).

    A team admin who sees not everything lists its teams' keys, team by team."""
    if kind.name == "keys" and not caller.sees_all and caller.admin_of:
        out: list[dict[str, Any]] = []
        for team in sorted(caller.admin_of):
            out.extend(await _list_pages(services, kind, caller, {"team_id": team}))
        return out[:SCAN_MAX]
    return await _list_pages(services, kind, caller, {})


async def _list_pages(services: Services, kind: Kind, caller: Caller,
                      extra: Mapping[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    page = 1
    while len(out) < SCAN_MAX:
        query = {"size": str(LIST_MAX), "page": str(page), **extra}
        if kind.name == "keys":
            query["return_full_object"] = "true"
        data = await bridge.call(services, kind.name, "list", caller=caller, query=query)
        if isinstance(data, dict):
            data = data.get("keys") or data.get("users") or []
        rows = [r for r in data if isinstance(r, dict)]
        out.extend(rows)
        if len(data) < LIST_MAX:
            break
        page += 1
    return out[:SCAN_MAX]


async def info(services: Services, kind: Kind, ident: str, caller: Caller) -> dict[str, Any]:
    """The admin API's ``info`` for one row as ``caller`` may read it, flattened (LiteLLM
    nests teams and users)."""
    data = await bridge.call(services, kind.name, "info", caller=caller,
                             query={INFO_PARAM[kind.name]: ident})
    if kind.name == "keys":
        return dict(data.get("info") or {})
    for nested in ("team_info", "user_info"):
        if isinstance(data.get(nested), dict):
            return {**data[nested], "keys": data.get("keys", [])}
    return dict(data)


def matches(kind: Kind, row: Mapping[str, Any], q: str) -> bool:
    """Case-insensitive search over the id and the names."""
    if not q:
        return True
    q = q.lower()
    haystack = [kind.ident(row), *(str(row.get(f) or "") for f in kind.label_fields),
                str(row.get("team_id") or ""), str(row.get("user_id") or ""),
                str(row.get("user_email") or "")]
    return any(q in h.lower() for h in haystack)


def status(row: Mapping[str, Any], now_ms: int) -> Html:
    if row.get("blocked"):
        return badge("blocked", "bad")
    expires = row.get("expires_at_ms")
    if isinstance(expires, int) and expires <= now_ms:
        return badge("expired", "warn")
    return badge("active", "ok")


def budget_text(row: Mapping[str, Any]) -> str:
    cap, soft = row.get("max_budget_nanousd"), row.get("soft_budget_nanousd")
    soft_text = f"soft {usd(soft)}" if soft is not None else None
    if cap is None:
        return soft_text or "—"
    period = row.get("budget_duration")
    text = f"{usd(cap)} / {period}" if period else usd(cap)
    return f"{text} ({soft_text})" if soft_text else text


def columns(kind: Kind, now_ms: int) -> tuple[tuple[str, ...], Callable[[Mapping[str, Any]],
                                                                       list[Any]]]:
    """The list's headers and a row → cells function."""
    def link(row: Mapping[str, Any]) -> Html:
        return el("a", kind.label(row), href=kind.view_url(kind.ident(row)))

    if kind.name == "keys":
        return (("Alias", "Key", "Team", "User", "Budget", "RPM", "Expires", "Status"),
                lambda r: [link(r), el("code", r.get("key_hint") or ""), r.get("team_id") or "—",
                           r.get("user_id") or "—", budget_text(r), r.get("rpm_limit") or "—",
                           when(r.get("expires_at_ms")), status(r, now_ms)])
    if kind.name == "tags":
        return (("Tag", "Description", "Budget", "RPM", "TPM"),
                lambda r: [link(r), r.get("description") or "—", budget_text(r),
                           r.get("rpm_limit") or "—", r.get("tpm_limit") or "—"])
    if kind.name == "users":
        return (("User id", "Email", "Role", "Budget", "RPM", "Parallel", "Status"),
                lambda r: [el("a", kind.ident(r), href=kind.view_url(kind.ident(r))),
                           r.get("user_email") or "—", r.get("user_role") or "internal_user",
                           budget_text(r), r.get("rpm_limit") or "—",
                           r.get("max_parallel_requests") or "—", status(r, now_ms)])
    extra = {"teams": ("Name", "team_alias"),
             "customers": ("Name", "alias")}[kind.name]
    return ((f"{kind.singular.title()} id", extra[0], "Budget", "RPM", "Parallel", "Status"),
            lambda r: [el("a", kind.ident(r), href=kind.view_url(kind.ident(r))),
                       r.get(extra[1]) or "—", budget_text(r), r.get("rpm_limit") or "—",
                       r.get("max_parallel_requests") or "—", status(r, now_ms)])
