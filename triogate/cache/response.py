"""The response cache: exact-match answers in Redis, read before the call, written after.

* **Read** (:meth:`ResponseCache.lookup`): a batch participant of admission. It declares
  ONE ``GET`` on the ``cache`` backend, so the read rides the same pipeline as auth,
  budgets, rate limits and routing: no wait of its own.
* **Write** (:meth:`ResponseCache.store`): ONE ``SET key value PX ttl`` on the request's
  post-call batch, next to settlement and usage. A replay of it after an outage writes
  the same answer again (an equivalent answer, if another request refreshed the entry in
  between) and restarts its TTL: idempotent by nature, no marker needed.
* **The key** is :func:`triogate.cache.key.cache_key` (documented there); streams are
  turned into bodies and back by :mod:`triogate.cache.replay`.

Policy:

* **Fail-open.** The cache is an optimisation: an unreachable Redis, an error reply or
  an entry that does not decode is a miss (logged), never an error for the client.
* **Namespaces.** ``scope="team"`` (the default): members of a team share entries;
  a key without a team gets its own namespace. Cache sharing is a privacy question:
  an entry answers anyone who sends the same request, and ``x-triogate-cache: hit``
  tells them that someone already asked it (membership inference). Teams already share
  budgets and keys, so they are a sensible trust boundary; unrelated team-less keys are
  not, so they do not share a "no team" pool. ``scope="global"`` shares across every
  caller (LiteLLM's behaviour, for single-tenant gateways); ``scope="key"`` never shares
  between keys.
* **Per-request controls** (:func:`parse_cache_control`): the body's ``cache`` object
  (LiteLLM's spelling) and the ``cache-control`` / ``x-triogate-cache-ttl`` headers.
* **What is stored**: any successful complete answer, whatever its temperature (the key
  includes it), up to ``max_entry_bytes``. A stream is stored once it finished.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Literal

import attrs
import orjson
import trio

from triogate.batch import BackendUnavailable, CommandError
from triogate.cache.key import cache_key
from triogate.providers.records import Usage

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.batch import Batch, Handle, PostCallBatch
    from triogate.config import CacheSettings
    from triogate.governance.principals import Identity
    from triogate.providers.records import Api

logger = logging.getLogger("triogate.cache")

#: Owner name of every command the cache declares (traces, per-owner errors).
OWNER = "cache"

#: Response header saying whether the answer came from the cache: ``hit`` or ``miss``.
HEADER = "x-triogate-cache"

#: Request header with a per-request TTL in seconds (the body's ``cache.ttl`` wins).
TTL_HEADER = "x-triogate-cache-ttl"

#: The longest TTL a request may ask for (one year): longer is almost surely a mistake,
#: and Redis refuses expiry times past 2**63 ms anyway.
MAX_TTL_S = 365 * 24 * 3600.0

#: Format version of the stored value (see :func:`encode_entry`).
ENTRY_VERSION = 1

Scope = Literal["team", "global", "key"]
SCOPES: tuple[Scope, ...] = ("team", "global", "key")


# --------------------------------------------------------------------------- controls


@attrs.frozen(kw_only=True)
class CacheControl:
    """The cache controls of one request.

    Attributes:
        no_cache: do not answer from the cache (the fresh answer is still stored, unless
            ``no_store``): "give me a new one and remember it".
        no_store: do not write the answer to the cache.
        ttl_s: keep the stored answer this long (seconds) instead of the configured TTL.
    """

    no_cache: bool = False
    no_store: bool = False
    ttl_s: float | None = None


_BODY_FLAGS = {"no-cache": "no_cache", "no_cache": "no_cache",
               "no-store": "no_store", "no_store": "no_store"}


def _ttl(value: Any, where: str) -> float:
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = math.nan
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= MAX_TTL_S):
        raise ValueError(
            f"{where} must be a number of seconds greater than 0 and at most "
            f"{MAX_TTL_S:.0f}, got {value!r}"
        )
    return number


def parse_cache_control(body: Mapping[str, Any], headers: Mapping[str, str]) -> CacheControl:
    """Read a request's cache controls from its body and headers.

    Body: ``"cache": {"no-cache": bool, "no-store": bool, "ttl": seconds}`` (``no_cache``
    and ``no_store`` are accepted too; ``"cache": null`` is the same as no object).
    Headers: ``cache-control`` with the ``no-cache`` / ``no-store`` directives (others,
    such as ``max-age``, are ignored, as HTTP caches ignore directives they do not
    apply), and ``x-triogate-cache-ttl: <seconds>``. A flag set in either place holds;
    the body's ``ttl`` wins over the header's.

    Raises:
        ValueError: a value of the wrong type or range, or an unknown key in the body's
            ``cache`` object (a typo must not silently cache); the message names the field.
    """
    no_cache = no_store = False
    ttl_s: float | None = None
    lowered = {name.lower(): value for name, value in headers.items()}
    for directive in lowered.get("cache-control", "").split(","):
        token = directive.strip().lower()
        no_cache = no_cache or token == "no-cache"
        no_store = no_store or token == "no-store"
    if lowered.get(TTL_HEADER) is not None:
        ttl_s = _ttl(lowered[TTL_HEADER], f"header {TTL_HEADER!r}")
    raw = body.get("cache")
    if raw is None:
        return CacheControl(no_cache=no_cache, no_store=no_store, ttl_s=ttl_s)
    if not isinstance(raw, dict):
        raise ValueError(f"field 'cache' must be an object, got {type(raw).__name__}")
    for name, value in raw.items():
        if name in _BODY_FLAGS:
            if not isinstance(value, bool):
                raise ValueError(f"field 'cache.{name}' must be a boolean, got {value!r}")
            if _BODY_FLAGS[name] == "no_cache":
                no_cache = no_cache or value
            else:
                no_store = no_store or value
        elif name == "ttl":
            if isinstance(value, str):  # a header is text; a JSON body has numbers
                raise ValueError(f"field 'cache.ttl' must be a number, got {value!r}")
            if value is not None:
                ttl_s = _ttl(value, "field 'cache.ttl'")
        else:
            raise ValueError(
                f"field 'cache.{name}' is not a cache control "
                "(known: 'no-cache', 'no-store', 'ttl')"
            )
    return CacheControl(no_cache=no_cache, no_store=no_store, ttl_s=ttl_s)


# --------------------------------------------------------------------------- entries


@attrs.frozen(kw_only=True)
class CachedResponse:
    """An answer found in the cache.

    Attributes:
        body: the complete response in the client's API shape (as a non-streaming
            client gets it; :func:`triogate.cache.replay.replay` makes it a stream).
        usage: what the original call used (a hit itself costs nothing).
        created_ms: when the answer was stored (epoch ms).
    """

    body: dict[str, Any]
    usage: Usage
    created_ms: int


def encode_entry(key: str, api: Api, body: Mapping[str, Any], usage: Usage,
                 created_ms: int) -> bytes:
    """The stored value: JSON with a format version, the key it belongs to and the answer.

    The key is stored too, so a value that somehow landed under another key is refused.
    """
    return orjson.dumps({
        "v": ENTRY_VERSION,
        "key": key,
        "api": api,
        "created_ms": created_ms,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "reported": usage.reported},
        "body": body,
    })


def decode_entry(raw: bytes, *, key: str, api: Api) -> CachedResponse:
    """Parse a stored value.

    Raises:
        ValueError: not an entry of this format, key and API.
    """
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(entry, dict) or entry.get("v") != ENTRY_VERSION:
        raise ValueError("unknown entry format")
    if entry.get("key") != key or entry.get("api") != api:
        raise ValueError("entry belongs to another key or API")
    body, usage, created_ms = entry.get("body"), entry.get("usage"), entry.get("created_ms")
    if not isinstance(body, dict) or not isinstance(usage, dict) or type(created_ms) is not int:
        raise ValueError("entry lacks its body, usage or creation time")
    inputs, outputs = usage.get("input_tokens"), usage.get("output_tokens")
    if type(inputs) is not int or type(outputs) is not int:
        raise ValueError("entry usage is not integer tokens")
    return CachedResponse(
        body=body,
        usage=Usage(input_tokens=inputs, output_tokens=outputs,
                    reported=bool(usage.get("reported", True))),
        created_ms=created_ms,
    )


def personalise(api: Api, cached: Mapping[str, Any], request: Mapping[str, Any]
                ) -> dict[str, Any]:
    """The cached answer as the *current* request should see it.

    The Responses API echoes ``user`` and ``metadata`` back, and neither is in the key
    (they cannot change the answer): without this, a hit would show one caller another
    caller's end-user id and labels.
    """
    body = dict(cached)
    if api == "responses":
        if "user" in body:
            body["user"] = request.get("user")
        if "metadata" in body:
            body["metadata"] = request.get("metadata") or {}
    return body


# --------------------------------------------------------------------------- the cache


def _scope(_: object, __: attrs.Attribute[Any], value: str) -> None:
    if value not in SCOPES:
        raise ValueError(f"cache scope must be one of {', '.join(SCOPES)}, got {value!r}")


@attrs.frozen(kw_only=True)
class PendingLookup:
    """A declared cache GET (:meth:`ResponseCache.declare_lookup`) waiting for its round."""

    key: str
    api: Api
    body: Mapping[str, Any]
    handle: Handle[object]


@attrs.frozen(kw_only=True)
class ResponseCache:
    """The exact-match response cache (see the module docstring).

    Attributes:
        enabled: False makes every lookup a miss and every store a no-op.
        ttl_s: how long answers are kept unless a request says otherwise (seconds).
        scope: who shares entries: ``team`` (default), ``global`` or ``key``.
        max_entry_bytes: answers whose stored value is larger are not stored.
        backend: the batch backend name the commands go to.
    """

    enabled: bool
    ttl_s: float = attrs.field(validator=attrs.validators.gt(0))
    scope: Scope = attrs.field(default="team", validator=_scope)
    max_entry_bytes: int = attrs.field(default=1_000_000, validator=attrs.validators.gt(0))
    backend: str = "cache"

    @classmethod
    def from_settings(cls, settings: CacheSettings, **overrides: Any) -> ResponseCache:
        """Build from ``GatewayConfig.cache``; ``overrides`` set scope, limits, backend."""
        return cls(enabled=settings.enabled, ttl_s=settings.ttl_s, **overrides)

    @property
    def needs_identity(self) -> bool:
        """Whether :meth:`namespace` depends on who asks (False only for ``global``).

        With ``global`` the lookup need not wait for auth at all.
        """
        return self.scope != "global"

    def namespace(self, identity: Identity | None) -> str:
        """Who may share entries with this caller (part of every key).

        ``team:<id>`` for a key in a team, else ``key:<sha256>``; ``key:<sha256>`` with
        scope ``key``; ``global`` with scope ``global`` (``identity`` may then be None).

        Raises:
            ValueError: ``identity`` is None and the scope needs one.
        """
        if self.scope == "global":
            return "global"
        if identity is None:
            raise ValueError(f"cache scope {self.scope!r} needs the caller's identity")
        if self.scope == "team" and identity.team is not None:
            return f"team:{identity.team.id}"
        return f"key:{identity.key.id}"

    def header(self, hit: bool) -> dict[str, str]:
        """The ``x-triogate-cache`` response header (none when the cache is off)."""
        return {HEADER: "hit" if hit else "miss"} if self.enabled else {}

    async def lookup(
        self,
        batch: Batch,
        api: Api,
        group: str,
        body: Mapping[str, Any],
        control: CacheControl,
        *,
        namespace: str,
    ) -> CachedResponse | None:
        """Find the request's answer: a participant declaring ONE GET, then awaiting it.

        Returns None on a miss, when the cache is disabled, when the request said
        ``no-cache``, and when Redis failed or the entry does not decode (fail-open:
        logged, never raised). A checkpoint.

        Raises:
            BatchClosed: the batch has closed (a wiring error, not a Redis failure).
        """
        return await self.finish_lookup(
            self.declare_lookup(batch, api, group, body, control, namespace=namespace))

    def declare_lookup(
        self,
        batch: Batch,
        api: Api,
        group: str,
        body: Mapping[str, Any],
        control: CacheControl,
        *,
        namespace: str,
    ) -> PendingLookup | None:
        """:meth:`lookup`'s GET alone (sync; None: nothing to look up), for a caller that
        waits on the batch anyway (the admission's host): no task for one GET. Then
        :meth:`finish_lookup`.

        Raises:
            BatchClosed: the batch has closed.
        """
        if not self.enabled or control.no_cache:
            return None
        try:
            key = cache_key(api, group, body, namespace=namespace)
        except TypeError as exc:
            logger.warning("request not cacheable: %s", exc)
            return None
        handle = batch.call("GET", keys=[key], backend=self.backend, owner=OWNER)
        return PendingLookup(key=key, api=api, body=body, handle=handle)

    async def finish_lookup(self, pending: PendingLookup | None) -> CachedResponse | None:
        """The answer a :meth:`declare_lookup` found, or None (see :meth:`lookup`). A
        checkpoint (a cancel point only when its round has been waited for already)."""
        if pending is None:
            await trio.lowlevel.checkpoint()
            return None
        key, api = pending.key, pending.api
        try:
            raw = await pending.handle
        except (BackendUnavailable, CommandError) as exc:
            logger.warning("cache read failed, treated as a miss: %s", exc)
            return None
        if raw is None:
            return None
        if not isinstance(raw, (bytes, str)):
            logger.warning("cache entry %s is not a string reply; treated as a miss", key)
            return None
        try:
            cached = decode_entry(raw.encode() if isinstance(raw, str) else raw, key=key, api=api)
        except ValueError as exc:
            logger.warning("cache entry %s does not decode (%s); treated as a miss", key, exc)
            return None
        return attrs.evolve(cached, body=personalise(api, cached.body, pending.body))

    def stores(self, control: CacheControl) -> bool:
        """Whether :meth:`store` would keep an answer under ``control`` (a stream keeps
        its events for it only then)."""
        return self.enabled and not control.no_store

    def store(
        self,
        post: PostCallBatch,
        api: Api,
        group: str,
        body: Mapping[str, Any],
        response_body: Mapping[str, Any] | None,
        usage: Usage,
        control: CacheControl,
        *,
        namespace: str,
        now_ms: int,
        key: str | None = None,
    ) -> bool:
        """Declare ONE ``SET key value PX ttl`` on the post-call batch. Sync; never blocks.

        Args:
            post: the request's post-call batch.
            api, group, body, namespace: as for :meth:`lookup` (the same key).
            response_body: the complete answer in the client's shape (for a stream:
                ``cache_replay.assemble(api, events)``); None stores nothing.
            usage: what the call used, kept with the answer.
            control: the request's controls (``no_store``, ``ttl_s``).
            now_ms: the wall clock (epoch ms), kept as the entry's creation time.
            key: the key :meth:`declare_lookup` computed for this same request, if it
                did: hashing the canonical request is not repeated.

        Returns:
            Whether a SET was declared: False when disabled, ``no_store``, no answer,
            not encodable, or larger than ``max_entry_bytes``.
        """
        if not self.stores(control) or response_body is None:
            return False
        try:
            if key is None:
                key = cache_key(api, group, body, namespace=namespace)
            value = encode_entry(key, api, response_body, usage, now_ms)
        except (TypeError, orjson.JSONEncodeError) as exc:
            logger.warning("answer not cacheable: %s", exc)
            return False
        if len(value) > self.max_entry_bytes:
            logger.info("answer of %d bytes not cached (max_entry_bytes %d)", len(value),
                        self.max_entry_bytes)
            return False
        ttl_ms = max(1, round((control.ttl_s or self.ttl_s) * 1000))
        # Never journaled: a lost SET costs one cache miss; journaled, up to max_entry_bytes
        # per request of disk and memory while Redis is down.
        post.call("SET", keys=[key], args=[value, "PX", ttl_ms], backend=self.backend,
                  owner=OWNER, journal=False)
        return True
