"""Request-body checks shared by the model endpoints: precise 400s, naming the field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.errors import ApiError
from triogate.cache.response import CacheControl, parse_cache_control

if TYPE_CHECKING:
    from collections.abc import Mapping


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


def positive_int(body: Mapping[str, Any], name: str) -> int | None:
    """An optional integer > 0."""
    value = field(body, name, int, what="an integer")
    if value is not None and value <= 0:
        raise ApiError(400, f"field '{name}' must be > 0", param=name)
    return None if value is None else int(value)


def number_between(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    """An optional number in [low, high]."""
    value = field(body, name, (int, float), what="a number")
    if value is not None and not low <= value <= high:
        raise ApiError(400, f"field '{name}' must be between {low} and {high}", param=name)
    return None if value is None else float(value)


def tags_of(body: Mapping[str, Any]) -> tuple[str, ...]:
    """Request tags from ``metadata.tags`` (LiteLLM's convention)."""
    metadata = field(body, "metadata", dict, what="an object")
    if not metadata or metadata.get("tags") is None:
        return ()
    tags = metadata["tags"]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ApiError(400, "field 'metadata.tags' must be a list of strings",
                       param="metadata.tags")
    return tuple(dict.fromkeys(tags))


def cache_control(body: Mapping[str, Any], headers: Mapping[str, str]) -> CacheControl:
    """The request's cache controls (body ``cache`` and headers); 400 when malformed."""
    try:
        return parse_cache_control(body, headers)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="cache") from None
