"""The admin API: LiteLLM's paths and field names, so its tooling keeps working.

Every route needs the master key (``auth.require_master``). The handlers live in
``admin_keys`` (virtual keys), ``admin_entities`` (teams, users, end users as LiteLLM's
"customers", tags) and ``admin_spend`` (reports); field parsing and rendering in
``admin_fields``; what they share around each query (SQL errors, propagation of changes
to every process, budget reads) in ``admin_common``.

:func:`routes` is merged into the route table by ``routes.py`` (error style "openai").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from triogate.api.admin import keys as admin_keys
from triogate.api.admin import spend as admin_spend
from triogate.api.admin.entities import END_USERS, TAGS, TEAMS, USERS, handlers, tag_info_many
from triogate.api.admin.entities import user_new as _user_new

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.http import Request, Response
    from triogate.api.services import Services

    Handler = Callable[[Services, Request], Awaitable[Response]]


def routes() -> dict[tuple[str, str], Handler]:
    """Every admin route, keyed by (method, path)."""
    table: dict[tuple[str, str], Handler] = {
        ("POST", "/key/generate"): admin_keys.generate,
        ("POST", "/key/update"): admin_keys.update,
        ("POST", "/key/delete"): admin_keys.delete,
        ("POST", "/key/block"): admin_keys.block,
        ("POST", "/key/unblock"): admin_keys.unblock,
        ("GET", "/key/info"): admin_keys.info,
        ("GET", "/key/list"): admin_keys.list_keys,
        ("GET", "/spend/logs"): admin_spend.spend_logs,
        ("GET", "/spend/daily"): admin_spend.spend_daily,
        ("POST", "/tag/info"): tag_info_many,
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
    return table
