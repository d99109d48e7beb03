"""LiteLLM admin scripts work unchanged (admin side), over real HTTP.

Bodies as LiteLLM's own clients send them (every field present, most null or empty) are
accepted; a field that asks for behaviour triogate does not have is refused by name;
responses carry LiteLLM's names; ``models`` takes wildcards, ``all-team-models`` and
groups not configured yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.test_admin_api import Admin, admin_client, chat, status_of
from triogate.store import hash_key

if TYPE_CHECKING:

    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


#: /key/generate as a LiteLLM client sends it: every optional field, null or empty.
LITELLM_KEY_BODY: dict[str, Any] = {
    "key_alias": "from-litellm", "duration": None, "models": ["gpt-test"],
    "aliases": {"mistral-7b": "gpt-test"}, "config": {}, "spend": 0, "max_budget": None,
    "user_id": None, "team_id": None, "max_parallel_requests": None, "metadata": {},
    "tpm_limit": None, "rpm_limit": None, "budget_duration": None,
    "allowed_cache_controls": [], "soft_budget": None, "model_max_budget": {},
    "model_rpm_limit": {}, "model_tpm_limit": {}, "guardrails": None, "blocked": None,
    "tags": None, "enforced_params": None, "allowed_routes": [], "permissions": {},
    "send_invite_email": None, "organization_id": None, "budget_id": None,
    "allowed_model_region": None, "object_permission": None, "key_type": "default",
    "rpm_limit_type": None, "tpm_limit_type": None, "auto_rotate": False,
    "rotation_interval": None, "prompts": None, "router_settings": None,
    "access_group_ids": None, "allowed_vector_store_indexes": None,
}


async def test_a_litellm_key_body_is_accepted_and_answered_in_its_shape(
        gateway: Gateway, api: Admin) -> None:
    created = await api.post("/key/generate", LITELLM_KEY_BODY)
    raw = created["key"]
    assert created["token_id"] == created["token"] == hash_key(raw)
    assert created["key_name"] == f"sk-...{raw[-4:]}"
    assert created["aliases"] == {"mistral-7b": "gpt-test"}
    assert (await chat(gateway, raw)).choices
    info = (await api.get("/key/info", key=raw))["info"]
    assert info["aliases"] == {"mistral-7b": "gpt-test"} and info["key_alias"] == "from-litellm"
    updated = await api.post("/key/update", {"key": raw, "aliases": None, "spend": None,
                                             "temp_budget_increase": None})
    assert updated["aliases"] == {}


@pytest.mark.parametrize(("field", "value", "words"), [
    ("organization_id", "org-1", "organizations"),
    ("guardrails", ["pii"], "unknown guardrail 'pii'"),  # none configured here
    ("spend", 5, "spend"),
    ("key_type", "read_only", "key types"),
    ("send_invite_email", True, "invitation"),
])
async def test_a_field_asking_for_missing_behaviour_is_refused_by_name(
        api: Admin, field: str, value: Any, words: str) -> None:
    error = (await api.post("/key/generate", {field: value}, status=400))["error"]
    assert error["param"] == field and words in error["message"]
    assert (await api.get("/key/list"))["total_count"] == 0


async def test_team_user_and_customer_bodies_with_litellm_fields(api: Admin) -> None:
    team = await api.post("/team/new", {
        "team_alias": "eng", "team_id": None, "organization_id": None, "models": [],
        "model_aliases": {"fast": "gpt-test"}, "tpm_limit": None, "rpm_limit": None,
        "max_budget": None, "budget_duration": None, "metadata": None, "blocked": False,
        "guardrails": None, "object_permission": None, "team_member_budget": None,
        "admins": [], "members": [], "tags": None})
    assert team["model_aliases"] == {"fast": "gpt-test"}
    user = await api.post("/user/new", {
        "user_id": "ada", "user_email": "ada@example.com", "user_role": "internal_user",
        "teams": None, "send_invite_email": None, "max_budget": None, "models": [],
        "metadata": {}, "auto_create_key": False, "spend": None, "password": None,
        "sso_user_id": None, "organizations": None})
    assert user["user_role"] == "internal_user"
    await api.post("/user/new", {"user_id": "x", "user_role": "god"}, status=400)
    error = (await api.post("/user/new", {"user_id": "y", "sso_user_id": "okta|1"},
                            status=400))["error"]
    assert "SSO" in error["message"]
    customer = await api.post("/customer/new", {
        "user_id": "acme", "alias": None, "blocked": False, "max_budget": None,
        "budget_id": None, "allowed_model_region": None, "default_model": None,
        "tpm_limit": None, "rpm_limit": None, "model_max_budget": None,
        "max_parallel_requests": None, "soft_budget": None, "budget_duration": None})
    assert customer["user_id"] == "acme"
    await api.post("/customer/new", {"user_id": "eu", "allowed_model_region": "eu"},
                   status=400)


async def test_models_take_wildcards_team_models_and_later_groups(
        gateway: Gateway, api: Admin) -> None:
    by_provider = (await api.post("/key/generate", {"models": ["openai/*"]}))["key"]
    assert await status_of(gateway, by_provider) == 200
    assert await status_of(gateway, by_provider, "claude-test") == 403
    anthropic = (await api.post("/key/generate", {"models": ["anthropic/*"]}))["key"]
    assert await status_of(gateway, anthropic, "claude-test") == 200
    assert await status_of(gateway, anthropic) == 403
    star = (await api.post("/key/generate", {"models": ["*"]}))["key"]
    assert await status_of(gateway, star, "claude-test") == 200

    await api.post("/team/new", {"team_id": "claude-team", "models": ["claude-test"]})
    team_key = (await api.post("/key/generate", {"team_id": "claude-team",
                                                 "models": ["all-team-models"]}))["key"]
    assert await status_of(gateway, team_key, "claude-test") == 200
    assert await status_of(gateway, team_key) == 403
    alone = (await api.post("/key/generate", {"models": ["all-team-models"]}))["key"]
    assert await status_of(gateway, alone) == 403

    later = await api.post("/key/generate", {"models": ["gpt-test", "gpt-9-later"]})
    assert later["models"] == ["gpt-test", "gpt-9-later"]
    assert await status_of(gateway, later["key"]) == 200
    listed = await openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=team_key,
                                      max_retries=0).models.list()
    assert [m.id for m in listed.data] == ["claude-test"]


@pytest.mark.parametrize(("method", "path", "words"), [
    ("POST", "/organization/new", "organizations"),
    ("GET", "/organization/list", "organizations"),
    ("POST", "/organization/member_add", "organizations"),
    ("GET", "/sso/key/generate", "SSO"),
    ("POST", "/login", "SSO"),
    ("POST", "/guardrails", "guardrails"),
    ("POST", "/apply_guardrail", "guardrails"),
    ("POST", "/model/new", "runtime model management"),
    ("POST", "/model/delete", "runtime model management"),
])
async def test_features_left_out_are_refused_with_a_400_that_says_so(
        gateway: Gateway, api: Admin, method: str, path: str, words: str) -> None:
    response = await api.http.request(method, path, json={"organization_alias": "x"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_feature" and words in error["message"]
    async with admin_client(gateway, "sk-wrong") as stranger:  # the same for every caller
        assert (await stranger.http.request(method, path)).status_code == 400


async def test_user_update_names_the_user_by_email_as_litellm_allows(api: Admin) -> None:
    await api.post("/user/new", {"user_id": "grace", "user_email": "grace@example.com",
                                 "auto_create_key": False})
    updated = await api.post("/user/update", {"user_email": "grace@example.com",
                                              "user_id": None, "max_budget": 3})
    assert (updated["user_id"], updated["max_budget"]) == ("grace", 3.0)
    await api.post("/user/update", {"user_email": "nobody@example.com", "rpm_limit": 1},
                   status=404)
