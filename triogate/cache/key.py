"""The response cache's key: what makes two requests "the same request".

One function decides it, :func:`cache_key`; :func:`canonical_request` is the document it
hashes, exposed so that tests (and operators debugging a miss) can see it. This module
is also the one place where the cache's Redis keys are built.

The rules, and why:

* **Everything is in the key unless it is known not to change the answer.** The body is
  taken as the client sent it (in its own API's shape), minus the fields of
  :data:`IGNORED_FIELDS`. Unknown and provider-specific fields (``top_k``, ``thinking``,
  ``reasoning``, ``include``, ``mock_response``, ...) are therefore in the key: a field
  we do not know might change the output, so it must split the cache, never merge it.
  A wrong hit serves someone else's answer; an extra miss costs one model call.
* **The API, the model group and the namespace are in the key.** The same words sent as
  a chat request and as a messages request get different answers (different shapes);
  two groups are different models; two namespaces (teams, by default) never share an
  entry. The body's ``model`` is dropped in favour of the group it resolved to.
* **A top-level ``null`` is the same as an absent field** (every supported API reads
  ``"temperature": null`` as "not set"). Nested values are kept exactly as given.
* **An omitted field is not its default.** An omitted ``temperature`` is absent from the
  document, ``"temperature": 0`` is present: different keys. triogate does not know each
  upstream's defaults, and they change.
* **Object key order does not matter; array order does.** JSON objects are unordered
  (RFC 8259), so the document is serialised with sorted keys. Messages, tools, stop
  sequences and content parts keep their order.
* **Numbers compare by value: ``1`` and ``1.0`` are the same.** Every upstream parses
  JSON numbers as numbers, so an integral float cannot change the answer; an upstream
  that insists on an integer (``max_tokens: 100.0``) refuses the request, and refusals
  are never cached. Booleans stay booleans (``true`` is not ``1``).
* **Content is taken as given.** ``"content": "hi"`` and ``[{"type": "text", "text":
  "hi"}]`` are different keys, as are strings that differ only in Unicode normalisation
  or whitespace. Equivalences like these are a provider's business; guessing them wrong
  would serve a wrong answer.

Temperature is not special-cased: a request at temperature 1 is cached like any other
(the key includes its temperature), as LiteLLM does; a client that wants fresh samples
says ``cache: {"no-cache": true}``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.records import Api

#: Bumped whenever the normalisation changes, so that old entries simply stop matching.
KEY_VERSION = 1

#: Prefix of every cache key in Redis.
PREFIX = "tg"

#: Top-level request fields that cannot change the answer (in any supported API), and why.
#: Every other field is part of the key.
IGNORED_FIELDS: Mapping[str, str] = {
    "model": "replaced by the model group it resolved to, which is keyed explicitly",
    "stream": "transport only: a stream is replayed from the complete stored answer",
    "stream_options": "transport only: the usage chunk is always stored, filtered on replay",
    "cache": "the cache controls themselves",
    "user": "an end-user id for the provider's abuse tracking; the model never sees it "
    "(the Responses API echoes it, so a hit re-echoes the current request's)",
    "metadata": "labels for the caller's bookkeeping (tags, Anthropic's user_id); the "
    "model never sees them (re-echoed on a Responses hit, like user)",
    "store": "whether the provider keeps the answer, not what it answers",
    "service_tier": "a latency and price class, not a different answer",
    "safety_identifier": "an end-user id for the provider's safety systems",
    "prompt_cache_key": "a routing hint for the provider's prompt cache",
    "prompt_cache_retention": "how long the provider's prompt cache keeps the prefix",
}

# Integral floats up to this magnitude are exactly representable as ints (and as JSON).
_MAX_EXACT_INT = 2**53

# 64 hex digits of SHA-256.
_DIGEST_CHARS = 64


def _canonical_value(value: Any) -> Any:
    """``value`` with integral floats as ints, recursively; everything else as given."""
    if type(value) is float:
        if value.is_integer() and abs(value) < _MAX_EXACT_INT:
            return int(value)  # also turns -0.0 into 0
        return value
    if isinstance(value, dict):
        return {key: _canonical_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(item) for item in value]
    return value


def normalise_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The output-affecting part of a request body, canonical (see the module docstring).

    Drops :data:`IGNORED_FIELDS` and top-level nulls; turns integral floats into ints.
    Key order is left alone here: serialisation sorts keys.
    """
    return {
        name: _canonical_value(value)
        for name, value in body.items()
        if name not in IGNORED_FIELDS and value is not None
    }


def canonical_request(
    api: Api, group: str, body: Mapping[str, Any], *, namespace: str
) -> bytes:
    """The exact bytes the cache key hashes: a sorted-key JSON document.

    ``{"v": KEY_VERSION, "api": ..., "group": ..., "namespace": ..., "request": ...}``
    where ``request`` is :func:`normalise_body` of ``body``.

    Raises:
        TypeError: the body holds something JSON cannot express (it came from JSON, so
            only a programming error does this).
    """
    document = {
        "v": KEY_VERSION,
        "api": api,
        "group": group,
        "namespace": namespace,
        "request": normalise_body(body),
    }
    try:
        return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"request body cannot be keyed: {exc}") from exc


def cache_key(api: Api, group: str, body: Mapping[str, Any], *, namespace: str) -> str:
    """THE normalisation: the Redis key of a request's cache entry.

    ``tg:{cache:<sha256 of canonical_request(...)>}``. The whole digest is the hash tag:
    each entry is read and written by one command (GET, SET), so entries spread over a
    Redis Cluster's slots and no two ever need to share one. The namespace is hashed in,
    not spelled out, so key names do not reveal which team asked.

    Args:
        api: the client's API; entries never cross APIs.
        group: the model group the request resolved to.
        body: the request body in the client's API shape (gateway-only fields may stay:
            the ignored ones are dropped here).
        namespace: who may share the entry (see ``ResponseCache.namespace``).
    """
    digest = hashlib.sha256(canonical_request(api, group, body, namespace=namespace))
    return entry_key(digest.hexdigest())


def entry_key(digest: str) -> str:
    """The Redis key of the entry whose canonical request hashes to ``digest``.

    Hash tag: ``{cache:<digest>}``, one slot per entry (see :func:`cache_key`).
    """
    if len(digest) != _DIGEST_CHARS:
        raise ValueError(f"expected a 64-hex-digit SHA-256 digest, got {digest!r}")
    return f"{PREFIX}:{{cache:{digest}}}"
