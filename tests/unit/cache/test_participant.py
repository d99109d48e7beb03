"""ResponseCache as a batch participant (GET) and a post-call write (SET), on fakes."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from triogate.batch import (
    Batch,
    CommandError,
    Settler,
    open_batch_scope,
    open_post_call_batch,
)
from triogate.batch.testing import FaultyBackend, RecordingBackend
from triogate.cache.key import cache_key
from triogate.cache.response import (
    HEADER,
    OWNER,
    CacheControl,
    CachedResponse,
    ResponseCache,
    encode_entry,
)
from triogate.config import CacheSettings
from triogate.governance.principals import Identity, Principal
from triogate.providers.records import Usage

from .bodies import CHAT_TEXT, RESPONSES_TEXT

if TYPE_CHECKING:
    from triogate.batch import Backend, Command

pytestmark = pytest.mark.usefixtures("autojump_clock")

#: A command as the backend receives it (``("GET", key)``).
Wire = tuple[object, ...]

NOW_MS = 1_790_000_000_000
NO_CONTROL = CacheControl()
USAGE = Usage(input_tokens=12, output_tokens=7)
BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
NS = "team:ml"
KEY = cache_key("chat", "gpt-4o", BODY, namespace=NS)


def make_cache(**changes: Any) -> ResponseCache:
    return ResponseCache(**{"enabled": True, "ttl_s": 600.0, **changes})


def text(arg: object) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


class FakeRedis:
    """GET and SET over a dict: enough Redis for a store-then-lookup round trip."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.ttl_ms: dict[str, int] = {}

    def __call__(self, wire: Wire) -> object:
        name = text(wire[0]).upper()
        if name == "GET":
            return self.data.get(text(wire[1]))
        if name == "SET":
            key, value = text(wire[1]), wire[2]
            assert text(wire[3]) == "PX"
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()
            self.ttl_ms[key] = int(text(wire[4]))
            return b"OK"
        return None


async def neighbour(batch: Batch) -> object:
    """Another subsystem of admission, declaring its own read."""
    return await batch.call("GET", keys=["tg:{routing}:x"], backend="cache", owner="routing")


async def run_lookup(
    backend: Backend,
    cache: ResponseCache,
    *,
    api: str = "chat",
    body: dict[str, Any] = BODY,
    control: CacheControl = NO_CONTROL,
    namespace: str = NS,
    backends: dict[str, Backend] | None = None,
) -> tuple[CachedResponse | None, int]:
    """The cache and one neighbour in one scope; the lookup's result and the rounds."""
    lookup = functools.partial(cache.lookup, namespace=namespace)
    with trio.fail_after(5):
        async with open_batch_scope(backends or {"cache": backend}) as scope:
            found = scope.start_participant(lookup, scope.batch, api, "gpt-4o", body, control,
                                            name="cache")
            scope.start_participant(neighbour, scope.batch, name="routing")
    return found.result(), scope.statistics().rounds


async def run_store(cache: ResponseCache, *, response: dict[str, Any] | None = CHAT_TEXT,
                    control: CacheControl = NO_CONTROL, backend: Backend | None = None,
                    ) -> tuple[bool, tuple[Command, ...], RecordingBackend | Backend]:
    """store() in a post-call batch, sent by a running settler."""
    backend = backend or RecordingBackend()
    settler = Settler({"cache": backend})
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(settler.run)
            async with open_post_call_batch(settler, trace_id="req-1") as post:
                declared = cache.store(post, "chat", "gpt-4o", BODY, response, USAGE, control,
                                       namespace=NS, now_ms=NOW_MS)
            await settler.wait_drained()
            nursery.cancel_scope.cancel()
    return declared, post.commands, backend


# --------------------------------------------------------------------------- lookup


async def test_a_hit_is_one_get_in_the_same_round_as_the_neighbours() -> None:
    value = encode_entry(KEY, "chat", CHAT_TEXT, USAGE, NOW_MS)
    backend = RecordingBackend(respond=lambda w: value if text(w[1]) == KEY else None)
    found, rounds = await run_lookup(backend, make_cache())
    assert rounds == 1
    assert len(backend.pipelines) == 1
    # Trio may run the two participants in either order; the pipeline is what counts.
    assert sorted((text(c[0]), text(c[1])) for c in backend.pipelines[0]) == sorted([
        ("GET", KEY), ("GET", "tg:{routing}:x")])
    assert found == CachedResponse(body=CHAT_TEXT, usage=USAGE, created_ms=NOW_MS)


async def test_a_miss_is_none_after_the_same_single_round() -> None:
    backend = RecordingBackend()
    found, rounds = await run_lookup(backend, make_cache())
    assert found is None
    assert rounds == 1
    assert backend.commands == ["GET", "GET"]


@pytest.mark.parametrize(
    ("label", "cache", "control"),
    [
        ("disabled", make_cache(enabled=False), CacheControl()),
        ("no-cache", make_cache(), CacheControl(no_cache=True)),
        ("no-cache and no-store", make_cache(), CacheControl(no_cache=True, no_store=True)),
    ],
)
async def test_no_read_when_disabled_or_no_cache(label: str, cache: ResponseCache,
                                                 control: CacheControl) -> None:
    value = encode_entry(KEY, "chat", CHAT_TEXT, USAGE, NOW_MS)
    backend = RecordingBackend(respond=lambda w: value)
    found, rounds = await run_lookup(backend, cache, control=control)
    assert found is None
    assert backend.commands == ["GET"]  # the neighbour's only
    assert rounds == 1


async def test_a_lookup_declared_by_the_host_joins_the_round_without_a_task() -> None:
    """declare_lookup (sync) in a host scope, a neighbour task, finish_lookup: one round,
    one task; nothing declared when the request said no-cache."""
    value = encode_entry(KEY, "chat", CHAT_TEXT, USAGE, NOW_MS)
    backend = RecordingBackend(respond=lambda w: value if text(w[1]) == KEY else None)
    cache = make_cache()
    with trio.fail_after(5):
        async with open_batch_scope({"cache": backend}, host=True) as scope:
            assert cache.declare_lookup(scope.batch, "chat", "gpt-4o", BODY,
                                        CacheControl(no_cache=True), namespace=NS) is None
            pending = cache.declare_lookup(scope.batch, "chat", "gpt-4o", BODY, NO_CONTROL,
                                           namespace=NS)
            scope.start_participant(neighbour, scope.batch, name="routing")
            found = await cache.finish_lookup(pending)
            assert await cache.finish_lookup(None) is None
    assert scope.statistics().rounds == 1
    assert scope.statistics().participants == 1
    assert sorted(text(c[1]) for c in backend.pipelines[0]) == sorted([KEY, "tg:{routing}:x"])
    assert found == CachedResponse(body=CHAT_TEXT, usage=USAGE, created_ms=NOW_MS)


async def test_lookup_fails_open_when_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    backend = FaultyBackend(RecordingBackend())
    backend.down = True
    with caplog.at_level(logging.WARNING, logger="triogate.cache"):
        found, rounds = await run_lookup(backend, make_cache())
    assert found is None
    assert rounds == 1
    assert "treated as a miss" in caplog.text


async def test_lookup_fails_open_on_an_error_reply() -> None:
    def respond(wire: Wire) -> object:
        return CommandError("WRONGTYPE Operation against a key holding the wrong kind of value")

    found, _ = await run_lookup(RecordingBackend(respond=respond), make_cache())
    assert found is None


def _entry(**changes: Any) -> bytes:
    entry = orjson.loads(encode_entry(KEY, "chat", CHAT_TEXT, USAGE, NOW_MS))
    entry.update(changes)
    return orjson.dumps(entry)


@pytest.mark.parametrize(
    ("label", "raw"),
    [
        ("not JSON", b"\x00garbage"),
        ("JSON but not an object", b"[1, 2]"),
        ("another format version", _entry(v=99)),
        ("another key's entry", _entry(key="tg:{cache:" + "0" * 64 + "}")),
        ("another API's entry", _entry(api="messages")),
        ("no body", _entry(body=None)),
        ("usage not integers", _entry(usage={"input_tokens": "1", "output_tokens": 2})),
        ("created_ms not an integer", _entry(created_ms=1.5)),
        ("an integer reply", 7),
    ],
)
async def test_an_entry_that_does_not_decode_is_a_miss(
    label: str, raw: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="triogate.cache"):
        found, _ = await run_lookup(RecordingBackend(respond=lambda w: raw), make_cache())
    assert found is None
    assert KEY in caplog.text


async def test_the_cache_uses_its_configured_backend_name() -> None:
    main, other = RecordingBackend(name="main"), RecordingBackend(name="cache-only")
    cache = make_cache(backend="responses")
    _, rounds = await run_lookup(main, cache, backends={"cache": main, "responses": other})
    assert other.commands == ["GET"] and main.commands == ["GET"]
    assert rounds == 1


async def test_a_responses_hit_echoes_the_current_callers_user_and_metadata() -> None:
    stored = {**RESPONSES_TEXT, "user": "alice", "metadata": {"team": "secret"}}
    request = {"model": "gpt-4o", "input": "hi", "user": "bob"}
    key = cache_key("responses", "gpt-4o", request, namespace=NS)
    value = encode_entry(key, "responses", stored, USAGE, NOW_MS)
    backend = RecordingBackend(respond=lambda w: value if text(w[1]) == key else None)
    found, _ = await run_lookup(backend, make_cache(), api="responses", body=request)
    assert found is not None
    assert found.body["user"] == "bob"
    assert found.body["metadata"] == {}
    assert found.body["output"] == RESPONSES_TEXT["output"]


# --------------------------------------------------------------------------- store


async def test_store_declares_one_set_with_the_configured_ttl() -> None:
    declared, commands, backend = await run_store(make_cache(ttl_s=600.0))
    assert declared
    assert [(c.name, c.owner, c.backend) for c in commands] == [("SET", OWNER, "cache")]
    assert isinstance(backend, RecordingBackend)
    [[wire]] = backend.pipelines
    assert text(wire[0]) == "SET" and text(wire[1]) == KEY
    assert (text(wire[3]), text(wire[4])) == ("PX", "600000")
    entry = orjson.loads(wire[2])
    assert entry["body"] == CHAT_TEXT and entry["created_ms"] == NOW_MS


async def test_a_per_request_ttl_overrides_the_configured_one() -> None:
    _, commands, _ = await run_store(make_cache(ttl_s=600.0), control=CacheControl(ttl_s=1.5))
    assert commands[0].args[1:] == ("PX", 1500)


async def test_no_cache_still_stores() -> None:
    declared, commands, _ = await run_store(make_cache(), control=CacheControl(no_cache=True))
    assert declared and len(commands) == 1


@pytest.mark.parametrize(
    ("label", "cache", "control", "response"),
    [
        ("disabled", make_cache(enabled=False), CacheControl(), CHAT_TEXT),
        ("no-store", make_cache(), CacheControl(no_store=True), CHAT_TEXT),
        ("no answer (an unfinished stream)", make_cache(), CacheControl(), None),
        ("too big", make_cache(max_entry_bytes=200), CacheControl(), CHAT_TEXT),
    ],
)
async def test_store_skips(label: str, cache: ResponseCache, control: CacheControl,
                           response: dict[str, Any] | None) -> None:
    declared, commands, backend = await run_store(cache, control=control, response=response)
    assert not declared
    assert commands == ()
    assert isinstance(backend, RecordingBackend) and backend.pipelines == []


async def test_an_entry_just_under_the_limit_is_stored() -> None:
    size = len(encode_entry(KEY, "chat", CHAT_TEXT, USAGE, NOW_MS))
    declared, _, _ = await run_store(make_cache(max_entry_bytes=size))
    assert declared
    declared, _, _ = await run_store(make_cache(max_entry_bytes=size - 1))
    assert not declared


async def test_what_store_writes_lookup_reads_back() -> None:
    redis = FakeRedis()
    cache = make_cache()
    await run_store(cache, backend=RecordingBackend(respond=redis))
    found, rounds = await run_lookup(RecordingBackend(respond=redis), cache)
    assert rounds == 1
    assert found == CachedResponse(body=CHAT_TEXT, usage=USAGE, created_ms=NOW_MS)
    # Another namespace, group or body does not see it.
    missing, _ = await run_lookup(RecordingBackend(respond=redis), cache, namespace="team:x")
    assert missing is None
    missing, _ = await run_lookup(RecordingBackend(respond=redis), cache,
                                  body={**BODY, "temperature": 1})
    assert missing is None
    # The same request, streamed and from another user, does.
    same, _ = await run_lookup(RecordingBackend(respond=redis), cache,
                               body={**BODY, "stream": True, "user": "x"})
    assert same is not None


# --------------------------------------------------------------------------- policy


def identity(team: str | None) -> Identity:
    return Identity(key=Principal(kind="key", id="k" * 64),
                    team=Principal(kind="team", id=team) if team else None)


@pytest.mark.parametrize(
    ("scope", "team", "expected"),
    [
        ("team", "ml", "team:ml"),
        ("team", None, "key:" + "k" * 64),
        ("key", "ml", "key:" + "k" * 64),
        ("global", "ml", "global"),
        ("global", None, "global"),
    ],
)
def test_namespaces(scope: str, team: str | None, expected: str) -> None:
    assert make_cache(scope=scope).namespace(identity(team)) == expected


def test_only_the_global_scope_works_without_an_identity() -> None:
    assert make_cache(scope="global").namespace(None) == "global"
    assert not make_cache(scope="global").needs_identity
    for scope in ("team", "key"):
        cache = make_cache(scope=scope)
        assert cache.needs_identity
        with pytest.raises(ValueError, match="needs the caller's identity"):
            cache.namespace(None)


def test_the_default_scope_is_team() -> None:
    assert make_cache().scope == "team"


def test_the_header_says_hit_or_miss_when_enabled() -> None:
    assert make_cache().header(True) == {HEADER: "hit"}
    assert make_cache().header(False) == {HEADER: "miss"}
    assert make_cache(enabled=False).header(False) == {}


def test_built_from_the_config_settings() -> None:
    cache = ResponseCache.from_settings(CacheSettings(enabled=True, ttl_s=30.0), scope="global")
    assert (cache.enabled, cache.ttl_s, cache.scope, cache.backend) == (True, 30.0, "global",
                                                                       "cache")


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"scope": "tenant"}, "cache scope must be one of"), ({"ttl_s": 0}, "ttl_s"),
     ({"max_entry_bytes": 0}, "max_entry_bytes")],
)
def test_invalid_settings_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_cache(**changes)
