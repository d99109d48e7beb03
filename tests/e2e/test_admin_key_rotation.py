"""Key rotation over real HTTP: ``/key/regenerate`` (LiteLLM's body and path forms) and
scheduled rotation (``auto_rotate``, ``rotation_interval``) run by the gateway itself.

A rotated key keeps its id, limits and spend; the old secret is refused at once on every
process (two gateways sharing Redis and SQL), or after the grace period.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from tests.e2e.conftest import gateway_config, running_gateway
from tests.e2e.test_admin_api import Admin, admin_client, chat, poll, status_of
from tests.e2e.test_admin_propagation import two_gateways
from tests.integration.conftest import (  # noqa: F401  (fixtures)
    postgres_base_url,
    postgres_target,
)
from triogate.app import wall_clock_ms
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture(params=["sqlite", "postgresql"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path, redis: RespBackend,
               redis_url: str, upstream: FakeUpstream
               ) -> AsyncIterator[tuple[Gateway, Gateway, Admin]]:
    """Gateways A and B (shared Redis and SQL: a SQLite file, then PostgreSQL), and A's
    admin API."""
    async with two_gateways(request, tmp_path, redis_url, upstream.base_url) as gateways:
        yield gateways


async def test_regenerate_keeps_id_limits_and_spend_and_refuses_the_old_secret_everywhere(
        pair: tuple[Gateway, Gateway, Admin]) -> None:
    a, b, api = pair
    made = await api.post("/key/generate", {"key_alias": "ci", "max_budget": 5,
                                            "models": ["gpt-test"], "rpm_limit": 100})
    old, token = made["key"], made["token"]
    for gateway in (a, b):  # both processes hold the old secret in memory
        assert (await chat(gateway, old)).choices
    spent = (await api.get("/key/info", key=token))["info"]["spend"]
    assert spent > 0

    new = await api.post("/key/regenerate", {"key": old})
    assert new["key"] != old and new["key"].startswith("sk-")
    assert new["token"] == token and new["key_alias"] == "ci"
    assert new["max_budget"] == 5.0 and new["models"] == ["gpt-test"]
    assert new["key_name"] == f"sk-...{new['key'][-4:]}" and new["rotation_count"] == 1
    assert await status_of(a, old) == 401  # the process that made the change: at once

    async def refused_on_b() -> bool:
        return await status_of(b, old) == 401

    assert await poll(refused_on_b, timeout_s=5, interval_s=0.05) < 1.5
    for gateway in (a, b):
        assert (await chat(gateway, new["key"])).choices
    info = (await api.get("/key/info", key=token))["info"]
    assert info["spend"] > spent  # the same counter, still counting
    assert (await api.get("/key/info", key=new["key"]))["key"] == token
    # The old secret no longer names the key for the admin API either way it is used.
    async with admin_client(a, old) as stale:
        await stale.get("/key/info", status=401)
    async with admin_client(a, new["key"]) as fresh:
        assert (await fresh.get("/key/info"))["key"] == token


async def test_the_grace_period_keeps_the_old_secret_working_until_it_ends(
        pair: tuple[Gateway, Gateway, Admin]) -> None:
    a, b, api = pair
    old = (await api.post("/key/generate", {}))["key"]
    assert (await chat(b, old)).choices
    new = await api.post(f"/key/{old}/regenerate", {"grace_period": "2s"})
    assert new["previous_key_valid_until"] is not None
    for gateway in (a, b):
        assert (await chat(gateway, old)).choices
        assert (await chat(gateway, new["key"])).choices

    async def old_refused_on_both() -> bool:
        return all([await status_of(g, old) == 401 for g in (a, b)])

    await poll(old_refused_on_both, timeout_s=10, interval_s=0.2)
    assert (await chat(b, new["key"])).choices
    # A second rotation without grace: the first new secret is refused at once.
    newer = await api.post(f"/key/{new['key']}/regenerate", {})
    assert await status_of(a, new["key"]) == 401

    async def first_new_refused_on_b() -> bool:
        return await status_of(b, new["key"]) == 401

    assert await poll(first_new_refused_on_b, timeout_s=5, interval_s=0.05) < 1.5
    assert (await chat(b, newer["key"])).choices
    assert newer["rotation_count"] == 2


async def test_regenerate_changes_fields_chooses_a_key_and_checks_the_caller(
        gateway: Gateway) -> None:
    async with admin_client(gateway) as api:
        old = (await api.post("/key/generate", {"max_budget": 1}))["key"]
        chosen = "sk-chosen-secret-0123456789abcdef"
        new = await api.post("/key/regenerate", {"key": old, "new_key": chosen,
                                                 "max_budget": 2, "grace_period": None})
        assert new["key"] == chosen and new["max_budget"] == 2.0
        assert (await chat(gateway, chosen)).choices
        other = (await api.post("/key/generate", {}))["key"]
        await api.post("/key/regenerate", {"key": chosen, "new_key": other}, status=409)
        await api.post("/key/regenerate", {"key": chosen, "grace_period": "soon"},
                       status=400)
        await api.post("/key/regenerate", {"key": "sk-nope"}, status=404)
        await api.post("/key/regenerate", {"key": chosen, "new_master_key": "sk-x"},
                       status=400)
        assert (await chat(gateway, chosen)).choices  # nothing changed by the refusals
        # A key without a user may not rotate anything.
        async with admin_client(gateway, other) as plain:
            await plain.post("/key/regenerate", {"key": chosen}, status=403)
        # An internal user rotates its own key.
        user = await api.post("/user/new", {"user_id": "ada"})
        async with admin_client(gateway, user["key"]) as ada:
            mine = await ada.post("/key/regenerate", {"key": user["key"]})
        assert (await chat(gateway, mine["key"])).choices
        assert await status_of(gateway, user["key"]) == 401


async def test_scheduled_rotation_rotates_due_keys_and_hands_over_the_secret(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    offset_ms = [0]

    def clock() -> int:
        return wall_clock_ms() + offset_ms[0]

    secrets = tmp_path / "secrets"
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url, triogate={
        "key_rotation": {"check_interval_s": 0.1, "secrets_dir": str(secrets)}})
    with trio.fail_after(60):
        async with running_gateway(config, clock_ms=clock) as gateway, \
                admin_client(gateway) as api:
            body = {"key_alias": "nightly", "auto_rotate": True, "rotation_interval": "1h"}
            made = await api.post("/key/generate", body)
            assert made["auto_rotate"] is True and made["key_rotation_at"] is not None
            await api.post("/key/generate", {"auto_rotate": True}, status=400)
            old = made["key"]
            assert (await chat(gateway, old)).choices
            await trio.sleep(0.5)
            assert not secrets.exists()  # not due yet

            offset_ms[0] = 3_600_000 + 1000  # an hour later

            async def rotated() -> bool:
                return (secrets / "nightly").exists()

            await poll(rotated, timeout_s=10, interval_s=0.1)
            new = (secrets / "nightly").read_text().strip()
            assert (secrets / "nightly").stat().st_mode & 0o777 == 0o600
            assert new != old and hash_key(new) != made["token"]
            assert (await chat(gateway, new)).choices
            assert await status_of(gateway, old) == 401
            info = (await api.get("/key/info", key=made["token"]))["info"]
            assert info["rotation_count"] == 1 and info["last_rotation_at"] is not None
            assert info["key_rotation_at_ms"] > clock() + 3_500_000  # the next one
            # Turning it off stops the schedule.
            off = await api.post("/key/update", {"key": made["token"], "auto_rotate": False})
            assert off["key_rotation_at"] is None


async def test_a_chosen_key_may_not_be_another_keys_rotated_secret(gateway: Gateway) -> None:
    async with admin_client(gateway) as api:
        old = (await api.post("/key/generate", {}))["key"]
        new = (await api.post("/key/regenerate", {"key": old}))["key"]
        error = (await api.post("/key/generate", {"key": new}, status=409))["error"]
        assert error["param"] == "key" and new not in error["message"]
        assert (await chat(gateway, new)).choices


async def test_a_change_to_a_rotated_key_reaches_every_process(
        pair: tuple[Gateway, Gateway, Admin]) -> None:
    a, b, api = pair
    old = (await api.post("/key/generate", {}))["key"]
    new = (await api.post("/key/regenerate", {"key": old}))["key"]
    for gateway in (a, b):  # both remember the key under its new secret's hash
        assert (await chat(gateway, new)).choices
    await api.post("/key/block", {"key": new})
    assert await status_of(a, new) == 401

    async def blocked_on_b() -> bool:
        return await status_of(b, new) == 401

    # Memory lives 60 s: only the announcement, by the key's id, explains this.
    assert await poll(blocked_on_b, timeout_s=5, interval_s=0.05) < 1.5
