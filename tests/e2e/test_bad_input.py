"""Bad input and tenants, through real HTTP: every malformed request a precise 4xx,
every slot given back, no tenant touching another's budget. One test per finding."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from triogate.api import validate
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.store.records import SpendLogRow
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CHAT = {"model": "gpt-test", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def tenant(tmp_path: Path, redis_url: str, upstream: FakeUpstream, **limits: Any
                 ) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, str]]:
    """A gateway, a client, and a key with one parallel slot (so any leak shows)."""
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url, triogate={
        "http": {"metrics_key": "sk-metrics", "cors_allow_origins": ["https://app.example"]}})
    async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=20) as http:
        assert gateway.services.store is not None
        key, _ = await gateway.services.store.create_key(
            max_parallel_requests=1, **limits)
        http.headers["authorization"] = f"Bearer {key}"
        http.base_url = httpx.URL(gateway.url)
        yield gateway, http, key


async def still_served(http: httpx.AsyncClient) -> None:
    """The key's next request succeeds: nothing of the previous one is still held."""
    response = await http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text


async def spend_rows(gateway: Gateway) -> list[SpendLogRow]:
    assert gateway.services.spend_logs is not None and gateway.services.store is not None
    with trio.fail_after(10):
        await gateway.services.settler.wait_drained()
        await gateway.services.spend_logs.wait_drained()
    rows, _ = await gateway.services.store.query_spend_logs()
    return list(rows)


class _Bug:
    """A provider whose every call fails with an unexpected exception (a bug's stand-in)."""

    async def complete(self, *args: object) -> object:
        await trio.lowlevel.checkpoint()
        raise RuntimeError("a bug after admission")

    def stream(self, *args: object) -> object:
        raise RuntimeError("a bug after admission")


# --------------------------------------------------------------------------- settlement


async def test_a_bug_after_admission_settles_and_leaks_nothing(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (gateway, http, key):
            providers = gateway.services.providers
            real = providers["openai"]
            providers["openai"] = _Bug()  # type: ignore[index]
            for stream in (False, True):
                failed = await http.post("/v1/chat/completions", json={**CHAT, "stream": stream})
                assert failed.status_code == 500
                assert "Traceback" not in failed.text and "a bug" not in failed.text
            providers["openai"] = real  # type: ignore[index]
            await still_served(http)
            rows = await spend_rows(gateway)
    assert sorted(r.status for r in rows) == ["error", "error", "success"]
    assert all(r.key_hash == hash_key(key) for r in rows)


async def test_a_participant_failing_during_admission_gives_back_what_the_others_held(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Routing fails (a bug) after budgets and rate limits reserved in the same round:
    admission settles their reservations and the parallel slot before the 500."""
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream, rpm_limit=100,
                          max_budget_nanousd=10**12) as (gateway, http, key):
            router = type(gateway.services.router)
            # Admission reads the routing state as declare_read + finish_read (no task).
            real = router.finish_read

            async def read_then_fail(self: Any, *args: Any) -> Any:
                await real(self, *args)
                raise RuntimeError("a bug in a participant")

            monkeypatch.setattr(router, "finish_read", read_then_fail)
            for _ in range(3):
                failed = await http.post("/v1/chat/completions", json=CHAT)
                assert failed.status_code == 500
                assert "a bug" not in failed.text and "Traceback" not in failed.text
            monkeypatch.setattr(router, "finish_read", real)
            await still_served(http)
            rows = await spend_rows(gateway)
            slots = await redis.execute([("ZCARD", f"tg:{{key:{hash_key(key)}}}:rl:par")])
    assert sorted(r.status for r in rows) == ["rejected"] * 3 + ["success"]
    assert slots == [0]


async def test_a_translation_refusal_after_admission_is_a_400_that_leaks_nothing(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (_gateway, http, _):
            for _ in range(3):
                refused = await http.post("/v1/chat/completions",
                                          json={**CHAT, "model": "claude-test", "n": 2})
                assert refused.status_code == 400
                assert refused.json()["error"]["code"] == "unsupported_for_model"
            await still_served(http)


async def test_a_request_cancelled_by_shutdown_settles_as_cancelled(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    """Hypercorn cancels requests still running when the grace period ends: each one
    still gives its parallel slot back and leaves a spend-log row."""
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            triogate={"shutdown_grace_s": 0.5})
    upstream.latency_s = 30.0
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            assert gateway.services.store is not None
            key, _ = await gateway.services.store.create_key(max_parallel_requests=1)
            started = trio.Event()

            async def slow() -> None:
                async with httpx.AsyncClient(timeout=20) as http:
                    started.set()
                    with pytest.raises(httpx.HTTPError):
                        await http.post(f"{gateway.url}/v1/chat/completions", json=CHAT,
                                        headers={"authorization": f"Bearer {key}"})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                await started.wait()
                while not upstream.requests:  # the call reached the upstream
                    await trio.sleep(0.02)
                gateway.shutdown.set()
            store = gateway.services.store
        # The gateway drained its settler and spend-log writer on the way out.
        rows, _ = await store.query_spend_logs()
        slots = await redis.execute([("ZCARD", f"tg:{{key:{hash_key(key)}}}:rl:par")])
    assert [r.status for r in rows] == ["cancelled"]
    assert slots == [0]


# --------------------------------------------------------------------------- shapes


SHAPES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [1]}]},
     "messages[0].content[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": ["x"]},
     "tools[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "n": 18446744073709551615}, "n"),
    ("/v1/messages", {"max_tokens": 5, "tools": "x",
                      "messages": [{"role": "user", "content": "hi"}]}, "tools"),
    ("/v1/messages", {"max_tokens": 5, "tools": ["x"],
                      "messages": [{"role": "user", "content": "hi"}]}, "tools.0"),
    ("/v1/messages", {"max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "image"}]}]}, "messages.0.content.0.source"),
    ("/v1/messages", {"max_tokens": 5, "messages": [
        {"role": "user", "content": [{"text": "no type"}]}]}, "messages.0.content.0.type"),
    ("/v1/responses", {"input": [1, 2]}, "input[0]"),
    ("/v1/responses", {"input": "hi", "text": {"format": "x"}}, "text.format"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": 7}}}, "text.format.type"),
    ("/v1/embeddings", {"model": "embed-test", "input": "hi",
                        "dimensions": 18446744073709551615}, "dimensions"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "user": "a\x00b"}, "user"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "metadata": {"tags": ["ok", "bad\nline"]}}, "metadata.tags[1]"),
]


@pytest.mark.parametrize(("path", "body", "param"), SHAPES)
async def test_well_formed_json_of_an_unexpected_shape_is_a_400_naming_the_field(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream,
    path: str, body: dict[str, Any], param: str,
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (_, http, _key):
            response = await http.post(path, json={"model": "gpt-test", **body})
            assert response.status_code == 400, response.text
            error = response.json()
            if path == "/v1/messages":
                assert error["type"] == "error"
                assert error["error"]["message"].startswith(f"{param}:")
            else:
                assert error["error"]["param"] == param
            await still_served(http)


@pytest.mark.parametrize("depth", [100, 600, 1000])
async def test_deep_nesting_is_a_400_not_a_recursion_error(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream, depth: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = orjson.dumps(CHAT)[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (_, http, _key):
            response = await http.post("/v1/chat/completions", content=body)
            assert response.status_code == 400
            assert "nests deeper" in response.json()["error"]["message"]
            await still_served(http)
    assert "RecursionError" not in caplog.text


async def test_out_of_range_integers_never_make_the_limits_fail_open(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream, rpm_limit=3) as (_, http, _key):
            for n in (2**40, 2**63, 18446744073709551615, 10**30):
                response = await http.post("/v1/chat/completions", json={**CHAT, "n": n})
                assert response.status_code == 400 and response.json()["error"]["param"] == "n"
            statuses = [(await http.post("/v1/chat/completions", json=CHAT)).status_code
                        for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


# --------------------------------------------------------------------------- tenants


async def test_a_key_cannot_spend_another_teams_tag_budget(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (gateway, http, _):
            store = gateway.services.store
            assert store is not None
            await store.create_tag(tag="y-spend", max_budget_nanousd=1, rpm_limit=2)
            y = await store.create_team(team_alias="y", metadata={"tags": ["y-spend"]})
            y_key, _ = await store.create_key(team_id=y.team_id)
            tagged = {**CHAT, "metadata": {"tags": ["y-spend"]}}
            for _ in range(5):
                refused = await http.post("/v1/chat/completions", json=tagged)
                assert refused.status_code == 403
                assert "y-spend" in refused.json()["error"]["message"]
            # Team Y's own key is not locked out by the five attempts.
            ok = await http.post("/v1/chat/completions", json=tagged,
                                 headers={"authorization": f"Bearer {y_key}"})
            assert ok.status_code == 200, ok.text
            # A tag without budget or limits stays a free label.
            labelled = await http.post("/v1/chat/completions",
                                       json={**CHAT, "metadata": {"tags": ["mine"]}})
            assert labelled.status_code == 200


async def test_tags_never_seen_are_bounded_in_count_and_bytes(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    """Clients name tags freely: made-up tags live in a bounded table of their own (10,000
    entries of at most 128 characters each), and never push the key's own row out."""
    bound = 10_000
    with trio.fail_after(120):
        async with tenant(tmp_path, redis_url, upstream) as (gateway, http, _):
            identities = gateway.services.identities
            for tags, param in ((["x" * (validate.MAX_TAG_CHARS + 1)], "metadata.tags[0]"),
                                ([f"t{i}" for i in range(validate.MAX_TAGS + 1)],
                                 "metadata.tags")):
                refused = await http.post("/v1/chat/completions",
                                          json={**CHAT, "metadata": {"tags": tags}})
                assert refused.status_code == 400
                assert refused.json()["error"]["param"] == param
            per, requests = validate.MAX_TAGS, bound // validate.MAX_TAGS + 20
            pad = "x" * (validate.MAX_TAG_CHARS - 12)
            statuses: list[int] = []

            async def one(i: int) -> None:
                tags = [f"{i:05}-{j:02}-{pad}"[:validate.MAX_TAG_CHARS] for j in range(per)]
                response = await http.post("/v1/chat/completions",
                                           json={**CHAT, "metadata": {"tags": tags}})
                statuses.append(response.status_code)

            async with trio.open_nursery() as nursery:
                limiter = trio.CapacityLimiter(1)  # the key has one parallel slot

                async def limited(i: int) -> None:
                    async with limiter:
                        await one(i)

                for i in range(requests):
                    nursery.start_soon(limited, i)
            known, unknown = identities.memory_entries()
            assert statuses == [200] * requests
            assert requests * per > bound and unknown == bound
            assert known >= 1  # the key's row is still in memory
            sql_loads = identities.sql_loads
            await still_served(http)  # ... and served from memory: no SQL load
            assert identities.sql_loads == sql_loads


async def test_nothing_about_models_is_told_before_the_key(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (_gateway, http, _):
            routes = ("/v1/chat/completions", "/v1/messages", "/v1/responses",
                      "/v1/embeddings", "/v1/completions", "/chat/completions",
                      "/openai/deployments/no-such-model/chat/completions",
                      "/openai/deployments/gpt-test/embeddings")
            bodies = ({**CHAT, "model": "no-such-model"}, CHAT, {"model": 3}, {},
                      {"model": "embed-test", "input": "x"})
            for headers in ({"authorization": ""}, {"authorization": "Bearer sk-not-a-key"},
                            {"authorization": "", "x-api-key": "sk-not-a-key"}):
                statuses = set()
                for route in routes:
                    for body in bodies:
                        response = await http.post(route, json=body, headers=headers)
                        statuses.add(response.status_code)
                    bad_json = await http.post(route, content=b"{nope", headers=headers)
                    statuses.add(bad_json.status_code)
                for path in ("/v1/models", "/v1/models/gpt-test", "/v1/models/no-such-model",
                             "/model/info", "/model_group/info"):
                    statuses.add((await http.get(path, headers=headers)).status_code)
                assert statuses == {401}
            # /health is an admin's (the master key, or a proxy_admin user's key): a made-up
            # key is not authenticated (401, like everywhere); a virtual key without the role
            # is refused (403); neither answer names a deployment.
            made_up = await http.get("/health", headers={"authorization": "Bearer sk-nope"})
            virtual = await http.get("/health")
            assert (made_up.status_code, virtual.status_code) == (401, 403)
            for answer in (made_up, virtual):
                assert "gpt-test" not in answer.text and "healthy" not in answer.text
            known = await http.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
            assert known.status_code == 404  # with a valid key, the precise answer


# --------------------------------------------------------------------------- HTTP


async def test_http_niceties(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    with trio.fail_after(60):
        async with tenant(tmp_path, redis_url, upstream) as (gateway, http, _key):
            closed = await http.get("/metrics")
            assert closed.status_code == 401  # a virtual key is not the metrics key
            for auth in ("sk-metrics", MASTER_KEY):
                opened = await http.get("/metrics", headers={"authorization": f"Bearer {auth}"})
                assert opened.status_code == 200 and "triogate" in opened.text
            head = await http.head("/health/liveliness")
            get = await http.get("/health/liveliness")
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-length"] == get.headers["content-length"]
            assert get.headers["content-length"] == str(len(get.content))
            assert "transfer-encoding" not in get.headers
            answer = await http.post("/v1/chat/completions", json=CHAT)
            assert answer.headers["content-length"] == str(len(answer.content))
            preflight = await http.request("OPTIONS", "/v1/chat/completions", headers={
                "origin": "https://app.example", "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type"})
            assert preflight.status_code == 204
            assert preflight.headers["access-control-allow-origin"] == "https://app.example"
            assert "POST" in preflight.headers["access-control-allow-methods"]
            assert "authorization" in preflight.headers["access-control-allow-headers"]
            stranger = await http.request("OPTIONS", "/v1/chat/completions",
                                          headers={"origin": "https://evil.example"})
            assert stranger.status_code == 204
            assert "access-control-allow-origin" not in stranger.headers
            cors = await http.post("/v1/chat/completions", json=CHAT,
                                   headers={"origin": "https://app.example"})
            assert cors.headers["access-control-allow-origin"] == "https://app.example"
            port = int(gateway.url.rsplit(":", 1)[1])
            for raw, status in ((b"NOT HTTP\r\n\r\n", 400),
                                (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000
                                 + b"\r\n\r\n", 431)):
                reply = await _raw_exchange(port, raw)
                head_part, _, body = reply.partition(b"\r\n\r\n")
                assert head_part.startswith(f"HTTP/1.1 {status}".encode())
                assert b"x-request-id: " in head_part
                assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def _raw_exchange(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        chunks = []
        while chunk := await stream.receive_some(65536):
            chunks.append(chunk)
    return b"".join(chunks)
