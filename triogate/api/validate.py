"""Request-body checks shared by the model endpoints: precise 400s, naming the field."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from triogate.api.errors import ApiError
from triogate.cache.response import CacheControl, parse_cache_control

if TYPE_CHECKING:
    from collections.abc import Mapping

#: Integers the gateway reads are bounded (they may reach a Redis script, which only takes
#: integers below 2^53, and every upstream has a smaller limit anyway).
MAX_INT = 2**31 - 1
#: Nesting depth of a request body (JSON Schemas of tools rarely pass 10).
MAX_DEPTH = 64
MAX_IDENTIFIER_CHARS = 256
MAX_TAGS = 32
MAX_TAG_CHARS = 128
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *,
          required: bool = False, what: str | None = None) -> Any:
    """``body[name]`` checked against ``kind`` (bool is not an int here)."""
    if name not in body or body[name] is None:
        if required:
            raise ApiError(400, f"missing required field '{name}'", param=name)
        return None
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass: True is not a valid max_tokens.
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        expected = what or " or ".join(k.__name__ for k in kinds)
        raise ApiError(400, f"field '{name}' must be {expected}", param=name)
    return value


def model_name(body: Mapping[str, Any], groups: Mapping[str, Any]) -> str:
    """The model group, which must exist (404 in OpenAI's convention otherwise)."""
    model = field(body, "model", str, required=True, what="a string")
    if model not in groups:
        raise ApiError(
            404, f"model '{model}' does not exist or is not served by this gateway",
            "not_found_error", param="model", code="model_not_found",
        )
    return str(model)


def positive_int(body: Mapping[str, Any], name: str, *, high: int = MAX_INT) -> int | None:
    """An optional integer in [1, high] (bounded: it may reach a Redis script)."""
    value = field(body, name, int, what="an integer")
    if value is not None and not 0 < value <= high:
        raise ApiError(400, f"field '{name}' must be between 1 and {high}", param=name)
    return None if value is None else int(value)


def number_between(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    """An optional number in [low, high]."""
    value = field(body, name, (int, float), what="a number")
    if value is not None and not low <= value <= high:
        raise ApiError(400, f"field '{name}' must be between {low} and {high}", param=name)
    return None if value is None else float(value)


def identifier(value: Any, name: str, *, max_chars: int = MAX_IDENTIFIER_CHARS) -> str | None:
    """An optional identifier chosen by the client (``user``, a tag, the end-user header).

    A string of at most ``max_chars`` characters without control characters (C0, DEL,
    C1): it becomes part of Redis keys, SQL rows and log lines. An empty string is None.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"field '{name}' must be a string", param=name)
    if len(value) > max_chars:
        raise ApiError(400, f"field '{name}' must be at most {max_chars} characters",
                       param=name)
    if _CONTROL.search(value):
        raise ApiError(400, f"field '{name}' must not contain control characters",
                       param=name)
    return value


def tags_of(body: Mapping[str, Any]) -> tuple[str, ...]:
    """Request tags from ``metadata.tags`` (LiteLLM's convention), bounded in number and size."""
    metadata = field(body, "metadata", dict, what="an object")
    if not metadata or metadata.get("tags") is None:
        return ()
    tags = metadata["tags"]
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise ApiError(400, "field 'metadata.tags' must be a list of non-empty strings",
                       param="metadata.tags")
    if len(tags) > MAX_TAGS:
        raise ApiError(400, f"field 'metadata.tags' may hold at most {MAX_TAGS} tags",
                       param="metadata.tags")
    for i, tag in enumerate(tags):
        identifier(tag, f"metadata.tags[{i}]", max_chars=MAX_TAG_CHARS)
    return tuple(dict.fromkeys(tags))


def check_depth(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """400 when JSON ``value`` nests deeper than ``max_depth`` (arrays and objects).

    Code that walks a body recursively (token estimates, cache keys, translators) would
    otherwise hit Python's recursion limit. Iterative, so it cannot overflow itself. The
    error names the top-level field that nests too deep.
    """
    stack: list[tuple[Any, int, str | None]] = [(value, 1, None)]
    while stack:
        item, depth, top = stack.pop()
        if depth > max_depth:
            where = f"field '{top}'" if top is not None else "request body"
            raise ApiError(400, f"{where} nests deeper than {max_depth} levels", param=top)
        if isinstance(item, dict):
            stack.extend((v, depth + 1, k if top is None else top)
                         for k, v in item.items() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1, top) for v in item if isinstance(v, (dict, list)))


def cache_control(body: Mapping[str, Any], headers: Mapping[str, str]) -> CacheControl:
    """The request's cache controls (body ``cache`` and headers); 400 when malformed."""
    try:
        return parse_cache_control(body, headers)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="cache") from None
