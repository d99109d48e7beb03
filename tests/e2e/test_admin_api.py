"""The admin API over real HTTP against a running gateway (real Redis, SQLite, upstreams).

Also home of the helpers the other admin e2e modules import: :class:`Admin`, a thin
client asserting status codes, and ``chat``.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
import sqlalchemy as sa
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from triogate.store import SpendLogRow, hash_key
from triogate.store.schema import metadata

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

MESSAGES = [{"role": "user", "content": "Say something short about trio."}]


class Admin:
    """The admin API of one gateway, asserting the expected status of each call."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def post(self, path: str, body: Any, *, status: int = 200) -> Any:
        with trio.fail_after(20):
            response = await self.http.post(path, json=body)
        assert response.status_code == status, response.text
        return response.json()

    async def get(self, path: str, *, status: int = 200, **params: Any) -> Any:
        with trio.fail_after(20):
            response = await self.http.get(path, params=params)
        assert response.status_code == status, response.text
        return response.json()


@asynccontextmanager
async def admin_client(gateway: Gateway, key: str | None = MASTER_KEY) -> AsyncIterator[Admin]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers) as http:
        yield Admin(http)


def sdk(gateway: Gateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)


async def chat(gateway: Gateway, key: str, model: str = "gpt-test") -> Any:
    with trio.fail_after(20):
        return await sdk(gateway, key).chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=20)  # type: ignore[arg-type]


async def poll(predicate: Any, *, timeout_s: float, interval_s: float = 0.02) -> float:
    """Await ``predicate()`` until it is true; return the seconds it took (fails on timeout)."""
    start = time.monotonic()
    with trio.fail_after(timeout_s):
        while True:
            if await predicate():
                return time.monotonic() - start
            await trio.sleep(interval_s)


async def status_of(gateway: Gateway, key: str, model: str = "gpt-test") -> int:
    try:
        await chat(gateway, key, model)
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


# --------------------------------------------------------------------------- auth


async def test_admin_routes_need_a_known_key_with_the_right_role(gateway: Gateway,
                                                                  api: Admin) -> None:
    key = (await api.post("/key/generate", {}))["key"]  # no user: role "key"
    for who, status in ((None, 401), ("sk-nobody", 401), (key, 403)):
        async with admin_client(gateway, who) as other:
            await other.post("/key/generate", {}, status=status)
            error = await other.get("/team/list", status=status)
            assert error["error"]["type"] in ("authentication_error", "permission_error")


# --------------------------------------------------------------------------- keys


async def test_key_generate_info_update_list_delete(api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng"})
    created = await api.post("/key/generate", {
        "key_alias": "ci", "team_id": "eng", "user_id": "u1", "models": ["gpt-test"],
        "max_budget": "0.1", "budget_duration": "30d", "tpm_limit": 1000, "rpm_limit": 10,
        "max_parallel_requests": 3, "model_rpm_limit": {"gpt-test": 5},
        "metadata": {"owner": "ci"}, "tags": ["nightly"], "duration": "1d",
    })
    raw, token = created["key"], created["token"]
    assert raw.startswith("sk-") and token == hash_key(raw)
    assert created["key_name"] == created["key_hint"] == f"sk-...{raw[-4:]}"
    assert created["max_budget_nanousd"] == 100_000_000 and created["max_budget"] == 0.1
    assert created["models"] == ["gpt-test"] and created["tags"] == ["nightly"]
    assert created["model_rpm_limit"] == {"gpt-test": 5}
    assert abs(created["expires_at_ms"] - created["created_at_ms"] - 86_400_000) < 1000
    assert created["expires"].endswith("Z")

    for ref in (raw, token):
        info = await api.get("/key/info", key=ref)
        assert info["key"] == token
        assert info["info"]["spend_nanousd"] == 0 and info["info"]["spend"] == 0.0
        assert info["info"]["budget_reset_at"] is not None
        assert raw not in str(info)

    updated = await api.post("/key/update", {"key": token, "key_alias": "ci-2",
                                             "max_budget": 2.5, "rpm_limit": None})
    assert updated["key_alias"] == "ci-2" and updated["max_budget_nanousd"] == 2_500_000_000
    assert updated["rpm_limit"] is None and "key" not in updated

    other = await api.post("/key/generate", {"user_id": "u2"})
    listing = await api.get("/key/list")
    assert listing["keys"] == [token, other["token"]] and listing["total_count"] == 2
    assert (await api.get("/key/list", team_id="eng"))["keys"] == [token]
    assert (await api.get("/key/list", user_id="u2"))["keys"] == [other["token"]]
    paged = await api.get("/key/list", page=2, size=1, return_full_object="true")
    assert paged["current_page"] == 2 and paged["total_pages"] == 2
    assert paged["keys"][0]["token"] == other["token"]
    assert raw not in str(listing) and raw not in str(paged)

    deleted = await api.post("/key/delete", {"keys": [raw, other["token"]]})
    assert sorted(deleted["deleted_keys"]) == sorted([token, other["token"]])
    await api.get("/key/info", key=token, status=404)
    error = await api.post("/key/delete", {"keys": [raw]}, status=404)
    assert raw not in str(error) and error["error"]["type"] == "not_found_error"
    await api.post("/key/update", {"key": raw, "blocked": True}, status=404)


async def test_custom_key_and_conflict(api: Admin) -> None:
    created = await api.post("/key/generate", {"key": "sk-my-own-key-1234567890"})
    assert created["key"] == "sk-my-own-key-1234567890"
    error = await api.post("/key/generate", {"key": "sk-my-own-key-1234567890"}, status=409)
    assert "already exists" in error["error"]["message"]
    await api.post("/key/generate", {"key": "not-an-sk-key"}, status=400)


# --------------------------------------------------------------------------- entities


async def test_team_crud(api: Admin) -> None:
    team = await api.post("/team/new", {"team_alias": "Research", "models": ["gpt-test"],
                                        "max_budget": 10, "budget_duration": "1mo"})
    team_id = team["team_id"]
    assert len(team_id) == 36 and team["max_budget_nanousd"] == 10_000_000_000
    key = await api.post("/key/generate", {"team_id": team_id})
    info = await api.get("/team/info", team_id=team_id)
    assert info["team_id"] == team_id
    assert info["team_info"]["team_alias"] == "Research"
    assert info["team_info"]["spend_nanousd"] == 0 and info["team_info"]["budget_reset_at"]
    assert [k["token"] for k in info["keys"]] == [key["token"]]
    updated = await api.post("/team/update", {"team_id": team_id, "models": ["claude-test"]})
    assert updated["models"] == ["claude-test"]
    blocked = await api.post("/team/block", {"team_id": team_id})
    assert blocked["blocked"] is True
    await api.post("/team/new", {"team_id": "second"})
    assert [t["team_id"] for t in await api.get("/team/list")] == [team_id, "second"]
    await api.post("/team/new", {"team_id": "second"}, status=409)
    error = await api.post("/team/delete", {"team_ids": ["second", "nope"]}, status=404)
    assert "'nope'" in error["error"]["message"]
    assert len(await api.get("/team/list")) == 2  # nothing was deleted
    assert (await api.post("/team/delete", {"team_ids": [team_id, "second"]}))["deleted"]
    assert await api.get("/team/list") == []
    await api.get("/team/info", team_id=team_id, status=404)
    await api.post("/team/update", {"team_id": team_id, "team_alias": "x"}, status=404)


async def test_user_crud_with_and_without_a_key(gateway: Gateway, api: Admin) -> None:
    user = await api.post("/user/new", {"user_id": "ada", "user_email": "ada@example.com",
                                        "max_budget": "1.5", "key_alias": "ada-key"})
    assert user["user_id"] == "ada" and user["key"].startswith("sk-")
    assert user["token"] == hash_key(user["key"]) and user["key_alias"] == "ada-key"
    assert user["max_budget_nanousd"] == 1_500_000_000
    assert (await chat(gateway, user["key"])).choices
    plain = await api.post("/user/new", {"user_id": "bob", "auto_create_key": False})
    assert "key" not in plain and "token" not in plain
    await api.post("/user/new", {"auto_create_key": False, "duration": "1d"}, status=400)
    info = await api.get("/user/info", user_id="ada")
    assert info["user_info"]["user_email"] == "ada@example.com"
    assert [k["token"] for k in info["keys"]] == [user["token"]]
    assert user["key"] not in str(info)
    updated = await api.post("/user/update", {"user_id": "bob", "user_alias": "Bob"})
    assert updated["user_alias"] == "Bob"
    listing = await api.get("/user/list", size=1)
    assert listing["total"] == 2 and listing["total_pages"] == 2
    assert [u["user_id"] for u in listing["users"]] == ["ada"]
    await api.post("/user/delete", {"user_ids": ["bob"]})
    await api.get("/user/info", user_id="bob", status=404)


async def test_customer_crud(gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {}))["key"]
    with trio.fail_after(20):
        await sdk(gateway, key).chat.completions.create(
            model="gpt-test", messages=MESSAGES, user="acme")  # type: ignore[arg-type]
    created = await api.post("/customer/new", {"user_id": "acme", "alias": "Acme",
                                               "max_budget": 5, "rpm_limit": 60})
    assert created["user_id"] == "acme" and created["max_budget"] == 5.0
    info = await api.get("/customer/info", end_user_id="acme")
    assert info["alias"] == "Acme" and info["litellm_budget_table"]["max_budget"] == 5.0
    # The end user was remembered as unknown by the first request; blocking it now
    # must be seen at once.
    await api.post("/customer/block", {"user_ids": ["acme"]})
    with pytest.raises(openai.PermissionDeniedError):
        with trio.fail_after(20):
            await sdk(gateway, key).chat.completions.create(
                model="gpt-test", messages=MESSAGES, user="acme")  # type: ignore[arg-type]
    await api.post("/customer/unblock", {"user_ids": ["acme"]})
    updated = await api.post("/customer/update", {"user_id": "acme", "alias": "ACME"})
    assert updated["alias"] == "ACME" and updated["blocked"] is False
    assert [c["user_id"] for c in await api.get("/customer/list")] == ["acme"]
    await api.post("/customer/delete", {"user_ids": ["acme"]})
    await api.get("/customer/info", end_user_id="acme", status=404)
    # As in LiteLLM, blocking an end user never seen creates it, blocked.
    blocked = await api.post("/end_user/block", {"user_ids": ["spammer"]})
    assert blocked == {"user_ids": ["spammer"], "blocked": True}
    assert (await api.get("/customer/info", end_user_id="spammer"))["blocked"] is True
    await api.post("/customer/unblock", {"user_ids": ["nobody"]}, status=404)
    await api.post("/customer/new", {"alias": "no id"}, status=400)


async def test_tag_crud(api: Admin) -> None:
    tag = await api.post("/tag/new", {"name": "batch", "description": "nightly jobs",
                                      "max_budget": "0.25", "budget_duration": "1d"})
    assert tag["name"] == "batch" and tag["max_budget_nanousd"] == 250_000_000
    info = await api.get("/tag/info", name="batch")
    assert info["description"] == "nightly jobs" and info["spend_nanousd"] == 0
    many = await api.post("/tag/info", {"names": ["batch"]})
    assert many["batch"]["name"] == "batch"
    assert (await api.post("/tag/update", {"name": "batch", "rpm_limit": 5}))["rpm_limit"] == 5
    assert [t["name"] for t in await api.get("/tag/list")] == ["batch"]
    await api.post("/tag/new", {"name": "batch", "models": ["gpt-test"]}, status=400)
    await api.post("/tag/delete", {"name": "batch"})
    await api.get("/tag/info", name="batch", status=404)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"max_budgett": 1}, "max_budgett", "unknown field 'max_budgett'"),
    ({"budget_duration": "30x"}, "budget_duration", "invalid duration"),
    ({"budget_duration": "0d"}, "budget_duration", "invalid duration"),
    ({"duration": 30}, "duration", "invalid duration"),
    ({"max_budget": "ten"}, "max_budget", "must be a number"),
    ({"max_budget": -1}, "max_budget", "must not be negative"),
    ({"max_budget": True}, "max_budget", "must be a number"),
    ({"max_budget": "NaN"}, "max_budget", "finite"),
    ({"models": "gpt-test"}, "models", "must be a list"),
    ({"model_tpm_limit": {"gpt-test": -5}}, "model_tpm_limit", "non-negative"),
    ({"team_id": "ghost-team"}, "team_id", "team 'ghost-team' does not exist"),
    ({"rpm_limit": "5"}, "rpm_limit", "non-negative integer"),
    ({"rpm_limit": -1}, "rpm_limit", "non-negative integer"),
    ({"metadata": [1]}, "metadata", "must be an object"),
    ({"blocked": "yes"}, "blocked", "must be a boolean"),
    ({"tags": ["ok", 3]}, "tags", "list of non-empty strings"),
    ({"expires": "next tuesday"}, "expires", "ISO 8601"),
    ({"duration": "1d", "expires": "2030-01-01"}, "expires", "together"),
])
async def test_key_generate_validation(api: Admin, body: dict[str, Any], param: str,
                                       words: str) -> None:
    error = (await api.post("/key/generate", body, status=400))["error"]
    assert error["param"] == param
    assert words in error["message"]
    assert (await api.get("/key/list"))["total_count"] == 0


async def test_bodies_that_are_not_objects_or_too_large(gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", [1, 2], status=400)
    response = await api.http.post("/team/new", content=b"{nope")
    assert response.status_code == 400 and "not valid JSON" in response.text
    big = {"metadata": {"blob": "x" * (gateway.services.config.settings.max_body_bytes + 1)}}
    await api.post("/team/new", big, status=413)
    await api.get("/key/list", page=0, status=400)
    await api.get("/spend/logs", start_date="yesterday", status=400)
    await api.get("/key/info", status=400)


async def test_expires_in_the_past_makes_the_key_expire(gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {"expires": "2001-01-01T00:00:00Z"}))["key"]
    with pytest.raises(openai.AuthenticationError, match="expired"):
        await chat(gateway, key)
    await api.post("/key/update", {"key": key, "expires": None})
    assert (await chat(gateway, key)).choices


# --------------------------------------------------------------------------- the loop


async def test_block_and_delete_take_effect_within_a_second(gateway: Gateway,
                                                            api: Admin) -> None:
    key = (await api.post("/key/generate", {"key_alias": "loop"}))["key"]
    assert (await chat(gateway, key)).choices  # the identity is now cached in memory
    await api.post("/key/update", {"key": key, "blocked": True})

    async def refused() -> bool:
        return await status_of(gateway, key) == 401

    assert await poll(refused, timeout_s=5) < 1.0
    with pytest.raises(openai.AuthenticationError, match="blocked"):
        await chat(gateway, key)
    await api.post("/key/unblock", {"key": key})
    assert await status_of(gateway, key) == 200
    await api.post("/key/delete", {"keys": [key]})
    assert await poll(refused, timeout_s=5) < 1.0


async def test_model_access_is_enforced(gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {"models": ["gpt-test"]}))["key"]
    assert (await chat(gateway, key)).choices
    with pytest.raises(openai.PermissionDeniedError, match="claude-test"):
        await chat(gateway, key, "claude-test")
    await api.post("/key/update", {"key": key, "models": []})
    assert (await chat(gateway, key, "claude-test")).choices


async def test_a_tiny_budget_is_exceeded_after_spending_it(gateway: Gateway,
                                                          api: Admin) -> None:
    key = (await api.post("/key/generate", {"max_budget": "0.000001"}))["key"]
    assert (await chat(gateway, key)).choices  # a fresh period admits its first request

    async def exceeded() -> bool:
        try:
            await chat(gateway, key)
        except openai.BadRequestError as exc:
            assert exc.code == "budget_exceeded", exc
            return True
        return False

    await poll(exceeded, timeout_s=5, interval_s=0.1)

    async def charged() -> bool:
        info = await api.get("/key/info", key=key)
        return bool(info["info"]["spend_nanousd"] > 1000)

    await poll(charged, timeout_s=5, interval_s=0.1)
    info = (await api.get("/key/info", key=key))["info"]
    assert info["spend"] == info["spend_nanousd"] / 1e9
    assert info["budget_reset_at"] is None  # a lifetime budget
    # Raising the budget lets the key in again.
    await api.post("/key/update", {"key": key, "max_budget": 100})
    assert (await chat(gateway, key)).choices


async def test_rpm_limit_of_two_refuses_the_third_request(gateway: Gateway,
                                                         api: Admin) -> None:
    key = (await api.post("/key/generate", {"rpm_limit": 2}))["key"]
    assert (await chat(gateway, key)).choices
    assert (await chat(gateway, key)).choices
    with pytest.raises(openai.RateLimitError) as caught:
        await chat(gateway, key)
    retry_after = int(caught.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60


# --------------------------------------------------------------------------- secrets


async def _redis_dump(redis: RespBackend) -> bytes:
    """Every key and value in the test Redis, as one byte string."""
    cursor: Any = b"0"
    keys: list[bytes] = []
    while True:
        reply: Any = (await redis.execute([("SCAN", cursor, "COUNT", 1000)]))[0]
        cursor, found = reply
        keys += found
        if cursor in (b"0", 0):
            break
    out = [b"\n".join(keys)]
    for key in keys:
        kind = (await redis.execute([("TYPE", key)]))[0]
        command = {b"string": ("GET", key), b"hash": ("HGETALL", key),
                   b"zset": ("ZRANGE", key, 0, -1), b"list": ("LRANGE", key, 0, -1),
                   b"set": ("SMEMBERS", key)}.get(kind if isinstance(kind, bytes)
                                                  else str(kind).encode())
        if command is not None:
            out.append(repr((await redis.execute([command]))[0]).encode())
    return b"\n".join(out)


async def test_the_raw_key_is_stored_nowhere(gateway: Gateway, api: Admin,
                                             redis: RespBackend, tmp_path: Path) -> None:
    created = await api.post("/key/generate", {"max_budget": 1, "rpm_limit": 100})
    raw, token = created["key"], created["token"]
    assert (await chat(gateway, raw)).choices
    await api.get("/key/info", key=raw)

    async def logged() -> bool:
        return bool(await api.get("/spend/logs", api_key=raw))

    await poll(logged, timeout_s=10, interval_s=0.1)

    def sql_dump() -> str:
        with gateway.services.store.engine.connect() as conn:  # type: ignore[union-attr]
            return "\n".join(repr(conn.execute(sa.select(t)).all())
                             for t in metadata.sorted_tables)

    dump = await trio.to_thread.run_sync(sql_dump)
    assert token in dump and raw not in dump
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert raw.encode() not in on_disk
    in_redis = await _redis_dump(redis)
    assert token.encode() in in_redis and raw.encode() not in in_redis


# --------------------------------------------------------------------------- degraded


async def test_sql_failure_is_503_without_details(gateway: Gateway, api: Admin) -> None:
    def drop() -> None:
        with gateway.services.store.engine.begin() as conn:  # type: ignore[union-attr]
            conn.exec_driver_sql("DROP TABLE teams")

    await trio.to_thread.run_sync(drop)
    error = (await api.post("/team/new", {"team_id": "t"}, status=503))["error"]
    assert error["type"] == "service_unavailable"
    assert "database" in error["message"]
    assert "teams" not in error["message"] and "INSERT" not in error["message"]
    await api.get("/team/list", status=503)


async def test_redis_down_keeps_the_sql_change_and_says_degraded(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    with trio.socket.socket() as sock:  # a port nothing listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = gateway_config(tmp_path / "state", f"redis://127.0.0.1:{port}", upstream.base_url,
                            triogate={"redis": {"timeout_s": 0.5}})
    with trio.fail_after(60):
        async with running_gateway(config) as gw, admin_client(gw) as api:
            team = await api.http.post("/team/new", json={"team_id": "t1", "max_budget": 1})
            assert team.status_code == 200
            assert team.headers["x-triogate-degraded"] == "redis"
            updated = await api.http.post("/team/update", json={"team_id": "t1",
                                                                "team_alias": "T"})
            assert updated.status_code == 200 and updated.headers["x-triogate-degraded"]
            info = await api.http.get("/team/info", params={"team_id": "t1"})
            assert info.status_code == 200 and info.headers["x-triogate-degraded"] == "redis"
            assert info.json()["team_info"]["team_alias"] == "T"
            assert info.json()["team_info"]["spend"] is None


# --------------------------------------------------------------------------- spend


def _log(request_id: str, *, day: int, cost: int, **fields: Any) -> SpendLogRow:
    start = 1_735_689_600_000 + day * 86_400_000 + 3_600_000  # 2025-01-01T01:00Z + days
    return SpendLogRow(request_id=request_id, api="chat", start_time_ms=start,
                       end_time_ms=start + 250, latency_ms=250, cost_nanousd=cost,
                       input_tokens=10, output_tokens=5, model_group="gpt-test", **fields)


async def test_spend_logs_filters_pages_and_totals(gateway: Gateway, api: Admin) -> None:
    raw = "sk-spend-report-key"
    rows = [
        _log("r1", day=0, cost=100, key_hash=hash_key(raw), team_id="a", tags=("x",)),
        _log("r2", day=0, cost=200, key_hash=hash_key(raw), team_id="a", user_id="u"),
        _log("r3", day=1, cost=300, key_hash="f" * 64, team_id="b", end_user="e",
             tags=("x", "y")),
        _log("r4", day=2, cost=400, key_hash="f" * 64, tags=("y",)),
    ]
    assert await gateway.services.store.insert_spend_logs(rows) == 4  # type: ignore[union-attr]

    listed = await api.get("/spend/logs")  # LiteLLM's shape: a bare array
    assert [log["request_id"] for log in listed] == ["r4", "r3", "r2", "r1"]
    everything = await api.get("/spend/logs/v2")
    assert [log["request_id"] for log in everything["data"]] == ["r4", "r3", "r2", "r1"]
    assert everything["totals"] == {"requests": 4, "input_tokens": 40, "output_tokens": 20,
                                    "spend": 1e-6, "spend_nanousd": 1000}
    first = listed[-1]
    assert first["api_key"] == hash_key(raw) and first["request_tags"] == ["x"]
    assert first["startTime"] == "2025-01-01T01:00:00.000Z" and first["total_tokens"] == 15

    async def ids(**params: Any) -> list[str]:
        return [log["request_id"] for log in await api.get("/spend/logs", **params)]

    assert await ids(request_id="r3") == ["r3"]
    assert await ids(request_id="nope") == []
    assert await ids(api_key=raw) == ["r2", "r1"]
    assert await ids(api_key=hash_key(raw)) == ["r2", "r1"]
    assert await ids(key_hash="f" * 64) == ["r4", "r3"]
    assert await ids(team_id="a") == ["r2", "r1"]
    assert await ids(user_id="u") == ["r2"]
    assert await ids(end_user="e") == ["r3"]
    assert await ids(tag="x") == ["r3", "r1"]
    assert await ids(start_date="2025-01-02") == ["r4", "r3"]
    assert await ids(end_date="2025-01-02") == ["r3", "r2", "r1"]  # a date is inclusive
    assert await ids(start_date="2025-01-02", end_date="2025-01-02") == ["r3"]
    assert await ids(start_date=str(rows[1].start_time_ms),
                     end_date=str(rows[3].start_time_ms)) == ["r3", "r2", "r1"]
    assert await ids(end_date="2025-01-02T00:00:00Z") == ["r2", "r1"]
    assert await ids(page=2, size=3) == ["r1"]
    page = await api.get("/spend/logs/v2", page=2, page_size=3)
    assert [log["request_id"] for log in page["data"]] == ["r1"]
    assert (page["total"], page["page"], page["page_size"], page["total_pages"]) == (4, 2, 3, 2)
    assert page["totals"]["spend_nanousd"] == 1000  # totals cover every page
    assert (await api.get("/spend/logs/ui", page=2, size=3))["data"] == page["data"]
    tagged = await api.get("/spend/logs/v2", tag="y", team_id="b")
    assert tagged["totals"]["spend_nanousd"] == 300

    daily = await api.get("/spend/daily", group_by="team")
    assert [(d["date"], d["group_id"], d["spend_nanousd"]) for d in daily["results"]] == [
        ("2025-01-01", "a", 300), ("2025-01-02", "b", 300), ("2025-01-03", None, 400)]
    by_key = await api.get("/spend/daily", group_by="key", start_date="2025-01-02")
    assert [(d["date"], d["group_id"]) for d in by_key["results"]] == [
        ("2025-01-02", "f" * 64), ("2025-01-03", "f" * 64)]
    await api.get("/spend/daily", group_by="planet", status=400)


async def test_real_requests_reach_the_spend_logs(gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", {"team_id": "logged"})
    key = (await api.post("/key/generate", {"team_id": "logged", "key_alias": "k"}))["key"]
    for _ in range(2):
        await chat(gateway, key)

    async def both() -> bool:
        return len(await api.get("/spend/logs", team_id="logged")) == 2

    await poll(both, timeout_s=10, interval_s=0.1)
    report = await api.get("/spend/logs/v2", api_key=key)
    assert report["totals"]["requests"] == 2 and report["totals"]["spend_nanousd"] > 0
    assert {log["key_alias"] for log in report["data"]} == {"k"}
    daily = await api.get("/spend/daily", group_by="key")
    assert [d["group_id"] for d in daily["results"]] == [hash_key(key)]
    assert daily["results"][0]["spend_nanousd"] == report["totals"]["spend_nanousd"]
