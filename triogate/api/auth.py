"""Who is calling: the master key now; virtual keys through the identity resolver.

The master key is compared in constant time. A request that carries no key, or a key
that is neither the master key nor a known virtual key, is refused with 401 in the
API's own error shape; the key itself never reaches a log line.
"""

from __future__ import annotations

import hmac
from functools import partial
from typing import TYPE_CHECKING

from triogate.api.errors import ApiError
from triogate.governance.decisions import Rejected
from triogate.governance.model_access import ACCESS_GROUP
from triogate.governance.principals import Identity, Principal

if TYPE_CHECKING:
    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.batch import Batch

#: The identity of master-key (and no-key-configured) requests: no governance applies.
MASTER = Identity(key=Principal(kind="key", id="master", alias="master"), master=True)


def is_master(services: Services, key: str | None) -> bool:
    """Whether ``key`` is the master key (constant-time)."""
    master = services.config.master_key
    return master is not None and key is not None and hmac.compare_digest(
        key.encode(), master.encode()
    )


def _missing_key() -> Rejected:
    return Rejected(
        check="auth", reason="missing_key", status=401, error_type="authentication_error",
        message="missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
    )


def _bad_key() -> Rejected:
    return Rejected(
        check="auth", reason="invalid_key", status=401, error_type="authentication_error",
        message="invalid API key",
    )


async def resolve(
    services: Services, batch: Batch, request: Request, group: str | None,
    end_user: str | None, tags: tuple[str, ...] = (),
) -> Identity | Rejected:
    """The auth participant: master key in memory, else the identity resolver.

    With the identity cached in memory this declares nothing and returns at once, so the
    checks that depend on it still join the first round. ``group`` (when given) must be
    one the key, its team and its user may use: 403 otherwise.
    """
    key = request.bearer()
    if services.config.master_key is None and services.identities is None:
        return MASTER  # an open gateway: no key configured (warned at start-up)
    if key is None:
        return _missing_key()
    if is_master(services, key):
        if end_user and services.identities is not None:
            # LiteLLM applies a customer's budget whoever calls: the master key too.
            return await services.identities.resolve_end_user(batch, MASTER, end_user)
        return MASTER
    if services.identities is None:
        return _bad_key()
    return await services.identities.resolve(
        batch, key, group=group, end_user=end_user, tags=tags, now_ms=services.clock_ms(),
        providers=partial(group_providers, services, group or ""),
    )


def group_providers(services: Services, group: str) -> frozenset[str]:
    """What ``models`` entries other than the group's name match on: the providers of
    ``group``'s deployments (``openai/*``) and their access groups (labelled
    ``access_group:<name>``, see ``model_access.model_allowed``)."""
    labels: set[str] = set()
    for d in services.config.deployments:
        if d.group == group:
            labels.add(d.provider)
            labels.update(ACCESS_GROUP + g for g in d.info.get("access_groups", ()))
    return frozenset(labels)


async def authenticate_only(services: Services, request: Request, *,
                            trace_id: str | None = None) -> Identity | None:
    """For routes outside the model flow: the caller's identity, None for the master key.

    ``trace_id`` (a model request's) records the wait, if any, in that request's trace and
    in its count of waits before the model call.

    Raises:
        ApiError: 401 when the key is missing or unknown.
    """
    from triogate.batch import open_batch_scope

    # Run in this task (the scope's host, no nursery), as admission runs it: a task
    # participant would cost a spawn, its first schedule and the nursery's exit.
    async with open_batch_scope(
        services.backends, tracer=services.flush_tracer if trace_id else None,
        trace_id=trace_id, host=True, tasks=False,
    ) as scope:
        who = await scope.run_inline(resolve, services, scope.batch, request, None, None,
                                     name="auth")
    if trace_id:
        request.waits_before_admission += scope.rounds
    result = who.result()
    if isinstance(result, Rejected):
        raise ApiError(result.status, result.message, result.error_type, code=result.reason)
    return None if result.master else result
