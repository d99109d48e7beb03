"""LiteLLM's dashboard spend routes over real HTTP, on SQLite and PostgreSQL:
``/global/spend``, ``/global/spend/{logs,keys,models,teams,end_users,tags,provider}`` and
``/spend/tags``, with spend from real requests through the gateway (exact sums), who may
call them, their 400s; and the 400 ``unsupported_feature`` of LiteLLM's configuration
routes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway, spend_rows
from tests.e2e.test_admin_api import MESSAGES, Admin, admin_client, sdk
from tests.integration.conftest import (  # noqa: F401  (fixtures)
    postgres_base_url,
    postgres_target,
)
from triogate.api.admin.fields import usd
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.store import SpendLogRow
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

#: Every new route, as (method, path).
ROUTES = [
    ("GET", "/global/spend"),
    ("GET", "/global/spend/logs"),
    ("GET", "/global/spend/keys"),
    ("GET", "/global/spend/models"),
    ("GET", "/global/spend/teams"),
    ("GET", "/global/spend/end_users"),
    ("POST", "/global/spend/end_users"),
    ("GET", "/global/spend/tags"),
    ("GET", "/spend/tags"),
    ("GET", "/global/spend/provider"),
]


@pytest.fixture(params=["sqlite", "postgresql"])
async def spend_gateway(request: pytest.FixtureRequest, tmp_path: Path, redis: RespBackend,
                        redis_url: str, upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """The test gateway on a SQLite file, then on PostgreSQL."""
    if request.param == "sqlite":
        database_url = f"sqlite:///{tmp_path / 'spend.db'}"
    else:
        database_url = request.getfixturevalue("postgres_target").url
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            general_settings={"database_url": database_url})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            assert gw.services.store is not None
            assert gw.services.store.dialect == request.param
            yield gw


@pytest.fixture
async def admin(spend_gateway: Gateway) -> AsyncIterator[Admin]:
    async with admin_client(spend_gateway) as client:
        yield client


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def _sum(rows: list[SpendLogRow]) -> int:
    return sum(r.cost_nanousd for r in rows)


async def _ask(gateway: Gateway, key: str, model: str, *, tags: list[str] | None = None,
               user: str | None = None) -> None:
    extra: dict[str, Any] = {"metadata": {"tags": tags}} if tags else {}
    if user:
        extra["user"] = user
    with trio.fail_after(20):
        await sdk(gateway, key).chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=20,  # type: ignore[arg-type]
            extra_body=extra)


async def _traffic(gateway: Gateway, api: Admin) -> tuple[str, str, list[SpendLogRow]]:
    """A team key (two calls, tagged) and a loose key (one call for customer palantir);
    the keys and the spend rows."""
    await api.post("/team/new", {"team_id": "t-prod", "team_alias": "Prod Team"})
    prod = (await api.post("/key/generate", {"team_id": "t-prod", "key_alias": "prod-key"})
            )["key"]
    loose = (await api.post("/key/generate", {}))["key"]
    await _ask(gateway, prod, "gpt-test", tags=["nightly", "ci"])
    await _ask(gateway, prod, "claude-test", tags=["nightly"])
    await _ask(gateway, loose, "gpt-test", user="palantir")
    rows = await spend_rows(gateway, 3)
    assert all(r.cost_nanousd > 0 for r in rows)
    return prod, loose, rows


async def test_global_spend_routes_sum_the_spend_logs(spend_gateway: Gateway,
                                                      admin: Admin) -> None:
    gw, api = spend_gateway, admin
    prod, loose, rows = await _traffic(gw, api)
    total = _sum(rows)
    prod_rows = [r for r in rows if r.key_hash == hash_key(prod)]
    loose_rows = [r for r in rows if r.key_hash == hash_key(loose)]

    assert await api.get("/global/spend") == {
        "spend": usd(total), "spend_nanousd": total, "max_budget": 0.0,
        "max_budget_nanousd": 0}
    assert await api.get("/global/spend", start_date="2020-01-01",
                         end_date="2020-01-31") == {
        "spend": 0.0, "spend_nanousd": 0, "max_budget": 0.0, "max_budget_nanousd": 0}

    assert await api.get("/global/spend/logs") == [
        {"date": _today(), "spend": usd(total), "spend_nanousd": total}]
    assert await api.get("/global/spend/logs", api_key=prod) == [
        {"date": _today(), "spend": usd(_sum(prod_rows)), "spend_nanousd": _sum(prod_rows),
         "api_key": hash_key(prod)}]

    keys = await api.get("/global/spend/keys")
    assert [k["total_spend_nanousd"] for k in keys] == sorted(
        [_sum(prod_rows), _sum(loose_rows)], reverse=True)
    by_key = {k["api_key"]: k for k in keys}
    assert by_key[hash_key(prod)]["key_alias"] == "prod-key"
    assert by_key[hash_key(prod)]["team_id"] == "t-prod"
    assert by_key[hash_key(prod)]["key_name"].startswith("sk-")
    assert by_key[hash_key(loose)]["total_spend"] == usd(_sum(loose_rows))
    assert await api.get("/global/spend/keys", limit=1) == keys[:1]

    models: dict[str, int] = {}
    for r in rows:
        assert r.upstream_model
        models[r.upstream_model] = models.get(r.upstream_model, 0) + r.cost_nanousd
    found = await api.get("/global/spend/models")
    assert {m["model"]: m["total_spend_nanousd"] for m in found} == models
    assert [m["total_spend_nanousd"] for m in found] == sorted(models.values(), reverse=True)
    assert await api.get("/global/spend/models", limit=1) == found[:1]


async def test_global_spend_teams_end_users_tags_and_providers(spend_gateway: Gateway,
                                                               admin: Admin) -> None:
    gw, api = spend_gateway, admin
    prod, loose, rows = await _traffic(gw, api)
    prod_rows = [r for r in rows if r.key_hash == hash_key(prod)]
    loose_rows = [r for r in rows if r.key_hash == hash_key(loose)]

    teams = await api.get("/global/spend/teams")
    assert teams["daily_spend"] == [{"date": _today(), "Prod Team": usd(_sum(prod_rows)),
                                     "Unassigned": usd(_sum(loose_rows))}]
    assert teams["teams"] == ["Prod Team", "Unassigned"]
    assert {t["team_id"]: t["total_spend_nanousd"] for t in teams["total_spend_per_team"]
            } == {"Prod Team": _sum(prod_rows), "Unassigned": _sum(loose_rows)}

    customers = await api.get("/global/spend/end_users")
    assert {(c["end_user"], c["total_count"], c["total_spend_nanousd"]) for c in customers
            } == {("palantir", 1, _sum(loose_rows)), (None, 2, _sum(prod_rows))}
    assert await api.post("/global/spend/end_users", {}) == customers
    with trio.fail_after(20):  # LiteLLM's body is optional
        bare = await api.http.post("/global/spend/end_users")
    assert bare.status_code == 200 and bare.json() == customers
    (palantir,) = await api.post("/global/spend/end_users", {"api_key": loose})
    assert palantir["end_user"] == "palantir"
    assert palantir["total_spend"] == usd(_sum(loose_rows))
    assert await api.get("/global/spend/end_users", api_key=hash_key(loose)) == [palantir]
    assert await api.post("/global/spend/end_users", {
        "startTime": "2020-01-01T00:00:00", "endTime": "2020-01-02T00:00:00"}) == []

    gpt = [r for r in prod_rows if r.model_group == "gpt-test"]
    day = {"start_date": _today(), "end_date": _today()}
    spend_per_tag = (await api.get("/global/spend/tags", **day))["spend_per_tag"]
    assert spend_per_tag == [
        {"name": "nightly", "spend": usd(_sum(prod_rows)), "spend_nanousd": _sum(prod_rows),
         "log_count": 2},
        {"name": "ci", "spend": usd(_sum(gpt)), "spend_nanousd": _sum(gpt), "log_count": 1}]
    assert (await api.get("/global/spend/tags", **day, tags="ci"))["spend_per_tag"] == (
        spend_per_tag[1:])
    assert (await api.get("/global/spend/tags", **day, tags="all-tags,ci"))[
        "spend_per_tag"] == spend_per_tag
    assert await api.get("/global/spend/tags", start_date="2020-01-01",
                         end_date="2020-01-31") == {"spend_per_tag": []}
    assert await api.get("/spend/tags") == [
        {"individual_request_tag": t["name"], "log_count": t["log_count"],
         "total_spend": t["spend"], "total_spend_nanousd": t["spend_nanousd"]}
        for t in spend_per_tag]

    providers: dict[str, int] = {}
    by_id = {d.id: d.provider for d in gw.services.config.deployments}
    for r in rows:
        assert r.deployment_id is not None
        providers[by_id[r.deployment_id]] = providers.get(by_id[r.deployment_id], 0) + (
            r.cost_nanousd)
    assert set(providers) == {"openai", "anthropic"}
    found = await api.get("/global/spend/provider", **day)
    assert {p["provider"]: p["spend_nanousd"] for p in found} == providers
    assert all(p["spend"] == usd(p["spend_nanousd"]) for p in found)


async def test_viewers_may_read_global_spend_internal_users_may_not(
        spend_gateway: Gateway, admin: Admin) -> None:
    viewer = await admin.post("/user/new", {"user_id": "v", "user_role": "proxy_admin_viewer"})
    internal = await admin.post("/user/new", {"user_id": "u", "user_role": "internal_user"})
    day = {"start_date": _today(), "end_date": _today()}
    for key, status in ((viewer["key"], 200), (internal["key"], 403)):
        async with httpx.AsyncClient(base_url=spend_gateway.url,
                                     headers={"authorization": f"Bearer {key}"}) as http:
            for method, path in ROUTES:
                with trio.fail_after(20):
                    response = await http.request(method, path, params=day)
                assert response.status_code == status, (path, response.text)
                if status == 403:
                    assert response.json()["error"]["type"] == "permission_error"


#: (method, path, query, body: JSON, raw bytes or None, the error's param or None).
BAD: list[tuple[str, str, dict[str, str], Any, str | None]] = [
    ("GET", "/global/spend/keys", {"limit": "0"}, None, "limit"),
    ("GET", "/global/spend/keys", {"limit": "ten"}, None, "limit"),
    ("GET", "/global/spend/models", {"limit": "-1"}, None, "limit"),
    ("GET", "/global/spend/models", {"limit": "99999999999"}, None, "limit"),
    ("GET", "/global/spend/tags", {"end_date": "2024-01-31"}, None, "start_date"),
    ("GET", "/global/spend/provider", {"start_date": "2024-01-01"}, None, "end_date"),
    ("GET", "/global/spend/provider", {"start_date": "2024-02-01", "end_date": "2024-01-01"},
     None, "start_date"),
    ("GET", "/global/spend/logs", {"start_date": "yesterday"}, None, "start_date"),
    ("GET", "/global/spend", {"end_date": "2020-01-01"}, None, "end_date"),
    ("GET", "/global/spend/teams", {"end_date": "2024-13-45"}, None, "end_date"),
    ("GET", "/spend/tags", {"start_date": "2024-02-01", "end_date": "2024-01-01"}, None,
     "start_date"),
    ("GET", "/global/spend/end_users", {"limit": "0"}, None, "limit"),
    ("POST", "/global/spend/end_users", {}, {"startTime": "last week"}, "startTime"),
    ("POST", "/global/spend/end_users", {}, {"startTime": "2024-02-01",
                                             "endTime": "2024-01-01"}, "startTime"),
    ("POST", "/global/spend/end_users", {}, {"api_key": 42}, "api_key"),
    ("POST", "/global/spend/end_users", {}, {"start_time": "2024-01-01"}, None),
    ("POST", "/global/spend/end_users", {}, [1], None),
    ("POST", "/global/spend/end_users", {}, b"{not json", None),
]


async def test_bad_parameters_are_400s(spend_gateway: Gateway, admin: Admin) -> None:
    for method, path, params, body, param in BAD:
        sent: dict[str, Any] = {"content": body} if isinstance(body, bytes) else (
            {} if body is None else {"json": body})
        with trio.fail_after(20):
            response = await admin.http.request(method, path, params=params, **sent)
        assert response.status_code == 400, (path, params, body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        if param is not None:
            assert error["param"] == param, (path, params, body, error)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/routes"),
    ("GET", "/settings"),
    ("GET", "/get/config/callbacks"),
    ("GET", "/config/yaml"),
    ("GET", "/config/list"),
    ("GET", "/config/field/info"),
    ("POST", "/config/update"),
    ("POST", "/config/field/update"),
    ("POST", "/config/field/delete"),
    ("POST", "/config/callback/delete"),
])
async def test_litellm_config_routes_are_unsupported_for_every_caller(
        gateway: Gateway, api: Admin, method: str, path: str) -> None:
    key = (await api.post("/key/generate", {}))["key"]
    for who in (None, "sk-wrong", key, "sk-test-master"):
        headers = {"authorization": f"Bearer {who}"} if who else {}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers) as http:
            with trio.fail_after(20):
                response = await http.request(method, path, json={"field_name": "x"})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_feature"
        assert "triogate does not have" in error["message"]
