"""Soft budgets and budget alerts (``general_settings.alerting: ["webhook"]``) over real
HTTP: keys, teams, users and customers with ``soft_budget``, hard budgets crossing
50/80/100 %, one alert per budget period posted to a real webhook receiver on loopback in
LiteLLM's webhook shape, retried, never on the request's path, shown on the dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from tests.e2e.json_receiver import JsonService, open_json_service
from tests.e2e.test_admin_api import admin_client, chat
from tests.e2e.test_dashboard_http import sign_in

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

TINY_USD = "0.0000001"


class Flaky:
    """A webhook that fails its first ``failures`` posts with 503."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def __call__(self, path: str, body: Any) -> tuple[int, Any]:
        if self.failures:
            self.failures -= 1
            return 503, {"error": "try later"}
        return 200, {"ok": True}


@pytest.fixture
async def webhook() -> AsyncIterator[JsonService]:
    async with open_json_service(Flaky(1)) as service:
        yield service


@pytest.fixture
async def alerting(tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
                   webhook: JsonService) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            general_settings={"alerting": ["webhook"],
                                              "alerting_webhook_url": f"{webhook.url}/hook"})
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


def events(webhook: JsonService) -> list[tuple[str, str]]:
    """(event_group, event) of every alert delivered (a retried post counts once)."""
    seen = []
    for body in webhook.bodies():
        pair = (body["event_group"], body["event"])
        if pair not in seen:
            seen.append(pair)
    return sorted(seen)


async def test_soft_budgets_of_every_principal_alert_once_per_period(
        alerting: Gateway, webhook: JsonService) -> None:
    gateway = alerting
    async with admin_client(gateway) as api:
        team = await api.post("/team/new", {"team_alias": "eng", "soft_budget": TINY_USD})
        assert team["soft_budget"] == 1e-7
        user = await api.post("/user/new", {"user_id": "ada", "soft_budget": TINY_USD,
                                            "auto_create_key": False})
        assert user["soft_budget"] == 1e-7
        await api.post("/customer/new", {"user_id": "acme", "soft_budget": TINY_USD})
        made = await api.post("/key/generate", {
            "key_alias": "alerted", "team_id": team["team_id"], "user_id": "ada",
            "soft_budget": TINY_USD, "max_budget": 1000})
        assert made["soft_budget"] == 1e-7
    key = made["key"]
    with trio.fail_after(20):
        for _ in range(3):  # over the soft budgets: still served, alerted once
            async with httpx.AsyncClient(base_url=gateway.openai_base) as http:
                response = await http.post("/chat/completions", headers={
                    "authorization": f"Bearer {key}"}, json={
                    "model": "gpt-test", "user": "acme", "max_tokens": 10,
                    "messages": [{"role": "user", "content": "hello"}]})
            assert response.status_code == 200, response.text
            await gateway.services.settler.wait_drained()
    expected = [("customer", "soft_budget_crossed"), ("key", "soft_budget_crossed"),
                ("team", "soft_budget_crossed"), ("user", "soft_budget_crossed")]
    await webhook.wait_for(lambda w: len(events(w)) == 4 and len(w.posts) == 5)
    assert events(webhook) == expected
    # The first post failed (503) and was retried: five posts, four alerts.
    assert len(webhook.posts) == 5
    key_alert = next(b for b in webhook.bodies() if b["event_group"] == "key")
    assert key_alert["event_message"] == "Key Budget: Soft Budget Crossed"
    assert key_alert["key_alias"] == "alerted" and key_alert["soft_budget"] == 1e-7
    assert key_alert["max_budget"] == 1000 and key_alert["spend"] > 1e-7
    assert key_alert["token"] and "Soft Budget Crossed" in key_alert["text"]
    path, headers, _ = webhook.posts[0]
    assert path == "/hook" and headers["content-type"] == "application/json"
    alerts = gateway.services.alerts
    assert alerts is not None
    with trio.fail_after(10):
        await alerts.wait_drained()
    assert (alerts.delivered, alerts.failed, alerts.dropped) == (4, 0, 0)
    # The dashboard shows them.
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        await sign_in(http, MASTER_KEY)
        page = await http.get("/ui")
        config_page = await http.get("/ui/config")
        keys_page = await http.get("/ui/keys")
    assert "(soft $0.0000001)" in keys_page.text  # the keys list shows the soft budget
    assert config_page.status_code == 200 and webhook.url not in config_page.text
    assert page.status_code == 200
    assert "Budget alerts" in page.text and "Key Budget: Soft Budget Crossed" in page.text


async def test_hard_budget_thresholds_and_the_proxy_budget_alert(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        webhook: JsonService) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            general_settings={"alerting": ["webhook"],
                                              "alerting_webhook_url": webhook.url},
                            litellm_settings={"max_budget": TINY_USD})
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            async with admin_client(gateway) as api:
                key = (await api.post("/key/generate", {"max_budget": TINY_USD}))["key"]
            assert (await chat(gateway, key)).choices  # the first of a period is served
            await webhook.wait_for(lambda w: len(events(w)) == 2)
    # Only the highest threshold reached is sent (100 %: "budget_crossed").
    assert events(webhook) == [("key", "budget_crossed"), ("proxy", "budget_crossed")]
    proxy = next(b for b in webhook.bodies() if b["event_group"] == "proxy")
    assert proxy["event_message"] == "Proxy Budget: Budget Crossed"
    assert proxy["token"] is None and proxy["max_budget"] == 1e-7
    key_alert = next(b for b in webhook.bodies() if b["event_group"] == "key")
    assert key_alert["key_alias"] is None and len(key_alert["token"]) == 64  # no alias


async def test_alert_settings_are_checked(tmp_path: Path) -> None:
    from triogate.errors import ConfigError

    with pytest.raises(ConfigError, match="alerting_webhook_url: required"):
        gateway_config(tmp_path, "redis://x", "http://x",
                       general_settings={"alerting": ["webhook"]})
    with pytest.raises(ConfigError, match=r"alerting\[0\]: 'email' is not supported"):
        gateway_config(tmp_path, "redis://x", "http://x",
                       general_settings={"alerting": ["email"], "alerting_webhook_url": "x"})


async def soft_budget_spend(gateway: Gateway) -> None:
    """One request of a key over its soft budget, settled."""
    async with admin_client(gateway) as api:
        key = (await api.post("/key/generate", {"soft_budget": TINY_USD}))["key"]
    assert (await chat(gateway, key)).choices
    with trio.fail_after(10):
        await gateway.services.settler.wait_drained()


async def test_shutdown_drains_queued_alerts(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    async with open_json_service() as hook:
        config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                                general_settings={"alerting": ["webhook"],
                                                  "alerting_webhook_url": hook.url})
        with trio.fail_after(60):
            async with running_gateway(config) as gateway:
                await soft_budget_spend(gateway)
        # The gateway has stopped: what was queued was posted first.
        assert [b["event"] for b in hook.bodies()] == ["soft_budget_crossed"]
        alerts = gateway.services.alerts
        assert alerts is not None and (alerts.delivered, alerts.dropped) == (1, 0)


async def test_alerts_stuck_on_a_webhook_are_dropped_and_counted_at_shutdown(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream) -> None:
    async def never_answer(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, never_answer, 0)
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                                general_settings={"alerting": ["webhook"],
                                                  "alerting_webhook_url": url},
                                triogate={"shutdown_grace_s": 0.5})
        with trio.fail_after(60):
            async with running_gateway(config) as gateway:
                await soft_budget_spend(gateway)
        alerts = gateway.services.alerts
        assert alerts is not None and (alerts.delivered, alerts.dropped) == (0, 1)
        nursery.cancel_scope.cancel()
