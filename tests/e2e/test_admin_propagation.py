"""Two gateways sharing one Redis and one SQL database: an admin change made through one
takes effect on the other within a second, even where the other had the identity cached
in memory (its TTL is 60 s: only the announcement can explain a faster change).

Each test runs twice: on a shared SQLite file, then on PostgreSQL (a fresh schema; skipped
with the reason when the server is unreachable), the many-instance deployment.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import openai
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from tests.e2e.test_admin_api import (
    Admin,
    admin_client,
    chat,
    poll,
    status_of,
)
from tests.integration.conftest import (  # noqa: F401  (fixtures)
    postgres_base_url,
    postgres_target,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@asynccontextmanager
async def two_gateways(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
                       upstream_url: str) -> AsyncIterator[tuple[Gateway, Gateway, Admin]]:
    """Gateways A and B (own state folders, shared Redis and SQL: a SQLite file when
    ``request.param`` says so, else PostgreSQL), and A's admin API."""
    if request.param == "sqlite":
        database_url = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        database_url = request.getfixturevalue("postgres_target").url
    shared = {"general_settings": {"database_url": database_url}}
    config_a = gateway_config(tmp_path / "a", redis_url, upstream_url, **shared)
    config_b = gateway_config(tmp_path / "b", redis_url, upstream_url, **shared)
    with trio.fail_after(120):
        async with running_gateway(config_a) as a, running_gateway(config_b) as b, \
                admin_client(a) as api:
            yield a, b, api


@pytest.fixture(params=["sqlite", "postgresql"])
async def pair(
    request: pytest.FixtureRequest, tmp_path: Path, redis: RespBackend, redis_url: str,
    upstream: FakeUpstream,
) -> AsyncIterator[tuple[Gateway, Gateway, Admin]]:
    """Gateways A and B (own state folders, shared Redis and SQL), and A's admin API."""
    async with two_gateways(request, tmp_path, redis_url, upstream.base_url) as (a, b, api):
        assert b.services.config.settings.governance.identity_ttl_s >= 60
        yield a, b, api


async def test_a_key_blocked_on_a_is_refused_by_b_within_a_second(
    pair: tuple[Gateway, Gateway, Admin]
) -> None:
    _a, b, api = pair
    key = (await api.post("/key/generate", {}))["key"]
    assert (await chat(b, key)).choices  # B caches the identity in memory
    await api.post("/key/update", {"key": key, "blocked": True})

    async def refused() -> bool:
        return await status_of(b, key) == 401

    assert await poll(refused, timeout_s=5) < 1.0
    await api.post("/key/unblock", {"key": key})

    async def accepted() -> bool:
        return await status_of(b, key) == 200

    assert await poll(accepted, timeout_s=5) < 1.0
    await api.post("/key/delete", {"keys": [key]})
    assert await poll(refused, timeout_s=5) < 1.0


async def test_a_team_model_change_on_a_applies_on_b_within_a_second(
    pair: tuple[Gateway, Gateway, Admin]
) -> None:
    _a, b, api = pair
    await api.post("/team/new", {"team_id": "ml", "models": ["gpt-test", "claude-test"]})
    key = (await api.post("/key/generate", {"team_id": "ml"}))["key"]
    assert (await chat(b, key, "claude-test")).choices
    await api.post("/team/update", {"team_id": "ml", "models": ["gpt-test"]})

    async def forbidden() -> bool:
        return await status_of(b, key, "claude-test") == 403

    assert await poll(forbidden, timeout_s=5) < 1.0
    assert (await chat(b, key, "gpt-test")).choices


async def test_a_budget_raised_on_a_lets_the_key_in_on_b_within_a_second(
    pair: tuple[Gateway, Gateway, Admin]
) -> None:
    _a, b, api = pair
    key = (await api.post("/key/generate", {"max_budget": "0.000001"}))["key"]
    assert (await chat(b, key)).choices

    async def exceeded() -> bool:
        try:
            await chat(b, key)
        except openai.BadRequestError as exc:
            return exc.code == "budget_exceeded"
        return False

    await poll(exceeded, timeout_s=5, interval_s=0.1)
    await api.post("/key/update", {"key": key, "max_budget": 100})

    async def accepted() -> bool:
        return await status_of(b, key) == 200

    assert await poll(accepted, timeout_s=5) < 1.0
    # Both gateways read the same spend counters: A's info shows what B spent.
    info = (await api.get("/key/info", key=key))["info"]
    assert info["spend_nanousd"] > 1000 and info["max_budget_nanousd"] == 100_000_000_000
