"""Property-based fuzzing of the model routes (chat, messages, responses, embeddings,
legacy completions, the Azure path) and the admin routes through a running
gateway (real HTTP, real Redis, real upstream on loopback).

Bodies start valid and get 0-3 mutations: a known field (or a nested one) set to any
JSON value (wrong types, out-of-range integers, odd Unicode and control characters),
deeply nested arrays, or a raw body that is not JSON at all. Model routes are called
with a key that has ``max_parallel_requests: 1``; admin routes (POST bodies and GET
query strings) with the master key. For every request:

* the status is never 5xx and the body never carries a stack trace;
* a valid model request of the limited key right after it succeeds: nothing was left
  held; after an admin request, ``/key/list``, ``/team/list`` and ``/key/info`` still
  answer 200 (no bad row was stored).

The number of requests tried is printed at the end of the module.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from triogate.api.admin.fields import (
    END_USER_FIELDS,
    KEY_FIELDS,
    TAG_FIELDS,
    TEAM_FIELDS,
    USER_FIELDS,
)
from triogate.batch import RespBackend
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

EXAMPLES = 250

BASES: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [
        {"model": m, "max_tokens": 8, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
        for m in ("gpt-test", "claude-test")],
    "/v1/messages": [
        {"model": m, "max_tokens": 8, "system": "be brief", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
        for m in ("gpt-test", "claude-test")],
    "/v1/responses": [
        {"model": m, "max_output_tokens": 8, "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
        for m in ("gpt-test", "claude-test")],
    "/v1/embeddings": [{"model": "embed-test", "input": ["hi", "there"]}],
    "/v1/completions": [{"model": m, "max_tokens": 8, "prompt": "hi"}
                        for m in ("gpt-test", "claude-test")],
    # Azure OpenAI's path: the model comes from the path.
    "/openai/deployments/gpt-test/chat/completions": [
        {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}],
}

#: Fields (dotted paths; digits index lists) the gateway or a translator reads.
PATHS: dict[str, list[str]] = {
    "/v1/chat/completions": [
        "model", "messages", "messages.0", "messages.1.content", "messages.1.content.0",
        "messages.1.content.0.type", "messages.1.role", "messages.1.tool_calls",
        "messages.1.tool_calls.0.function", "tools", "tools.0", "tools.0.function",
        "tool_choice", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p",
        "stream", "stream_options", "user", "metadata", "metadata.tags", "stop",
        "response_format", "parallel_tool_calls", "cache", "messages.1.content.0.image_url"],
    "/v1/messages": [
        "model", "messages", "messages.0", "messages.0.content", "messages.0.content.0",
        "messages.0.content.0.type", "messages.0.content.0.source", "messages.0.role",
        "system", "system.0", "max_tokens", "tools", "tools.0", "tool_choice", "metadata",
        "metadata.user_id", "metadata.tags", "stop_sequences", "stream", "temperature",
        "top_k", "messages.0.content.0.content"],
    "/v1/responses": [
        "model", "input", "input.0", "input.0.content", "input.0.content.0",
        "input.0.type", "input.0.role", "input.0.output", "instructions", "text",
        "text.format", "text.format.type", "tools", "tools.0", "tool_choice",
        "max_output_tokens", "previous_response_id", "stream", "user", "temperature"],
    "/v1/embeddings": ["model", "input", "input.0", "dimensions", "encoding_format", "user",
                       "stream"],
    "/v1/completions": ["model", "prompt", "max_tokens", "n", "echo", "suffix", "best_of",
                        "logprobs", "stop", "stream", "stream_options", "user",
                        "temperature", "metadata.tags"],
    "/openai/deployments/gpt-test/chat/completions": [
        "model", "messages", "messages.0", "messages.0.content", "messages.0.role", "tools",
        "n", "max_tokens", "stream", "user", "metadata.tags"],
}

TYPES = ["text", "image_url", "image", "input_text", "input_image", "tool_use",
         "tool_result", "function", "function_call", "function_call_output", "message",
         "json_schema", "json_object", "document", "thinking", "x"]

scalars = (st.none() | st.booleans()
           | st.integers(min_value=-(2**70), max_value=2**70)
           | st.sampled_from([0, -1, 2**31, 2**53, 2**63, 2**64 - 1, 10**30])
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=12)
           | st.text(st.characters(max_codepoint=0x9F), max_size=6))
typed = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES)},
    optional={k: scalars | st.dictionaries(st.text(max_size=6), scalars, max_size=3)
              for k in ("text", "source", "image_url", "content", "function", "name",
                        "input", "format", "url", "data")})
values = st.recursive(scalars | typed,
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=10)


def set_path(body: dict[str, Any], path: str, value: Any) -> None:
    """``body[path] = value``, creating what is missing (digits index lists)."""
    target: Any = body
    parts = path.split(".")
    for part in parts[:-1]:
        key: Any = int(part) if part.isdigit() else part
        if isinstance(target, list) and isinstance(key, int):
            if len(target) <= key:
                return
            target = target[key]
        elif isinstance(target, dict) and isinstance(key, str):
            if not isinstance(target.get(key), (dict, list)):
                target[key] = {}
            target = target[key]
        else:
            return
    last: Any = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    fits_list = isinstance(target, list) and isinstance(last, int) and last < len(target)
    if fits_list or (isinstance(target, dict) and isinstance(last, str)):
        target[last] = value


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, bytes]:
    route = draw(st.sampled_from(sorted(BASES)))
    body = copy.deepcopy(draw(st.sampled_from(BASES[route])))
    for _ in range(draw(st.integers(0, 3))):
        set_path(body, draw(st.sampled_from(PATHS[route])), draw(values))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    kind = draw(st.sampled_from(["json"] * 8 + ["deep", "raw"]))
    if kind == "deep":
        depth = draw(st.integers(40, 1100))
        text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    elif kind == "raw":
        return route, draw(st.binary(max_size=64))
    return route, text.encode("utf-8", "surrogatepass")


#: Admin POST routes: a valid body each (``TARGET``, ``TEAM`` and ``USER`` name entities
#: the fixture made; the limited key is never named) and the fields they read.
TARGET, TEAM, USER = "{target}", "fuzz-team", "fuzz-user"
ADMIN_BASES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "/key/generate": ({"key_alias": "k", "max_budget": 1, "budget_duration": "1d",
                       "rpm_limit": 10, "models": ["gpt-test"], "duration": "1d",
                       "metadata": {"tags": ["t"]}}, [*KEY_FIELDS, "key", "metadata.tags"]),
    "/key/update": ({"key": TARGET, "max_budget": 2}, [*KEY_FIELDS, "key"]),
    "/key/block": ({"key": TARGET}, ["key"]),
    "/key/unblock": ({"key": TARGET}, ["key"]),
    "/key/delete": ({"keys": ["sk-not-there-but-long-enough"]}, ["keys", "keys.0",
                                                                 "key_aliases"]),
    "/team/new": ({"team_alias": "a", "max_budget": 1, "rpm_limit": 5,
                   "models": ["gpt-test"]}, [*TEAM_FIELDS, "team_id", "members_with_roles"]),
    "/team/update": ({"team_id": TEAM, "max_budget": 3}, [*TEAM_FIELDS, "team_id"]),
    "/team/member_add": ({"team_id": TEAM, "member": {"role": "user", "user_id": USER}},
                         ["team_id", "member", "member.role", "member.user_id",
                          "member.user_email"]),
    "/team/block": ({"team_id": "no-such-team"}, ["team_id", "team_ids"]),
    "/user/new": ({"user_id": "u-new", "max_budget": 1, "user_role": "internal_user"},
                  [*USER_FIELDS, "user_id", "key_alias", "duration"]),
    "/user/update": ({"user_id": USER, "max_budget": 1}, [*USER_FIELDS, "user_id"]),
    "/customer/new": ({"user_id": "c-new", "max_budget": 1},
                      [*END_USER_FIELDS, "user_id"]),
    "/tag/new": ({"name": "tg", "max_budget": 1}, [*TAG_FIELDS, "name"]),
    "/tag/info": ({"names": ["tg"]}, ["names", "names.0"]),
    "/budget/new": ({"budget_id": "b", "max_budget": 1},
                    ["budget_id", "max_budget", "budget_duration", "rpm_limit",
                     "tpm_limit", "max_parallel_requests"]),
}
#: Admin GET routes and the query parameters they read.
ADMIN_QUERIES: dict[str, list[str]] = {
    "/key/list": ["page", "size", "team_id", "user_id", "key_alias", "return_full_object"],
    "/key/info": ["key"],
    "/team/list": ["page", "size", "user_id"],
    "/team/info": ["team_id"],
    "/user/list": ["page", "page_size", "role"],
    "/user/info": ["user_id"],
    "/customer/list": ["page", "size"],
    "/tag/list": ["page", "size"],
    "/spend/logs": ["page", "size", "start_date", "end_date", "api_key", "user_id",
                    "team_id", "request_id", "model", "status", "tags"],
    "/spend/daily": ["start_date", "end_date", "group_by", "key", "team_id"],
}
query_values = (st.text(max_size=24)
                | st.integers(min_value=-(2**70), max_value=2**70).map(str)
                | st.sampled_from(["99999-01-01", "1e20", "-5", "2026-13-45", "0",
                                   "9" * 40, "true", "\x00", "%00", "[]"]))


@st.composite
def admin_cases(draw: st.DrawFn) -> tuple[str, str, bytes | dict[str, str]]:
    """(method, path, body or query) for one admin request."""
    if draw(st.booleans()):
        path = draw(st.sampled_from(sorted(ADMIN_QUERIES)))
        names = draw(st.lists(st.sampled_from(ADMIN_QUERIES[path]), max_size=3))
        return "GET", path, {name: draw(query_values) for name in names}
    path = draw(st.sampled_from(sorted(ADMIN_BASES)))
    base, fields = ADMIN_BASES[path]
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, 3))):
        set_path(body, draw(st.sampled_from(fields)), draw(values))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    kind = draw(st.sampled_from(["json"] * 8 + ["deep", "raw"]))
    if kind == "deep":
        depth = draw(st.integers(40, 1100))
        text = text[:-1] + ', "metadata": ' + "[" * depth + "]" * depth + "}"
    elif kind == "raw":
        return "POST", path, draw(st.binary(max_size=64))
    return "POST", path, text.encode("utf-8", "surrogatepass")


@attrs.define
class Live:
    http: httpx.Client
    valid: dict[str, Any]
    target: str = ""
    tried: int = 0
    #: (route kind, status class) → count, printed with the total.
    statuses: Counter[str] = attrs.Factory(Counter)


@pytest.fixture(scope="module")
def live(redis_url: str, tmp_path_factory: pytest.TempPathFactory,
         pytestconfig: pytest.Config) -> Iterator[Live]:
    """A gateway (and its upstream) in a thread of its own, for hypothesis's sync tests."""
    ready = threading.Event()
    box: dict[str, Any] = {}
    state = tmp_path_factory.mktemp("fuzz") / "state"

    async def main() -> None:
        backend = RespBackend(redis_url, name="redis", command_timeout_s=5.0)
        await backend.execute([("FLUSHALL",), ("SCRIPT", "FLUSH")])
        await backend.aclose()
        async with open_fake_upstream() as upstream:
            config = gateway_config(state, redis_url, upstream.base_url)
            async with running_gateway(config) as gateway:
                assert gateway.services.store is not None
                store = gateway.services.store
                key, _ = await store.create_key(max_parallel_requests=1)
                target, _ = await store.create_key(key_alias="fuzz-target")
                await store.create_team(team_id=TEAM, team_alias=TEAM)
                await store.create_user(user_id=USER)
                box.update(url=gateway.url, key=key, target=target, stop=trio.Event(),
                           token=trio.lowlevel.current_trio_token())
                ready.set()
                await box["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(60), "the gateway did not start"
    headers = {"authorization": f"Bearer {box['key']}", "content-type": "application/json"}
    live = Live(httpx.Client(base_url=box["url"], headers=headers, timeout=30),
                BASES["/v1/chat/completions"][0], target=box["target"])
    try:
        yield live
    finally:
        live.http.close()
        trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        thread.join(60)
        reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        seen = ", ".join(f"{k} {n}" for k, n in sorted(live.statuses.items()))
        line = (f"fuzz: {live.tried} requests tried (model and admin routes), none "
                f"answered 5xx or leaked ({seen})")
        if reporter is not None:
            reporter.write_line(line)
        print(line)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases())
def test_no_body_gets_a_5xx_or_leaves_anything_held(live: Live, case: tuple[str, bytes]
                                                    ) -> None:
    route, body = case
    http = live.http
    live.tried += 1
    response = http.post(route, content=body)
    live.statuses[f"model {response.status_code // 100}xx"] += 1
    assert response.status_code < 500, (route, body[:300], response.text[:300])
    assert "Traceback" not in response.text and 'File "' not in response.text
    # Nothing held: the next valid request is served (the settler's post-call batch
    # may still be on its way: poll briefly, never for lease_s).
    for _ in range(50):
        after = http.post("/v1/chat/completions", json=live.valid)
        if after.status_code != 429:
            break
        time.sleep(0.02)
    assert after.status_code == 200, (route, body[:300], after.text[:300])


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=admin_cases())
def test_no_admin_request_gets_a_5xx_or_stores_a_bad_row(
    live: Live, case: tuple[str, str, bytes | dict[str, str]]
) -> None:
    _method, path, payload = case
    http = live.http
    master = {"authorization": f"Bearer {MASTER_KEY}"}
    live.tried += 1
    if isinstance(payload, dict):
        response = http.get(path, params=payload, headers=master)
    else:
        payload = payload.replace(TARGET.encode(), live.target.encode())
        response = http.post(path, content=payload, headers=master)
    live.statuses[f"admin {response.status_code // 100}xx"] += 1
    assert response.status_code < 500, (path, payload, response.text[:300])
    assert "Traceback" not in response.text and 'File "' not in response.text
    for readable in ("/key/list", "/team/list", "/user/list"):
        listed = http.get(readable, headers=master)
        assert listed.status_code == 200, (path, payload, readable, listed.text[:300])
    info = http.get("/key/info", params={"key": live.target}, headers=master)
    assert info.status_code in (200, 404), (path, payload, info.text[:300])
    after = http.post("/v1/chat/completions", json=live.valid)
    assert after.status_code == 200, (path, payload, after.text[:300])
