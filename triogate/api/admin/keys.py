"""``/key/*``: generate, update, block, delete, info and list virtual keys (LiteLLM's API).

A key is stored and shown by its SHA-256 (``token``); the raw key appears in exactly one
response, the one that created it. Requests may name a key by its raw value or by its
hash. Every change is announced (``admin_common.announce``), so a blocked or deleted key
is refused by every gateway process within a second.

Callers other than proxy admins see and change only the keys ``roles.Caller`` lets them
(their own, their teams' as team admins, a key itself); self-service limits are in
``selfserve.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.admin import guardrail_fields
from triogate.api.admin.bounds import bad, check_custom_key
from triogate.api.admin.budgets import inherit
from triogate.api.admin.common import (
    announce,
    begin,
    budget_states,
    context,
    not_found,
    sql,
    store_of,
)
from triogate.api.admin.fields import (
    KEY_FIELDS,
    key_candidates,
    only,
    page_count,
    paging,
    parse_fields,
    render_budget,
    render_row,
    required_str,
    seconds,
    str_list,
)
from triogate.api.admin.guardrail_fields import configured
from triogate.api.admin.roles import forbidden
from triogate.api.admin.selfserve import check_key_write
from triogate.api.errors import ApiError
from triogate.api.http import Response
from triogate.governance.from_rows import key_principal
from triogate.store import hash_key

if TYPE_CHECKING:
    from triogate.api.admin.roles import Caller
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.store import KeyRow, Store

async def require_team(store: Store, team_id: str | None) -> None:
    """400 unless ``team_id`` (when given) names an existing team. A checkpoint."""
    if team_id is None:
        return
    with sql(f"look up team '{team_id}'"):
        found = await store.get_teams([team_id])
    if team_id not in found:
        raise ApiError(400, f"team '{team_id}' does not exist; create it with /team/new first",
                       "invalid_request_error", param="team_id", code="team_not_found")


async def find_key(store: Store, ref: str) -> KeyRow | None:
    """The key a raw key (its current secret, or the one it was created with) or its id
    (``token``, the hash) names, or None. A checkpoint."""
    with sql("look up key"):
        found = await store.get_keys(key_candidates(ref))
        if not found:  # a rotated key's current secret
            by_secret = await store.keys_by_secret(key_candidates(ref))
            return next((row for row, ends in by_secret.values() if ends is None), None)
    return next(iter(found.values()), None)


async def require_unused(store: Store, raw: str, param: str) -> None:
    """409 when the chosen raw key already names a key or authenticates as one (a
    rotated key's secret). A checkpoint."""
    digest = hash_key(raw)
    with sql("look up key"):
        taken = await store.get_keys([digest]) or await store.keys_by_secret([digest])
    if taken:
        raise ApiError(409, f"{param}: a key with this value already exists",
                       "invalid_request_error",
                       param=param, code="conflict")


def schedule(fields: dict[str, Any], now_ms: int, row: KeyRow | None = None
             ) -> dict[str, Any]:
    """``fields`` with the next scheduled rotation (``key_rotation_at_ms``) set when
    ``auto_rotate`` or ``rotation_interval`` change: now + the interval, or none.

    Raises:
        ApiError: 400 for ``auto_rotate`` without a ``rotation_interval``.
    """
    if "auto_rotate" not in fields and "rotation_interval" not in fields:
        return fields
    auto = fields.get("auto_rotate", row.auto_rotate if row is not None else False)
    interval = fields.get("rotation_interval",
                          row.rotation_interval if row is not None else None)
    if auto and interval is None:
        raise bad("rotation_interval", "is required with auto_rotate (e.g. \"30d\")")
    due = now_ms + seconds("rotation_interval", interval) * 1000 if auto else None
    return {**fields, "key_rotation_at_ms": due}


async def require_alias_free(store: Store, alias: str | None, token_hash: str | None = None
                             ) -> None:
    """409 when another key already has ``alias`` (LiteLLM finds keys by alias). A
    checkpoint. The unique index on ``key_alias`` closes the race between two admins."""
    if alias is None:
        return
    with sql("look up key alias"):
        rows, _ = await store.list_keys(key_alias=alias, page=1, size=2)
    if any(r.token_hash != token_hash for r in rows):
        raise ApiError(409, f"another key already has key_alias '{alias}'",
                       "invalid_request_error", param="key_alias", code="conflict")


async def generate(services: Services, request: Request, caller: Caller) -> Response:
    """POST /key/generate: a new key; the raw key is in this response and nowhere else."""
    body = await begin(services, request)
    fields = parse_fields(body, KEY_FIELDS, context(services), extra=frozenset({"key"}))
    fields = guardrail_fields.fold(fields, None, configured=configured(services),
                                   admin=caller.is_admin, entity="key")
    raw_key = None if body.get("key") is None else check_custom_key(
        body["key"], services.config.master_key)
    store = store_of(services)
    fields = await check_key_write(caller, store, await inherit(store, fields))
    fields = schedule(fields, services.clock_ms())
    await require_team(store, fields.get("team_id"))
    await require_alias_free(store, fields.get("key_alias"))
    if raw_key is not None:
        await require_unused(store, raw_key, "key")
    with sql("create key"):
        raw, row = await store.create_key(raw_key=raw_key, **fields)
    # A chosen key may have been tried before, and be remembered as unknown.
    headers = await announce(services, ("key", row.token_hash)) if raw_key else {}
    return Response.json({**render_row(row), "key": raw}, headers=headers)


async def writable(services: Services, caller: Caller, ref: str) -> KeyRow:
    """The key ``ref`` names, if the caller may change it (404 / 403). A checkpoint."""
    row = await find_key(store_of(services), ref)
    if row is None or not caller.may_read_key(row):
        raise not_found("key", "(given)", "key")
    if not caller.may_write_key(row):
        raise forbidden("change this key")
    return row


async def apply_update(services: Services, caller: Caller, row: KeyRow,
                       fields: dict[str, Any]) -> KeyRow:
    """Change ``fields`` of ``row`` (a key the caller may change); the new row. Not
    announced yet. A checkpoint."""
    store = store_of(services)
    fields = guardrail_fields.fold(fields, row.metadata, configured=configured(services),
                                   admin=caller.is_admin, entity="key")
    fields = await check_key_write(caller, store, await inherit(store, fields, row), row)
    fields = schedule(fields, services.clock_ms(), row)
    await require_alias_free(store, fields.get("key_alias"), row.token_hash)
    with sql("update key"):
        updated = await store.update_key(row.token_hash, **fields)
    if updated is None:  # deleted meanwhile
        raise not_found("key", "(given)", "key")
    return updated


async def _update(services: Services, caller: Caller, ref: str, fields: dict[str, Any]
                  ) -> Response:
    updated = await apply_update(services, caller, await writable(services, caller, ref),
                                 fields)
    headers = await announce(services, ("key", updated.token_hash))
    return Response.json(render_row(updated), headers=headers)


async def update(services: Services, request: Request, caller: Caller) -> Response:
    """POST /key/update: ``key`` (raw or hash) plus the fields to change."""
    body = await begin(services, request)
    ref = required_str(body, "key")
    fields = parse_fields(body, KEY_FIELDS, context(services), extra=frozenset({"key"}))
    await require_team(store_of(services), fields.get("team_id"))
    return await _update(services, caller, ref, fields)


async def block(services: Services, request: Request, caller: Caller) -> Response:
    """POST /key/block: ``{"key": ...}``; refused everywhere within a second."""
    return await _set_blocked(services, request, caller, blocked=True)


async def unblock(services: Services, request: Request, caller: Caller) -> Response:
    """POST /key/unblock: ``{"key": ...}``."""
    return await _set_blocked(services, request, caller, blocked=False)


async def _set_blocked(services: Services, request: Request, caller: Caller, *,
                       blocked: bool) -> Response:
    body = await begin(services, request)
    only(body, "key")
    return await _update(services, caller, required_str(body, "key"), {"blocked": blocked})


async def delete(services: Services, request: Request, caller: Caller) -> Response:
    """POST /key/delete: ``{"keys": [raw keys or hashes]}``; all exist, or nothing happens."""
    body = await begin(services, request)
    only(body, "keys", "key_aliases")
    store = store_of(services)
    refs = str_list(body, "keys") if "keys" in body or "key_aliases" not in body else []
    with sql("look up keys"):
        found = await store.get_keys([c for ref in refs for c in key_candidates(ref)])
        for alias in str_list(body, "key_aliases") if "key_aliases" in body else []:
            rows, _ = await store.list_keys(key_alias=alias, page=1, size=1)
            refs.append(rows[0].token_hash if rows else "")
            found.update({r.token_hash: r for r in rows})
        # A rotated key named by its current secret: found under that secret's hash.
        lost = [c for ref in refs if ref and not any(c in found for c in key_candidates(ref))
                for c in key_candidates(ref)]
        for secret, (row, ends) in (await store.keys_by_secret(lost)).items():
            if ends is None:
                found[secret] = row
    hashes: list[str] = []
    missing: list[int] = []
    for i, ref in enumerate(refs):
        match = next((c for c in key_candidates(ref) if c in found), None) if ref else None
        if match is None and caller.sees_all:
            missing.append(i)
        elif match is None or not caller.may_write_key(found[match]):
            # LiteLLM's 403, the same whether or not the key exists; nothing is deleted.
            raise forbidden(f"delete key #{i} (not yours, or no such key); nothing was "
                            "deleted")
        else:
            hashes.append(found[match].token_hash)
    if missing:
        # Never echo what was sent: it may be a raw key.
        raise ApiError(404, f"key(s) not found: #{', #'.join(map(str, missing))}; "
                       "nothing was deleted", "not_found_error", param="keys")
    hashes = list(dict.fromkeys(hashes))
    # Every hash the keys may be remembered under (a rotated key's secrets too).
    by_id = {r.token_hash: r for r in found.values()}
    remembered = [h for t in hashes for h in (
        t, by_id[t].secret_hash, by_id[t].previous_secret_hash) if h]
    with sql("delete keys"):
        await store.delete_keys(hashes)
    headers = await announce(services, *(("key", h) for h in dict.fromkeys(remembered)))
    return Response.json({"deleted_keys": hashes}, headers=headers)


async def info(services: Services, request: Request, caller: Caller) -> Response:
    """GET /key/info?key=: the key (by hash), its limits and its spend. Without ``key``,
    the calling key itself (LiteLLM's self-lookup)."""
    ref = request.query.get("key") or caller.key_hash
    if not ref:
        raise ApiError(400, "missing query parameter 'key' (a key or its hash)", param="key")
    row = await find_key(store_of(services), ref)
    if row is None or not caller.may_read_key(row):
        raise not_found("key", "(given)", "key")
    states, headers = await budget_states(services, [key_principal(row)])
    return Response.json(
        {"key": row.token_hash, "info": {**render_row(row), **render_budget(states[0])}},
        headers=headers,
    )


async def list_keys(services: Services, request: Request, caller: Caller) -> Response:
    """GET /key/list?team_id=&user_id=&key_alias=&page=&size=&return_full_object=.

    As in LiteLLM, ``keys`` holds the hashes unless ``return_full_object=true``. Users
    who are not admins or viewers list their own keys, or their team's as its admin.
    """
    page, size = paging(request.query)
    full = request.query.get("return_full_object", "").lower() in ("1", "true", "yes")
    team_id = request.query.get("team_id") or None
    user_id = request.query.get("user_id") or None
    if not caller.sees_all:
        if team_id is not None and team_id in caller.admin_of:
            pass
        elif caller.user_id is not None and user_id in (None, caller.user_id):
            user_id = caller.user_id
        else:
            raise forbidden("list these keys")
    with sql("list keys"):
        rows, total = await store_of(services).list_keys(
            team_id=team_id, user_id=user_id,
            key_alias=request.query.get("key_alias") or None, page=page, size=size,
        )
    return Response.json({
        "keys": [render_row(r) if full else r.token_hash for r in rows],
        "total_count": total,
        "current_page": page,
        "total_pages": page_count(total, size),
    })
