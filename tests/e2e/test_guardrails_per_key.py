"""Guardrails per key and per team over real HTTP, as LiteLLM's "control guardrails per
API key / team": ``guardrails`` and ``disable_global_guardrails`` set through the admin
API (kept in ``metadata``), applied to the key's requests with the official SDK,
listed by ``/guardrails/list``, and recorded on the spend rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, spend_rows
from tests.e2e.json_receiver import open_json_service
from tests.e2e.test_admin_api import admin_client
from tests.e2e.test_guardrails import (
    content_filter,
    deny_filter,
    generic,
    guard_answer,
    make_gateway,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from tests.e2e.json_receiver import JsonService
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
async def service() -> AsyncIterator[JsonService]:
    """The generic guardrail service of ``test_guardrails`` (blocks 'nope')."""
    async with open_json_service(guard_answer) as svc:
        yield svc


def guardrails(service_url: str) -> list[dict[str, Any]]:
    """``pii`` (masks e-mail addresses) and ``deny`` (blocks 'forbidden'), both off by
    default; ``always`` (blocks 'banana'), on for every request; ``svc`` (a generic
    guardrail service with an api_key that must never be listed)."""
    pii = content_filter("pii", default_on=False, patterns=[
        {"pattern_type": "prebuilt", "pattern_name": "email", "action": "MASK"}])
    deny = deny_filter()
    deny["litellm_params"]["default_on"] = False
    always = content_filter("always", ["pre_call", "post_call"],
                            blocked_words=[{"keyword": "banana", "action": "BLOCK"}])
    return [pii, deny, always, generic(service_url)]


async def ask(gateway: Gateway, key: str, content: str, **extra: Any) -> Any:
    client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)
    with trio.fail_after(20):
        return await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": content}], max_tokens=40,
            **extra)


async def blocked_by(gateway: Gateway, key: str, content: str, **extra: Any) -> str:
    """The guardrail that refused ``content`` (a 400 in OpenAI's shape)."""
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(gateway, key, content, **extra)
    body = caught.value.body
    assert isinstance(body, dict)
    message = body["message"]
    assert isinstance(message, str)
    return message.split("'")[1] if message.startswith("Violated guardrail") else message


async def test_key_and_team_guardrails_apply_to_the_keys_requests(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, guardrails(service.url)) as gw, \
            admin_client(gw) as api:
        team = await api.post("/team/new", {"team_alias": "eng", "guardrails": ["deny"]})
        assert team["metadata"] == {"guardrails": ["deny"]}
        key = (await api.post("/key/generate", {"team_id": team["team_id"],
                                                "guardrails": ["pii"]}))["key"]
        plain = (await api.post("/key/generate", {}))["key"]
        info = (await api.get("/key/info", key=key))["info"]
        assert info["metadata"] == {"guardrails": ["pii"]}
        team_info = await api.get("/team/info", team_id=team["team_id"])
        assert team_info["team_info"]["metadata"]["guardrails"] == ["deny"]

        # The key's own guardrail masks; its team's blocks; the default-on one still runs.
        await ask(gw, key, "mail ada@example.com")
        assert upstream.requests[-1].json["messages"][0]["content"] == (
            "mail [EMAIL_REDACTED]")
        assert await blocked_by(gw, key, "a forbidden word") == "deny"
        assert await blocked_by(gw, key, "a banana") == "always"
        # A key of no team, naming nothing, runs only the default-on one.
        await ask(gw, plain, "mail ada@example.com and a forbidden word")
        assert "ada@example.com" in upstream.requests[-1].json["messages"][0]["content"]
        # A request still adds its own names to the key's.
        assert (await blocked_by(gw, plain, "nope", extra_body={"guardrails": ["svc"]})
                == "svc")

        rows = await spend_rows(gw, 5)
        masked = next(r for r in rows if r.key_hash == info["token"]
                      and r.status == "success")
        assert masked.guardrails is not None
        assert orjson.loads(masked.guardrails) == [
            {"guardrail_name": "pii", "mode": "pre_call", "status": "masked",
             "message": "masked: email"},
            {"guardrail_name": "deny", "mode": "pre_call", "status": "passed"},
            {"guardrail_name": "always", "mode": "pre_call", "status": "passed"},
            {"guardrail_name": "always", "mode": "post_call", "status": "passed"}]


async def test_disable_global_guardrails_skips_the_default_on_ones_only(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, guardrails(service.url)) as gw, \
            admin_client(gw) as api:
        team = await api.post("/team/new", {"guardrails": ["deny"],
                                            "disable_global_guardrails": True})
        in_team = (await api.post("/key/generate", {"team_id": team["team_id"]}))["key"]
        # The team's setting applies to its keys; the team's own guardrail still runs.
        assert (await ask(gw, in_team, "a banana")).choices
        assert await blocked_by(gw, in_team, "a forbidden word") == "deny"
        # A key's own setting (true or false) wins over its team's, as in LiteLLM.
        on_again = (await api.post("/key/generate", {
            "team_id": team["team_id"], "disable_global_guardrails": False}))["key"]
        assert await blocked_by(gw, on_again, "a banana") == "always"
        # Set on a key of no team, through metadata (LiteLLM's dashboard sends it so).
        own = (await api.post("/key/generate", {"metadata": {
            "disable_global_guardrails": True, "guardrails": ["pii"], "note": "x"}}))["key"]
        assert (await ask(gw, own, "a banana from ada@example.com")).choices
        assert upstream.requests[-1].json["messages"][0]["content"] == (
            "a banana from [EMAIL_REDACTED]")
        # A default-on guardrail the key names does not run either (LiteLLM's rule).
        await api.post("/key/update", {"key": own, "guardrails": ["pii", "always"]})
        assert (await ask(gw, own, "a banana")).choices
        info = (await api.get("/key/info", key=own))["info"]
        assert info["metadata"] == {"disable_global_guardrails": True,
                                    "guardrails": ["pii", "always"], "note": "x"}

        # A request may not opt out itself.
        plain = (await api.post("/key/generate", {}))["key"]
        for body in ({"disable_global_guardrails": True},
                     {"metadata": {"disable_global_guardrail": True}}):
            message = await blocked_by(gw, plain, "a banana", extra_body=body)
            assert "cannot be set by a request" in message


async def test_unknown_names_and_non_admin_opt_outs_are_refused_and_nothing_changes(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, guardrails(service.url)) as gw, \
            admin_client(gw) as api:
        created = await api.post("/key/generate", {"guardrails": ["pii"]})
        key = created["key"]
        for body in ({"key": key, "guardrails": ["pii", "nosuch"]},
                     {"key": key, "metadata": {"guardrails": ["nosuch"]}}):
            error = (await api.post("/key/update", body, status=400))["error"]
            assert "unknown guardrail 'nosuch'" in error["message"]
            assert error["param"] == "guardrails"
        error = (await api.post("/key/generate", {"guardrails": "pii"}, status=400))["error"]
        assert error["param"] == "guardrails"
        error = (await api.post("/key/update", {"key": key, "metadata": {
            "opted_out_global_guardrails": ["always"]}}, status=400))["error"]
        assert error["param"] == "opted_out_global_guardrails"
        team = await api.post("/team/new", {"team_alias": "t"})
        await api.post("/team/update", {"team_id": team["team_id"],
                                        "guardrails": ["nosuch"]}, status=400)
        await api.post("/team/new", {"team_alias": "u", "guardrails": ["x"]}, status=400)
        assert (await api.get("/key/info", key=key))["info"]["metadata"] == {
            "guardrails": ["pii"]}
        team_info = await api.get("/team/info", team_id=team["team_id"])
        assert team_info["team_info"]["metadata"] == {}
        assert len(await api.get("/team/list")) == 1
        assert (await api.get("/key/list"))["total_count"] == 1

        # An internal user may put guardrails on its own key, not turn them off (403).
        user = await api.post("/user/new", {"user_id": "ada"})
        async with admin_client(gw, user["key"]) as ada:
            mine = await ada.post("/key/generate", {"guardrails": ["deny"]})
            assert mine["metadata"] == {"guardrails": ["deny"]}
            for body in ({"disable_global_guardrails": True},
                         {"metadata": {"disable_global_guardrails": True}}):
                error = (await ada.post("/key/generate", body, status=403))["error"]
                assert "disable_global_guardrails" in error["message"]
            await ada.post("/key/update", {"key": mine["key"],
                                           "disable_global_guardrails": True}, status=403)
        # Once an admin turned them off, the user's other edits go through.
        await api.post("/key/update", {"key": mine["key"], "disable_global_guardrails": True})
        async with admin_client(gw, user["key"]) as ada:
            await ada.post("/key/update", {"key": mine["key"], "key_alias": "mine",
                                           "disable_global_guardrails": True})
        assert (await ask(gw, mine["key"], "a banana")).choices


async def test_guardrails_list_shows_the_config_without_secrets(
        tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
        service: JsonService) -> None:
    async with make_gateway(tmp_path, redis_url, upstream, guardrails(service.url)) as gw, \
            admin_client(gw) as api:
        key = (await api.post("/key/generate", {}))["key"]
        async with httpx.AsyncClient(base_url=gw.url, timeout=10) as http:
            for token in (MASTER_KEY, key):  # any key may list them, as in LiteLLM
                headers = {"authorization": f"Bearer {token}"}
                listed = await http.get("/guardrails/list", headers=headers)
                assert listed.status_code == 200, listed.text
                assert listed.json() == {"guardrails": [
                    {"guardrail_name": name, "guardrail_info": None,
                     "litellm_params": {"guardrail": kind, "mode": mode,
                                        "default_on": on}}
                    for name, kind, mode, on in (
                        ("pii", "litellm_content_filter", "pre_call", False),
                        ("deny", "litellm_content_filter", "pre_call", False),
                        ("always", "litellm_content_filter", ["pre_call", "post_call"],
                         True),
                        ("svc", "generic_guardrail_api", "pre_call", False))]}
                v2 = await http.get("/v2/guardrails/list", headers=headers)
                assert v2.status_code == 200, v2.text
                first = v2.json()["guardrails"][0]
                assert first["guardrail_id"] == "pii"
                assert first["guardrail_definition_location"] == "config"
                for answer in (listed, v2):
                    assert "guard-key" not in answer.text and service.url not in answer.text
            assert (await http.get("/guardrails/list")).status_code == 401
