"""What every admin handler does around its query: auth, SQL errors, propagation, spend.

* :func:`begin` reads the body (size-limited); ``roles.authorize`` ran before it.
* :func:`sql` maps the store's failures: a conflict is a 409, anything else a 503 whose
  message names no table, statement or secret (the details go to the log).
* :func:`announce` tells every gateway process about a change (identity generation
  bump, Redis rows dropped, pub/sub), so it takes effect everywhere within a second.
  When Redis is down the SQL change still stands: the response is a 200 with
  ``x-triogate-degraded: redis`` (memory entries elsewhere expire on their own).
* :func:`budget_states` reads the current period's spend of several principals in one
  batch scope: one Redis round trip however many there are.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from triogate.api.admin.converters import FieldContext
from triogate.api.errors import ApiError
from triogate.batch import BackendUnavailable, BatchError, open_batch_scope
from triogate.errors import StoreError
from triogate.governance.budgets import BudgetState, budget_state
from triogate.store import StoreConflict

if TYPE_CHECKING:
    from collections.abc import Iterator

    from triogate.api.http import Request
    from triogate.api.services import Services
    from triogate.governance.principals import Principal
    from triogate.store import Store

logger = logging.getLogger("triogate.api.admin")

DEGRADED = {"x-triogate-degraded": "redis"}


def store_of(services: Services) -> Store:
    """The SQL store; 503 when the gateway runs without one."""
    if services.store is None:
        raise ApiError(503, "the admin API needs the SQL store, which is not configured",
                       "service_unavailable")
    return services.store


async def begin(services: Services, request: Request) -> dict[str, Any]:
    """The JSON body (size-limited; the caller was authorized by ``roles``). A checkpoint."""
    return await request.json(services.config.settings.max_body_bytes)


def context(services: Services) -> FieldContext:
    """Model groups and the clock, for field converters."""
    return FieldContext(groups=frozenset(services.config.groups), now_ms=services.clock_ms())


@contextmanager
def sql(what: str) -> Iterator[None]:
    """Map store failures around one admin operation (``what``: "create team 'x'").

    Raises:
        ApiError: 409 if the id already exists; 503 if the database failed.
    """
    try:
        yield
    except StoreConflict:
        raise ApiError(409, f"cannot {what}: it already exists", "invalid_request_error",
                       code="conflict") from None
    except StoreError as exc:
        logger.error("admin: %s failed: %s", what, exc)
        raise ApiError(503, f"cannot {what}: the database is unavailable; try again shortly",
                       "service_unavailable") from None


def not_found(kind: str, ident: str, param: str) -> ApiError:
    """404 for a missing entity (ids are shown; keys only as their hash's prefix)."""
    return ApiError(404, f"{kind} '{ident}' not found", "not_found_error", param=param)


async def announce(services: Services, *changes: tuple[str, str]) -> dict[str, str]:
    """Propagate ``changes`` ((kind, id) pairs) to every process; the response headers.

    A checkpoint. Never fails the request: the SQL change already stands.
    """
    if services.identities is None or not changes:
        return {}
    try:
        await services.identities.announce(*changes)
    except BackendUnavailable as exc:
        logger.warning("admin change saved but not announced yet (Redis unavailable: %s); "
                       "retried until Redis takes it", exc.reason)
        return dict(DEGRADED)
    except StoreError as exc:
        # The change is saved; finding a team's or user's keys to drop failed.
        logger.warning("admin change saved but not announced yet (%s); retried", exc)
        return dict(DEGRADED)
    return {}


async def budget_states(
    services: Services, principals: list[Principal]
) -> tuple[list[BudgetState | None], dict[str, str]]:
    """Each principal's spend this period (None where Redis did not answer), and headers.

    One batch scope: all the HMGETs leave in one pipeline. A checkpoint.
    """
    if not principals:
        return [], {}
    now_ms = services.clock_ms()
    backend = services.checks.backend
    async with open_batch_scope(services.backends) as scope:
        parts = [
            scope.start_participant(
                partial(budget_state, scope.batch, p, now_ms=now_ms, backend=backend),
                name=f"budget:{p.kind}",
            )
            for p in principals
        ]
    states: list[BudgetState | None] = []
    degraded = False
    for part, principal in zip(parts, principals, strict=True):
        if principal.limits.max_budget_nanousd is None and services.store is not None:
            # No budget, so no counter in Redis: the spend logs hold what it spent.
            states.append(await _logged_spend(services.store, principal))
            continue
        try:
            states.append(part.result())
        except (BatchError, ValueError, TypeError) as exc:
            logger.warning("admin: budget state unreadable: %s", exc)
            states.append(None)
            degraded = True
    return states, dict(DEGRADED) if degraded else {}


#: The spend-log filter naming each kind of principal.
_SPEND_FILTER = {"key": "key_hash", "team": "team_id", "user": "user_id",
                 "end_user": "end_user", "tag": "tag"}


async def _logged_spend(store: Store, principal: Principal) -> BudgetState | None:
    """Lifetime spend from the spend logs (principals without a budget). A checkpoint."""
    try:
        totals = await store.spend_totals(**{_SPEND_FILTER[principal.kind]: principal.id})
    except StoreError as exc:
        logger.warning("admin: spend of %s unreadable: %s", principal.kind, exc)
        return None
    return BudgetState(period=0, period_end_ms=None, spend_nanousd=totals.cost_nanousd,
                       reserved_nanousd=0, max_budget_nanousd=None)
