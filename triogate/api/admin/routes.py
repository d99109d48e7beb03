"""The admin API: LiteLLM's paths and field names, so its tooling keeps working.

Each route's handler is wrapped by :func:`guarded`, which authorizes the caller against
the route's rule in ``roles.RULES`` (the one table of who may call what) and hands the
:class:`~triogate.api.admin.roles.Caller` to the handler. The handlers live in ``keys``
(virtual keys), ``entities`` (teams, users, end users as LiteLLM's "customers", tags),
``members`` (team members), ``budgets`` (shared budgets), ``spend``, ``report`` and
``global_spend`` (reports), and ``guardrails_list`` (the config's guardrails); field
parsing and rendering in ``fields`` (``compat`` for LiteLLM's no-op fields,
``guardrail_fields`` for a key's or team's guardrails, ``bounds`` for limits); what they
share around each query in ``common``.

:func:`routes` is merged into the route table by ``routes.py`` (error style "openai").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.api.admin import budgets as admin_budgets
from triogate.api.admin import global_spend as admin_global_spend
from triogate.api.admin import guardrails_list as admin_guardrails
from triogate.api.admin import keys as admin_keys
from triogate.api.admin import members as admin_members
from triogate.api.admin import report as admin_report
from triogate.api.admin import rotation as admin_rotation
from triogate.api.admin import spend as admin_spend
from triogate.api.admin.entities import END_USERS, TAGS, TEAMS, USERS, handlers, tag_info_many
from triogate.api.admin.entities import user_new as _user_new
from triogate.api.admin.roles import RULES, Caller, Rule, authorize

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Request, Response
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]
    AdminHandler = Callable[[Services, Request, Caller], Awaitable[Response]]


def guarded(rule: Rule, handler: AdminHandler) -> Handler:
    """``handler`` behind ``rule``: the caller is authorized before the body is read."""

    async def run(services: Services, request: Request) -> Response:
        caller = await authorize(services, request, rule)
        return await handler(services, request, caller)

    run.__name__ = getattr(handler, "__name__", "admin")
    return run


def handlers_by_route() -> dict[tuple[str, str], AdminHandler]:
    """Every admin handler, keyed by (method, path), before guarding."""
    table: dict[tuple[str, str], AdminHandler] = {
        ("POST", "/key/generate"): admin_keys.generate,
        ("POST", "/key/update"): admin_keys.update,
        ("POST", "/key/delete"): admin_keys.delete,
        ("POST", "/key/block"): admin_keys.block,
        ("POST", "/key/unblock"): admin_keys.unblock,
        ("POST", "/key/regenerate"): admin_rotation.regenerate,
        ("GET", "/key/info"): admin_keys.info,
        ("GET", "/key/list"): admin_keys.list_keys,
        ("GET", "/spend/logs"): admin_spend.spend_logs,
        ("GET", "/spend/logs/v2"): admin_spend.spend_logs_paged,
        ("GET", "/spend/logs/ui"): admin_spend.spend_logs_paged,
        ("GET", "/spend/daily"): admin_spend.spend_daily,
        ("GET", "/global/spend/report"): admin_report.spend_report,
        ("POST", "/tag/info"): tag_info_many,
        ("POST", "/team/member_add"): admin_members.member_add,
        ("POST", "/team/member_delete"): admin_members.member_delete,
        ("POST", "/team/member_update"): admin_members.member_update,
    }
    verbs = {"new": "POST", "update": "POST", "delete": "POST", "info": "GET", "list": "GET",
             "block": "POST", "unblock": "POST"}
    for prefix, api, skip in (
        ("/team", TEAMS, ()),
        ("/user", USERS, ("block", "unblock")),
        ("/customer", END_USERS, ()),
        ("/end_user", END_USERS, ()),  # LiteLLM's older name, still served
        ("/tag", TAGS, ("block", "unblock")),
    ):
        for verb, handler in handlers(api).items():
            if verb not in skip:
                table[(verbs[verb], f"{prefix}/{verb}")] = handler
    table[("POST", "/user/new")] = _user_new
    table.update(admin_budgets.routes())
    table.update(admin_global_spend.ROUTES)
    table.update(admin_guardrails.ROUTES)
    return table


def regenerate_by_path() -> Handler:
    """``POST /key/{key}/regenerate``, guarded as ``/key/regenerate`` (a path pattern)."""
    return guarded(RULES[("POST", "/key/regenerate")], admin_rotation.regenerate_by_path)


def routes() -> dict[tuple[str, str], Handler]:
    """Every admin route, guarded by its rule, keyed by (method, path).

    Raises:
        KeyError: a route without a rule in ``roles.RULES`` (a test walks every route).
    """
    return {route: guarded(RULES[route], handler)
            for route, handler in handlers_by_route().items()}
