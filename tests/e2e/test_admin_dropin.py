"""LiteLLM admin calls that scripts make, answered as LiteLLM documents them, over real
HTTP (a real gateway, SQLite, a Redis-compatible server, the fake upstream).

Users created into a team, ``/user/update`` as an upsert, 403 for other users' objects,
400 for removing a non-member, versions on readiness, budget reset times, and a 400
``unsupported_feature`` for every LiteLLM route triogate does not have.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import spend_rows
from tests.e2e.test_admin_api import Admin, admin_client, chat
from triogate import LITELLM_VERSION, __version__

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


# --------------------------------------------------------------------------- /user/new


async def test_user_new_with_team_id_and_aliases(gateway: Gateway, api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng", "max_budget": 5})
    user = await api.post("/user/new", {
        "user_id": "ada", "user_email": "ada@example.com", "team_id": "eng",
        "aliases": {"fast": "gpt-test"}, "key_alias": "ada-key"})
    assert user["teams"] == ["eng"]
    assert user["aliases"] == {"fast": "gpt-test"}
    # The key works, with its alias, and belongs to the team.
    answer = await chat(gateway, user["key"], "fast")
    assert answer.choices
    key = (await api.get("/key/info", key=user["key"]))["info"]
    assert key["team_id"] == "eng" and key["user_id"] == "ada"
    assert key["aliases"] == {"fast": "gpt-test"}
    team = await api.get("/team/info", team_id="eng")
    (member,) = team["team_info"]["members_with_roles"]
    assert (member["user_id"], member["user_email"], member["role"]) == (
        "ada", "ada@example.com", "user")
    info = await api.get("/user/info", user_id="ada")
    assert [t["team_id"] for t in info["teams"]] == ["eng"]


async def test_user_new_into_a_missing_team_creates_nothing(api: Admin) -> None:
    error = (await api.post("/user/new", {"user_id": "bob", "team_id": "nope"},
                            status=400))["error"]
    assert error["param"] == "team_id"
    await api.get("/user/info", user_id="bob", status=404)
    assert (await api.get("/key/list"))["total_count"] == 0


async def test_user_new_into_a_team_is_one_transaction(api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng"})
    await api.post("/user/new", {"user_id": "ada", "auto_create_key": False})
    # The id is taken: neither the user nor a membership is written.
    await api.post("/user/new", {"user_id": "ada", "team_id": "eng",
                                 "auto_create_key": False}, status=409)
    team = await api.get("/team/info", team_id="eng")
    assert team["team_info"]["members_with_roles"] == []


# --------------------------------------------------------------------------- /user/update


async def test_user_update_of_an_unknown_user_creates_it(gateway: Gateway, api: Admin) -> None:
    created = await api.post("/user/update", {"user_id": "new-one", "max_budget": 2,
                                              "user_email": "n@example.com"})
    assert created["user_id"] == "new-one" and created["max_budget"] == 2.0
    assert created["user_role"] == "internal_user"
    info = await api.get("/user/info", user_id="new-one")
    assert info["user_info"]["user_email"] == "n@example.com"
    # Validated as /user/new: a bad field creates nothing.
    await api.post("/user/update", {"user_id": "bad", "user_role": "god"}, status=400)
    await api.post("/user/update", {"user_id": "bad", "max_budget": -1}, status=400)
    await api.get("/user/info", user_id="bad", status=404)
    # And an update of the upserted user is an update.
    updated = await api.post("/user/update", {"user_id": "new-one", "user_alias": "N"})
    assert updated["user_alias"] == "N" and updated["max_budget"] == 2.0


# --------------------------------------------------------------------------- 403 / 400


async def test_other_users_objects_are_403(gateway: Gateway, api: Admin) -> None:
    mine = await api.post("/user/new", {"user_id": "me"})
    theirs = await api.post("/user/new", {"user_id": "them"})
    async with admin_client(gateway, mine["key"]) as me:
        for who in ("them", "nobody-at-all"):
            error = (await me.get("/user/info", user_id=who, status=403))["error"]
            assert error["type"] == "permission_error"
        for ref in (theirs["key"], "sk-no-such-key"):
            await me.post("/key/delete", {"keys": [ref]}, status=403)
        # Nothing was deleted: a mix of mine and theirs is all or nothing.
        await me.post("/key/delete", {"keys": [mine["key"], theirs["key"]]}, status=403)
        assert (await chat(gateway, theirs["key"])).choices
        assert (await chat(gateway, mine["key"])).choices
        assert (await me.get("/user/info"))["user_id"] == "me"
    # The admin still sees which keys do not exist.
    await api.post("/key/delete", {"keys": ["sk-no-such-key"]}, status=404)


async def test_member_delete_of_a_non_member_is_400(api: Admin) -> None:
    await api.post("/team/new", {"team_id": "eng"})
    await api.post("/user/new", {"user_id": "ada", "auto_create_key": False})
    error = (await api.post("/team/member_delete", {"team_id": "eng", "user_id": "ada"},
                            status=400))["error"]
    assert error["param"] == "user_id" and "not a member" in error["message"]
    await api.post("/team/member_add", {"team_id": "eng",
                                        "member": {"role": "user", "user_id": "ada"}})
    left = await api.post("/team/member_delete", {"team_id": "eng", "user_id": "ada"})
    assert left["members_with_roles"] == []


# --------------------------------------------------------------------------- versions, budgets


async def test_readiness_names_both_versions(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        with trio.fail_after(20):
            body = (await http.get("/health/readiness")).json()
    assert body["litellm_version"] == LITELLM_VERSION
    assert body["triogate_version"] == __version__


async def test_budget_new_and_info_answer_budget_reset_at(api: Admin) -> None:
    made = await api.post("/budget/new", {"budget_id": "monthly", "max_budget": 10,
                                          "budget_duration": "30d"})
    assert made["budget_reset_at"] is not None
    created = made["created_at"]
    # 30 days after creation (periods count from the budget's creation).
    start = datetime.fromisoformat(created.replace("Z", "+00:00"))
    reset = datetime.fromisoformat(made["budget_reset_at"].replace("Z", "+00:00"))
    assert timedelta(days=30) - timedelta(seconds=1) <= reset - start <= timedelta(days=30)
    (info,) = await api.post("/budget/info", {"budgets": ["monthly"]})
    assert info["budget_reset_at"] == made["budget_reset_at"]
    forever = await api.post("/budget/new", {"budget_id": "once", "max_budget": 1})
    assert forever["budget_reset_at"] is None


# --------------------------------------------------------------------------- unsupported


@pytest.mark.parametrize(("method", "path", "words"), [
    ("POST", "/v1/images/generations", "image generation"),
    ("POST", "/images/generations", "image generation"),
    ("POST", "/openai/deployments/gpt-test/images/generations", "image generation"),
    ("POST", "/v1/audio/speech", "audio"),
    ("POST", "/v1/audio/transcriptions", "audio"),
    ("POST", "/v1/files", "files"),
    ("GET", "/v1/files/file-abc", "files"),
    ("GET", "/v1/files/file-abc/content", "files"),
    ("POST", "/v1/batches", "batches"),
    ("POST", "/v1/batches/batch_1/cancel", "batches"),
    ("POST", "/login", "SSO"),
    ("POST", "/organization/new", "organizations"),
    ("POST", "/model/new", "runtime model management"),
])
async def test_litellm_routes_triogate_lacks_are_400_for_every_caller(
        gateway: Gateway, api: Admin, method: str, path: str, words: str) -> None:
    key = (await api.post("/key/generate", {}))["key"]
    for who in (None, "sk-wrong", key, "sk-test-master"):
        headers = {"authorization": f"Bearer {who}"} if who else {}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers) as http:
            with trio.fail_after(20):
                response = await http.request(method, path, json={"model": "gpt-test"})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_feature" and words in error["message"]


async def test_the_openai_sdk_sees_the_400_for_images(gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {}))["key"]
    client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised, trio.fail_after(20):
        await client.images.generate(prompt="a cat", model="gpt-test")
    assert raised.value.code == "unsupported_feature"


# --------------------------------------------------------------------------- Azure route


def azure(gateway: Gateway, key: str) -> openai.AsyncAzureOpenAI:
    return openai.AsyncAzureOpenAI(azure_endpoint=gateway.url, api_key=key,
                                   api_version="2024-06-01", max_retries=0)


async def test_azure_route_answers_401_for_a_deployment_the_key_may_not_use(
        gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {"models": ["gpt-test"]}))["key"]
    client = azure(gateway, key)
    hi = [{"role": "user", "content": "hi"}]
    with trio.fail_after(30):
        assert (await client.chat.completions.create(model="gpt-test", messages=hi)).choices
    # Served but not the key's, and not served at all: the same 401, so the key learns
    # nothing about deployments outside its list.
    for model in ("claude-test", "no-such-deployment"):
        with trio.fail_after(30), pytest.raises(openai.AuthenticationError) as raised:
            await client.chat.completions.create(model=model, messages=hi)  # type: ignore[arg-type]
        body = raised.value.body
        assert isinstance(body, dict)
        assert body["message"].startswith("key not allowed to access model")
        assert body["code"] == "key_model_access_denied" and model in body["message"]
    with trio.fail_after(30), pytest.raises(openai.AuthenticationError):
        await client.embeddings.create(model="embed-test", input="x")
    # The other routes keep OpenAI's 403 for a served model outside the key's list.
    with trio.fail_after(30), pytest.raises(openai.PermissionDeniedError):
        await openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=key,
                                 max_retries=0).chat.completions.create(
            model="claude-test", messages=hi)  # type: ignore[arg-type]
    # A key that may use every model, and the master key: an unknown deployment is 404.
    for who in ((await api.post("/key/generate", {}))["key"], "sk-test-master"):
        with trio.fail_after(30), pytest.raises(openai.NotFoundError):
            await azure(gateway, who).chat.completions.create(
                model="no-such-deployment", messages=hi)  # type: ignore[arg-type]
    # A wrong key is still a plain 401 invalid key.
    with trio.fail_after(30), pytest.raises(openai.AuthenticationError) as raised:
        await azure(gateway, "sk-wrong").chat.completions.create(
            model="no-such-deployment", messages=hi)  # type: ignore[arg-type]
    assert "invalid API key" in str(raised.value)


# --------------------------------------------------------------------------- a,b models


async def _post_chat(gateway: Gateway, key: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        with trio.fail_after(30):
            return await http.post(f"{gateway.openai_base}/chat/completions", json=body,
                                   headers={"authorization": f"Bearer {key}"})


async def test_comma_separated_models_answer_once_per_model(
        gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {}))["key"]
    body = {"model": "gpt-test, claude-test", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hello there"}]}
    response = await _post_chat(gateway, key, body)
    assert response.status_code == 200, response.text
    first, second = response.json()
    assert first["object"] == second["object"] == "chat.completion"
    assert first["choices"][0]["message"]["content"]
    assert second["choices"][0]["message"]["content"]
    assert first["id"] != second["id"]
    rows = await spend_rows(gateway, 2)
    assert {r.model_group for r in rows} == {"gpt-test", "claude-test"}
    assert len({r.request_id for r in rows}) == 2


async def test_comma_separated_models_answer_each_refusal_in_place(
        gateway: Gateway, api: Admin) -> None:
    key = (await api.post("/key/generate", {"models": ["gpt-test"]}))["key"]
    body = {"model": "gpt-test,claude-test",
            "messages": [{"role": "user", "content": "hello"}]}
    response = await _post_chat(gateway, key, body)
    assert response.status_code == 200, response.text
    answer, refusal = response.json()
    assert answer["choices"]
    assert refusal["error"]["code"] == "model_not_allowed"
    # Every model refused: the first refusal is the response.
    body["model"] = "claude-test,no-such-model"
    response = await _post_chat(gateway, key, body)
    assert response.status_code == 403, response.text
    for bad, status in ((dict(body, stream=True), 400), (dict(body, model="a,,b"), 400)):
        assert (await _post_chat(gateway, key, bad)).status_code == status
    assert (await _post_chat(gateway, "sk-wrong", body)).status_code == 401
