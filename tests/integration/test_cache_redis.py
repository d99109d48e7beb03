"""The response cache against a real Redis-compatible server."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pytest
import trio

from triogate.batch import RespBackend, Settler, open_batch_scope, open_post_call_batch
from triogate.cache.key import cache_key
from triogate.cache.replay import assemble, replay
from triogate.cache.response import CacheControl, CachedResponse, ResponseCache
from triogate.providers.records import Usage

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import Backend

pytestmark = pytest.mark.integration

NOW_MS = 1_790_000_000_000
NO_CONTROL = CacheControl()
USAGE = Usage(input_tokens=5, output_tokens=2)
BODY: dict[str, Any] = {"model": "g", "messages": [{"role": "user", "content": "hi"}]}


def answer(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "up",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": USAGE.to_chat(),
    }


async def store(backend: Backend, cache: ResponseCache, response: dict[str, Any] | None, *,
                body: dict[str, Any] = BODY, namespace: str = "team:a",
                control: CacheControl = NO_CONTROL) -> bool:
    settler = Settler({"cache": backend})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        async with open_post_call_batch(settler, trace_id="req") as post:
            declared = cache.store(post, "chat", "g", body, response, USAGE, control,
                                   namespace=namespace, now_ms=NOW_MS)
        await settler.wait_drained()
        nursery.cancel_scope.cancel()
    return declared


async def lookup(backend: Backend, cache: ResponseCache, *, body: dict[str, Any] = BODY,
                 namespace: str = "team:a") -> tuple[CachedResponse | None, int]:
    async def neighbour() -> object:
        return await scope.batch.call("GET", keys=["tg:{routing}:x"], backend="cache",
                                      owner="routing")

    run = functools.partial(cache.lookup, namespace=namespace)
    async with open_batch_scope({"cache": backend}) as scope:
        found = scope.start_participant(run, scope.batch, "chat", "g", body, CacheControl(),
                                        name="cache")
        scope.start_participant(neighbour, name="routing")
    return found.result(), scope.statistics().rounds


def cache(**changes: Any) -> ResponseCache:
    return ResponseCache(**{"enabled": True, "ttl_s": 600.0, **changes})


async def test_store_then_lookup_round_trip(redis: RespBackend) -> None:
    with trio.fail_after(10):
        assert await store(redis, cache(), answer("hello"))
        found, rounds = await lookup(redis, cache())
    assert found == CachedResponse(body=answer("hello"), usage=USAGE, created_ms=NOW_MS)
    assert rounds == 1
    with trio.fail_after(10):
        missing, _ = await lookup(redis, cache(), body={**BODY, "temperature": 0})
    assert missing is None


async def test_the_ttl_is_honoured(redis: RespBackend) -> None:
    key = cache_key("chat", "g", BODY, namespace="team:a")
    other = {**BODY, "seed": 1}
    other_key = cache_key("chat", "g", other, namespace="team:a")
    with trio.fail_after(10):
        await store(redis, cache(ttl_s=600.0), answer("configured"))
        await store(redis, cache(ttl_s=600.0), answer("per request"), body=other,
                    control=CacheControl(ttl_s=2.5))
        [configured, per_request] = await redis.execute([("PTTL", key), ("PTTL", other_key)])
    assert 598_000 < configured <= 600_000  # type: ignore[operator]
    assert 500 < per_request <= 2_500  # type: ignore[operator]


async def test_an_expired_entry_is_a_miss(redis: RespBackend) -> None:
    with trio.fail_after(10):
        await store(redis, cache(ttl_s=0.05), answer("brief"))
        await trio.sleep(0.2)
        found, _ = await lookup(redis, cache())
    assert found is None


async def test_namespaces_do_not_collide(redis: RespBackend) -> None:
    with trio.fail_after(10):
        await store(redis, cache(), answer("for a"), namespace="team:a")
        await store(redis, cache(), answer("for b"), namespace="team:b")
        a, _ = await lookup(redis, cache(), namespace="team:a")
        b, _ = await lookup(redis, cache(), namespace="team:b")
        c, _ = await lookup(redis, cache(), namespace="team:c")
        [size] = await redis.execute([("DBSIZE",)])
    assert a is not None and a.body["choices"][0]["message"]["content"] == "for a"
    assert b is not None and b.body["choices"][0]["message"]["content"] == "for b"
    assert c is None
    assert size == 2


async def test_oversized_entries_are_not_stored(redis: RespBackend) -> None:
    with trio.fail_after(10):
        assert not await store(redis, cache(max_entry_bytes=100), answer("x" * 200))
        [size] = await redis.execute([("DBSIZE",)])
        found, _ = await lookup(redis, cache(max_entry_bytes=100))
    assert size == 0
    assert found is None


async def test_a_stored_stream_answers_a_stream_and_a_plain_request(redis: RespBackend) -> None:
    events = replay("chat", answer("streamed"))
    with trio.fail_after(10):
        await store(redis, cache(), assemble("chat", events), body={**BODY, "stream": True})
        plain, _ = await lookup(redis, cache())
        streamed, _ = await lookup(redis, cache(), body={**BODY, "stream": True})
    assert plain is not None and streamed is not None
    assert plain.body == answer("streamed")
    assert replay("chat", streamed.body) == events


async def test_a_wrong_type_at_the_key_is_a_miss(redis: RespBackend) -> None:
    key = cache_key("chat", "g", BODY, namespace="team:a")
    with trio.fail_after(10):
        await redis.execute([("HSET", key, "f", "v")])
        found, _ = await lookup(redis, cache())
    assert found is None


async def test_an_unreachable_server_is_a_miss(tmp_path: Path) -> None:
    backend = RespBackend(f"unix://{tmp_path}/nothing.sock", name="down", command_timeout_s=1.0)
    try:
        with trio.fail_after(10):
            found, rounds = await lookup(backend, cache())
    finally:
        await backend.aclose()
    assert found is None
    assert rounds == 1
