"""``/key/regenerate`` and ``/key/{key}/regenerate``: a new secret for a key (LiteLLM's
key rotation).

The key keeps its id (``token``), limits, spend, team, user and history: only the secret
that authenticates as it changes. The old secret is refused at once on every process
(the change is announced like any other), or, with ``grace_period`` (``"24h"``), keeps
working until then and is refused afterwards. The body may also change any key field
(``max_budget``, ``models`` ...), as LiteLLM's ``RegenerateKeyRequest`` allows, and may
choose the new secret (``new_key``). The new raw key is in this response and nowhere
else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.admin.bounds import bad, check_custom_key
from triogate.api.admin.common import announce, begin, context, not_found, sql, store_of
from triogate.api.admin.fields import KEY_FIELDS, parse_fields, render_row, required_str, seconds
from triogate.api.admin.keys import apply_update, require_unused, writable
from triogate.api.errors import ApiError
from triogate.api.http import Response

if TYPE_CHECKING:
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.store import KeyRow

#: The path form: ``/key/{key}/regenerate``.
PATH_PREFIX, PATH_SUFFIX = "/key/", "/regenerate"
_OWN = frozenset({"key", "new_key", "grace_period", "new_master_key"})


async def regenerate(services: Services, request: Request, caller: Caller) -> Response:
    """POST /key/regenerate ``{"key": ..., "grace_period": "24h", "new_key": ...}``."""
    body = await begin(services, request)
    return await _regenerate(services, caller, required_str(body, "key"), body)


async def regenerate_by_path(services: Services, request: Request, caller: Caller
                             ) -> Response:
    """POST /key/{key}/regenerate (LiteLLM's path form; the body is optional)."""
    ref = request.path[len(PATH_PREFIX):-len(PATH_SUFFIX)]
    length = request.headers.get("content-length")
    empty = length == "0" or (length is None and "transfer-encoding" not in request.headers)
    body = {} if empty else await begin(services, request)
    if body.get("key") not in (None, ref):
        raise bad("key", "differs from the key in the path")
    return await _regenerate(services, caller, ref, {**body, "key": ref})


async def _regenerate(services: Services, caller: Caller, ref: str, body: dict[str, Any]
                      ) -> Response:
    fields = parse_fields(body, KEY_FIELDS, context(services), extra=_OWN)
    if body.get("new_master_key") is not None:
        raise ApiError(400, "triogate does not rotate the master key here: change "
                       "general_settings.master_key and restart", "invalid_request_error",
                       param="new_master_key", code="unsupported_feature")
    grace_s = 0 if body.get("grace_period") is None else seconds(
        "grace_period", body["grace_period"])
    store = store_of(services)
    row = await writable(services, caller, ref)
    new_raw = None
    if body.get("new_key") is not None:
        new_raw = check_custom_key(body["new_key"], services.config.master_key)
        await require_unused(store, new_raw, "new_key")
    if fields:
        row = await apply_update(services, caller, row, fields)
    with sql("regenerate key"):
        rotated = await store.rotate_key(
            row.token_hash, raw_key=new_raw, grace_ms=grace_s * 1000,
            next_rotation_at_ms=next_rotation(row, services.clock_ms()))
    if rotated is None:  # deleted (or rotated by another admin) meanwhile
        raise not_found("key", "(given)", "key")
    raw, new_row, old_secret = rotated
    headers = await announce(services, ("key", new_row.token_hash), ("key", old_secret))
    out = render_row(new_row)
    out.update({"key": raw, "previous_key_valid_until": out["previous_secret_expires_at"]})
    return Response.json(out, headers=headers)


def next_rotation(row: KeyRow, now_ms: int) -> int | None:
    """When a key's next scheduled rotation is due, counting from a rotation now."""
    if not row.auto_rotate or row.rotation_interval is None:
        return row.key_rotation_at_ms
    return now_ms + seconds("rotation_interval", row.rotation_interval) * 1000
