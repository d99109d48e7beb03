"""parse_cache_control: the per-request controls from the body and headers, as a table."""

from __future__ import annotations

from typing import Any

import pytest

from triogate.cache.response import MAX_TTL_S, CacheControl, parse_cache_control

VALID: list[tuple[str, dict[str, Any], dict[str, str], CacheControl]] = [
    ("nothing", {}, {}, CacheControl()),
    ("cache null", {"cache": None}, {}, CacheControl()),
    ("empty object", {"cache": {}}, {}, CacheControl()),
    ("no-cache", {"cache": {"no-cache": True}}, {}, CacheControl(no_cache=True)),
    ("no_cache spelling", {"cache": {"no_cache": True}}, {}, CacheControl(no_cache=True)),
    ("no-store", {"cache": {"no-store": True}}, {}, CacheControl(no_store=True)),
    ("no_store spelling", {"cache": {"no_store": True}}, {}, CacheControl(no_store=True)),
    ("false flags", {"cache": {"no-cache": False, "no-store": False}}, {}, CacheControl()),
    ("both", {"cache": {"no-cache": True, "no-store": True}}, {},
     CacheControl(no_cache=True, no_store=True)),
    ("ttl int", {"cache": {"ttl": 60}}, {}, CacheControl(ttl_s=60.0)),
    ("ttl float", {"cache": {"ttl": 0.5}}, {}, CacheControl(ttl_s=0.5)),
    ("ttl null", {"cache": {"ttl": None}}, {}, CacheControl()),
    ("ttl max", {"cache": {"ttl": MAX_TTL_S}}, {}, CacheControl(ttl_s=MAX_TTL_S)),
    ("header no-cache", {}, {"cache-control": "no-cache"}, CacheControl(no_cache=True)),
    ("header no-store", {}, {"cache-control": "no-store"}, CacheControl(no_store=True)),
    ("header both, spaced, cased", {}, {"Cache-Control": " No-Store , no-cache "},
     CacheControl(no_cache=True, no_store=True)),
    ("header other directives ignored", {}, {"cache-control": "max-age=0, private"},
     CacheControl()),
    ("header ttl", {}, {"x-triogate-cache-ttl": "120"}, CacheControl(ttl_s=120.0)),
    ("header ttl float", {}, {"x-triogate-cache-ttl": " 1.5 "}, CacheControl(ttl_s=1.5)),
    ("body ttl wins over header", {"cache": {"ttl": 5}}, {"x-triogate-cache-ttl": "120"},
     CacheControl(ttl_s=5.0)),
    ("flags from both places", {"cache": {"no-store": True}}, {"cache-control": "no-cache"},
     CacheControl(no_cache=True, no_store=True)),
    ("body false does not clear header true", {"cache": {"no-cache": False}},
     {"cache-control": "no-cache"}, CacheControl(no_cache=True)),
]

INVALID: list[tuple[str, dict[str, Any], dict[str, str], str]] = [
    ("cache not an object", {"cache": True}, {}, "field 'cache' must be an object, got bool"),
    ("cache a list", {"cache": ["no-cache"]}, {}, "field 'cache' must be an object"),
    ("flag a string", {"cache": {"no-cache": "true"}}, {},
     "field 'cache.no-cache' must be a boolean, got 'true'"),
    ("flag an int", {"cache": {"no_store": 1}}, {}, "field 'cache.no_store' must be a boolean"),
    ("ttl zero", {"cache": {"ttl": 0}}, {}, "field 'cache.ttl' must be a number of seconds"),
    ("ttl negative", {"cache": {"ttl": -5}}, {}, "greater than 0"),
    ("ttl too long", {"cache": {"ttl": MAX_TTL_S + 1}}, {}, "at most 31536000"),
    ("ttl a bool", {"cache": {"ttl": True}}, {}, "field 'cache.ttl' must be a number"),
    ("ttl a string", {"cache": {"ttl": "60"}}, {}, "field 'cache.ttl' must be a number, got '60'"),
    ("ttl an object", {"cache": {"ttl": {}}}, {}, "field 'cache.ttl'"),
    ("unknown key", {"cache": {"no-cahce": True}}, {},
     "field 'cache.no-cahce' is not a cache control"),
    ("header ttl text", {}, {"x-triogate-cache-ttl": "soon"},
     "header 'x-triogate-cache-ttl' must be a number of seconds"),
    ("header ttl zero", {}, {"x-triogate-cache-ttl": "0"}, "greater than 0"),
    ("header ttl inf", {}, {"x-triogate-cache-ttl": "inf"}, "x-triogate-cache-ttl"),
    ("header ttl nan", {}, {"x-triogate-cache-ttl": "nan"}, "x-triogate-cache-ttl"),
]


@pytest.mark.parametrize(("label", "body", "headers", "expected"), VALID,
                         ids=[r[0] for r in VALID])
def test_valid_controls(label: str, body: dict[str, Any], headers: dict[str, str],
                        expected: CacheControl) -> None:
    assert parse_cache_control(body, headers) == expected


@pytest.mark.parametrize(("label", "body", "headers", "message"), INVALID,
                         ids=[r[0] for r in INVALID])
def test_invalid_controls_name_the_field(label: str, body: dict[str, Any],
                                         headers: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cache_control(body, headers)
    assert message in str(info.value)
