"""The cache key's normalisation, as a table: what splits the cache and what does not."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import pytest

from triogate.cache.key import (
    IGNORED_FIELDS,
    KEY_VERSION,
    cache_key,
    canonical_request,
    entry_key,
    normalise_body,
)

BASE: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "hi"}],
}

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def key(body: dict[str, Any], *, api: str = "chat", group: str = "gpt-4o",
        namespace: str = "team:ml") -> str:
    return cache_key(api, group, body, namespace=namespace)  # type: ignore[arg-type]


def with_(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


# Each row: a body that must get a DIFFERENT key from BASE (the field changes the output).
SPLITS = [
    ("temperature 0", with_(temperature=0)),
    ("temperature 1", with_(temperature=1)),
    ("top_p", with_(top_p=0.5)),
    ("max_tokens", with_(max_tokens=10)),
    ("max_completion_tokens", with_(max_completion_tokens=10)),
    ("max_output_tokens", with_(max_output_tokens=10)),
    ("seed", with_(seed=7)),
    ("stop", with_(stop=["\n"])),
    ("n", with_(n=2)),
    ("logit_bias", with_(logit_bias={"50256": -100})),
    ("logprobs", with_(logprobs=True)),
    ("tools", with_(tools=[TOOL])),
    ("tool_choice", with_(tool_choice="required")),
    ("parallel_tool_calls", with_(parallel_tool_calls=False)),
    ("response_format", with_(response_format={"type": "json_object"})),
    ("reasoning_effort", with_(reasoning_effort="high")),
    ("reasoning", with_(reasoning={"effort": "low"})),
    ("thinking", with_(thinking={"type": "enabled", "budget_tokens": 1024})),
    ("system", with_(system="be brief")),
    ("instructions", with_(instructions="be brief")),
    ("input", with_(input="hi")),
    ("top_k (provider-specific)", with_(top_k=5)),
    ("unknown field (provider-specific)", with_(safety_mode="strict")),
    ("mock_response", with_(mock_response="canned")),
    ("other message text", with_(messages=[{"role": "user", "content": "hi!"}])),
    ("other role", with_(messages=[{"role": "system", "content": "hi"}])),
    ("a text part instead of a string",
     with_(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])),
    ("messages reordered", with_(messages=[{"role": "user", "content": "a"},
                                           {"role": "user", "content": "b"}])),
    ("nested null kept", with_(messages=[{"role": "user", "content": "hi", "name": None}])),
    ("true is not 1", with_(logprobs=1)),
]

# Each row: a body that must get the SAME key as BASE (the field cannot change the output).
SAME = [
    ("stream", with_(stream=True)),
    ("stream_options", with_(stream=True, stream_options={"include_usage": True})),
    ("user", with_(user="alice")),
    ("metadata", with_(metadata={"tags": ["a"], "user_id": "u"})),
    ("cache controls", with_(cache={"no-store": True, "ttl": 5})),
    ("store", with_(store=True)),
    ("service_tier", with_(service_tier="flex")),
    ("safety_identifier", with_(safety_identifier="x")),
    ("prompt_cache_key", with_(prompt_cache_key="k")),
    ("prompt_cache_retention", with_(prompt_cache_retention="24h")),
    ("model spelled differently (the group is keyed)", with_(model="alias")),
    ("top-level null is absent", with_(temperature=None, seed=None)),
    ("key order", {"messages": [{"content": "hi", "role": "user"}], "model": "gpt-4o"}),
]


@pytest.mark.parametrize(("label", "body"), SPLITS, ids=[r[0] for r in SPLITS])
def test_fields_that_change_the_output_split_the_cache(label: str, body: dict[str, Any]) -> None:
    assert key(body) != key(BASE), label


@pytest.mark.parametrize(("label", "body"), SAME, ids=[r[0] for r in SAME])
def test_fields_that_cannot_change_the_output_share_the_entry(
    label: str, body: dict[str, Any]
) -> None:
    assert key(body) == key(BASE), label


def test_every_ignored_field_is_in_the_same_table() -> None:
    tested = {name for _, body in SAME for name in body} - set(BASE)
    assert set(IGNORED_FIELDS) <= tested | {"model"}
    assert all(reason for reason in IGNORED_FIELDS.values())


def test_omitted_temperature_is_not_zero() -> None:
    keys = {key(BASE), key(with_(temperature=0)), key(with_(temperature=0.0)),
            key(with_(temperature=1))}
    assert len(keys) == 3
    assert key(with_(temperature=0)) == key(with_(temperature=0.0))


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (1, 1.0, True),
        (0, -0.0, True),
        (0.5, 0.50, True),
        (1, 1.5, False),
        (True, 1, False),
        (False, 0, False),
        (2**60, float(2**60), False),  # beyond 2**53 floats are not turned into ints
        ("1", 1, False),
    ],
)
def test_numbers_compare_by_value_and_booleans_stay_booleans(a: Any, b: Any, same: bool) -> None:
    nested = lambda v: with_(tools=[{**TOOL, "function": {"name": "f", "x": [v]}}])  # noqa: E731
    assert (key(with_(seed=a)) == key(with_(seed=b))) is same
    assert (key(nested(a)) == key(nested(b))) is same


def test_nested_key_order_is_irrelevant() -> None:
    a = with_(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}])
    b = with_(tools=[{"function": {"parameters": {"properties": {
        "b": {"type": "integer"}, "a": {"type": "string"}}, "type": "object"}, "name": "f"},
        "type": "function"}])
    assert key(a) == key(b)


def test_array_order_matters() -> None:
    assert key(with_(stop=["a", "b"])) != key(with_(stop=["b", "a"]))


@pytest.mark.parametrize(
    ("label", "other"),
    [
        ("api", {"api": "responses"}),
        ("group", {"group": "gpt-4o-mini"}),
        ("namespace", {"namespace": "team:other"}),
        ("global namespace", {"namespace": "global"}),
    ],
)
def test_api_group_and_namespace_separate_entries(label: str, other: dict[str, str]) -> None:
    assert key(BASE, **other) != key(BASE), label


def test_the_key_is_the_sha256_of_the_documented_canonical_document() -> None:
    doc = canonical_request("chat", "gpt-4o", with_(temperature=1.0, stream=True, user="u"),
                            namespace="team:ml")
    assert orjson.loads(doc) == {
        "v": KEY_VERSION,
        "api": "chat",
        "group": "gpt-4o",
        "namespace": "team:ml",
        "request": {"messages": [{"role": "user", "content": "hi"}], "temperature": 1},
    }
    # Sorted keys, compact separators: the bytes themselves are canonical.
    assert doc == orjson.dumps(orjson.loads(doc), option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(doc).hexdigest()
    assert key(with_(temperature=1.0, stream=True, user="u")) == f"tg:{{cache:{digest}}}"


def test_the_key_has_one_hash_tag_naming_the_entry() -> None:
    k = key(BASE)
    assert re.fullmatch(r"tg:\{cache:[0-9a-f]{64}\}", k)
    with pytest.raises(ValueError, match="64-hex-digit"):
        entry_key("abc")


def test_normalise_body_does_not_touch_the_input() -> None:
    body = with_(temperature=1.0, stream=True)
    snapshot = orjson.dumps(body)
    normalise_body(body)
    assert orjson.dumps(body) == snapshot


def test_responses_and_messages_shapes_are_keyed_as_given() -> None:
    responses = {"model": "m", "input": "hi", "instructions": "x", "text": {"format": {
        "type": "text"}}}
    assert key(responses, api="responses") != key({**responses, "text": {"format": {
        "type": "json_object"}}}, api="responses")
    messages = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    assert key(messages, api="messages") != key({**messages, "system": "s"}, api="messages")
    assert key(messages, api="messages") != key({**messages, "stop_sequences": ["x"]},
                                                api="messages")
