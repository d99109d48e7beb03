"""A deterministic JSON value that satisfies a JSON schema, for the mock's structured answers.

Covers what tool parameters and structured outputs use (OpenAI's strict mode, pydantic's
schemas): ``type`` (or a list of types), ``properties``/``required``, ``items`` and
``prefixItems`` with ``minItems``/``maxItems``/``uniqueItems``, ``enum``, ``const``,
``$ref`` into ``$defs``/``definitions``, ``anyOf``/``oneOf`` (the first branch that is not
``null``), ``allOf`` (merged), string ``format``/``minLength``/``maxLength`` and number
bounds with ``multipleOf``. ``pattern`` is not followed. Pure.
"""

from __future__ import annotations

import math
from typing import Any

#: Nesting followed before a recursive schema is cut short (with its smallest value).
MAX_DEPTH = 12

_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}


def instance(schema: Any, *, name: str = "value") -> Any:
    """A value satisfying ``schema``; ``name`` (a property's) seeds strings."""
    return _value(schema, root=schema, name=name, index=0, depth=0, active=frozenset())


def _resolve(ref: str, root: Any) -> Any:
    node = root
    for part in ref.removeprefix("#").strip("/").split("/"):
        if not part:
            continue
        node = node[part.replace("~1", "/").replace("~0", "~")] if isinstance(node, dict) else {}
    return node


def _merge(schemas: list[Any], root: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in schemas:
        while isinstance(part, dict) and "$ref" in part:
            part = {**_resolve(part["$ref"], root), **{k: v for k, v in part.items()
                                                       if k != "$ref"}}
        if not isinstance(part, dict):
            continue
        for key, value in part.items():
            if key == "properties":
                out["properties"] = {**out.get("properties", {}), **value}
            elif key == "required":
                out["required"] = [*out.get("required", []), *value]
            else:
                out.setdefault(key, value)
    return out


def _recursive(schema: Any, active: frozenset[str]) -> bool:
    """Whether ``schema`` is a reference to a definition being expanded already."""
    return isinstance(schema, dict) and schema.get("$ref") in active


def _value(schema: Any, *, root: Any, name: str, index: int, depth: int,
           active: frozenset[str]) -> Any:
    if not isinstance(schema, dict):
        return name  # ``true`` or an empty schema: anything goes
    if "$ref" in schema:
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        active = active | {schema["$ref"]}
        schema = {**_resolve(schema["$ref"], root), **rest}
    if "allOf" in schema:
        schema = _merge([{k: v for k, v in schema.items() if k != "allOf"},
                         *schema["allOf"]], root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][index % len(schema["enum"])]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            # Not null when there is a choice, and not back into a definition being
            # expanded (a recursive model ends at its optional null).
            usable = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")
                      and not _recursive(b, active)]
            branch = (usable or [b for b in branches if not _recursive(b, active)]
                      or branches)[0]
            rest = {k: v for k, v in schema.items() if k != key}
            if _recursive(branch, active) or "$ref" in branch:
                return _value({**rest, **branch}, root=root, name=name, index=index,
                              depth=depth, active=active)
            return _value(_merge([rest, branch], root), root=root, name=name, index=index,
                          depth=depth, active=active)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((t for t in kind if t != "null"), "null")
    if kind is None:
        kind = ("object" if "properties" in schema else "array" if "items" in schema
                else "string")
    if depth >= MAX_DEPTH and kind in ("object", "array"):
        return {} if kind == "object" else []
    if kind == "object":
        return _object(schema, root=root, depth=depth, active=active)
    if kind == "array":
        return _array(schema, root=root, name=name, depth=depth, active=active)
    if kind == "string":
        return _string(schema, name, index)
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer", index=index)
    if kind == "boolean":
        return index % 2 == 0
    return None


def _object(schema: dict[str, Any], *, root: Any, depth: int,
            active: frozenset[str]) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = schema.get("required") or ()
    out = {key: _value(sub, root=root, name=key, index=0, depth=depth + 1, active=active)
           for key, sub in properties.items()
           if key in required or not _recursive(sub, active)}
    for key in required:
        if key not in out:
            extra = schema.get("additionalProperties")
            out[key] = _value(extra if isinstance(extra, dict) else {}, root=root, name=key,
                              index=0, depth=depth + 1, active=active)
    return out


def _array(schema: dict[str, Any], *, root: Any, name: str, depth: int,
           active: frozenset[str]) -> list[Any]:
    prefix = schema.get("prefixItems") or []
    items = schema.get("items", {})
    least = 0 if _recursive(items, active) else 1
    count = max(int(schema.get("minItems", least)), len(prefix))
    if "maxItems" in schema:
        count = min(count, int(schema["maxItems"]))
    out = []
    for i in range(count):
        sub = prefix[i] if i < len(prefix) else items
        out.append(_value(sub, root=root, name=name, index=i, depth=depth + 1, active=active))
    return out


def _string(schema: dict[str, Any], name: str, index: int) -> str:
    text = _FORMATS.get(str(schema.get("format")), name or "value")
    if index and schema.get("format") not in _FORMATS:
        text = f"{text}-{index}"
    minimum, maximum = int(schema.get("minLength", 0)), schema.get("maxLength")
    if len(text) < minimum:
        text += "x" * (minimum - len(text))
    if maximum is not None and len(text) > int(maximum):
        text = text[: int(maximum)]
    return text


def _number(schema: dict[str, Any], *, integer: bool, index: int) -> int | float:
    step = schema.get("multipleOf")
    unit: float = 1 if integer or step is None else step
    low = schema.get("minimum")
    exclusive_low = schema.get("exclusiveMinimum")
    if exclusive_low is True:  # draft 4: a flag on ``minimum``
        exclusive_low, low = low, None
    high = schema.get("maximum")
    exclusive_high = schema.get("exclusiveMaximum")
    if exclusive_high is True:
        exclusive_high, high = high, None
    value: float = 0
    if isinstance(low, (int, float)) and not isinstance(low, bool):
        value = low
    if isinstance(exclusive_low, (int, float)) and not isinstance(exclusive_low, bool):
        value = max(value, exclusive_low + unit) if low is not None else exclusive_low + unit
    elif low is None:
        value = 0
        if isinstance(high, (int, float)) and not isinstance(high, bool) and high < 0:
            value = high
        if isinstance(exclusive_high, (int, float)) and not isinstance(
                exclusive_high, bool) and exclusive_high <= 0:
            value = exclusive_high - unit
    value += index * unit
    if step:
        value = math.ceil(value / step - 1e-9) * step
    if isinstance(high, (int, float)) and not isinstance(high, bool) and value > high:
        value = high
    if integer:
        return math.ceil(value)
    return value
