"""Admin field parsing and rendering: pure functions, no gateway."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from triogate.api.admin.converters import FieldContext
from triogate.api.admin.fields import (
    KEY_FIELDS,
    TAG_FIELDS,
    TEAM_FIELDS,
    iso,
    key_candidates,
    page_count,
    paging,
    parse_fields,
    parse_time_ms,
    render_budget,
    render_row,
    usd,
    usd_to_nanousd,
)
from triogate.api.admin.routes import routes
from triogate.api.errors import ApiError
from triogate.governance.budgets import BudgetState
from triogate.store import KeyRow, TagRow, hash_key

CTX = FieldContext(groups=frozenset({"gpt-test", "claude-test"}), now_ms=1_700_000_000_000)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def error_of(body: dict[str, Any], fields: Any = KEY_FIELDS) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_fields(body, fields, CTX)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(("value", "nanousd"), [
    (0, 0), (1, 1_000_000_000), (0.1, 100_000_000), ("0.1", 100_000_000),
    (" 2.5 ", 2_500_000_000), ("1e-9", 1), ("0.0000000015", 2), ("0.0000000014", 1),
    (1e-6, 1000), ("12345678.123456789", 12_345_678_123_456_789),
])
def test_usd_is_converted_exactly(value: Any, nanousd: int) -> None:
    assert usd_to_nanousd("max_budget", value) == nanousd


@given(st.decimals(min_value=0, max_value=10**9, places=9, allow_nan=False))
def test_any_nano_precise_amount_round_trips(amount: Decimal) -> None:
    nanousd = usd_to_nanousd("max_budget", str(amount))
    assert Decimal(nanousd) == amount * 10**9
    assert usd(nanousd) == float(amount)


@pytest.mark.parametrize("value", ["ten", "", True, None, [1], -0.5, "inf", "NaN", 1e20])
def test_bad_money_names_the_field(value: Any) -> None:
    with pytest.raises(ApiError) as caught:
        usd_to_nanousd("max_budget", value)
    assert caught.value.param == "max_budget" and "max_budget" in caught.value.message


def test_key_fields_map_to_store_fields() -> None:
    fields = parse_fields({
        "max_budget": "0.5", "budget_duration": "1mo", "models": ["gpt-test", "gpt-test"],
        "model_tpm_limit": {"claude-test": 10}, "tags": ["a", "b", "a"], "duration": "1h",
        "key_alias": "x", "blocked": False, "metadata": {"k": 1}, "rpm_limit": 0,
    }, KEY_FIELDS, CTX)
    assert fields == {
        "max_budget_nanousd": 500_000_000, "budget_duration": "1mo", "models": ("gpt-test",),
        "model_tpm_limit": {"claude-test": 10}, "tags": ("a", "b"),
        "expires_at_ms": CTX.now_ms + 3_600_000, "key_alias": "x", "blocked": False,
        "metadata": {"k": 1}, "rpm_limit": 0,
    }


def test_nulls_clear_or_reset() -> None:
    fields = parse_fields({"max_budget": None, "models": None, "metadata": None,
                           "duration": None, "budget_duration": None}, KEY_FIELDS, CTX)
    assert fields == {"max_budget_nanousd": None, "models": (), "metadata": {},
                      "expires_at_ms": None, "budget_duration": None}


def test_unknown_fields_fail_loudly_and_list_the_accepted_ones() -> None:
    error = error_of({"max_budgett": 1})
    assert error.param == "max_budgett"
    assert error.message.startswith("unknown field 'max_budgett'")
    assert "max_budget" in error.message
    assert error_of({"models": ["gpt-test"]}, TAG_FIELDS).param == "models"
    assert error_of({"key_alias": "x"}, TEAM_FIELDS).param == "key_alias"


@pytest.mark.parametrize(("body", "param"), [
    ({"models": [1]}, "models"),
    ({"models": [""]}, "models"),
    ({"models": ["x" * 300]}, "models"),
    ({"model_rpm_limit": {"gpt-test": -1}}, "model_rpm_limit"),
    ({"model_rpm_limit": {"gpt-test": True}}, "model_rpm_limit"),
    ({"budget_duration": "1 year"}, "budget_duration"),
    ({"duration": "-1d"}, "duration"),
    ({"tpm_limit": 1.5}, "tpm_limit"),
    ({"tpm_limit": 2**63}, "tpm_limit"),
    ({"max_parallel_requests": False}, "max_parallel_requests"),
    ({"tags": "a,b"}, "tags"),
    ({"tags": [""]}, "tags"),
    ({"key_alias": 3}, "key_alias"),
    ({"expires": "soon"}, "expires"),
    ({"expires": 1.5}, "expires"),
    ({"expires": "2030-01-01", "duration": "1d"}, "expires"),
    # Out of range: each used to fail deep in SQL, datetime or orjson (a 500).
    ({"duration": "9999999999d"}, "duration"),
    ({"budget_duration": "99999999999999999999999d"}, "budget_duration"),
    ({"expires": 10**20}, "expires"),
    ({"expires": -1}, "expires"),
    ({"expires": "99999-01-01"}, "expires"),
    ({"metadata": {"a": _nested(300)}}, "metadata"),
    ({"metadata": {"a": list(range(1001))}}, "metadata"),
    ({"metadata": {"bad\x00key": 1}}, "metadata"),
    ({"key_alias": "a\x00b"}, "key_alias"),
    ({"key_alias": "x" * 1025}, "key_alias"),
    ({"tags": ["t\n"]}, "tags"),
])
def test_wrong_values_name_the_field(body: dict[str, Any], param: str) -> None:
    assert error_of(body).param == param


def test_model_names_are_stored_as_given() -> None:
    """Wildcards, ``all-team-models`` and groups configured later are all stored."""
    names = ["*", "openai/*", "all-team-models", "gpt-9-later"]
    assert parse_fields({"models": names}, KEY_FIELDS, CTX) == {"models": tuple(names)}
    assert parse_fields({"model_rpm_limit": {"later": 1}}, KEY_FIELDS, CTX) == {
        "model_rpm_limit": {"later": 1}}


@pytest.mark.parametrize(("text", "epoch_ms"), [
    ("2025-01-01", 1_735_689_600_000),
    ("2025-01-01T00:00:01", 1_735_689_601_000),
    ("2025-01-01T00:00:00Z", 1_735_689_600_000),
    ("2025-01-01T02:00:00+02:00", 1_735_689_600_000),
    ("1735689600000", 1_735_689_600_000),
    (1_735_689_600_000, 1_735_689_600_000),
])
def test_times(text: Any, epoch_ms: int) -> None:
    assert parse_time_ms("expires", text) == epoch_ms


@pytest.mark.parametrize("text", ["\u00b2", "17356896\u0663"])
def test_non_ascii_digits_are_not_epoch_milliseconds(text: str) -> None:
    with pytest.raises(ApiError):  # str.isdigit() accepts them, int() may not: a 500 before
        parse_time_ms("expires", text)


def test_iso_round_trips_milliseconds() -> None:
    assert iso(1_735_689_600_123) == "2025-01-01T00:00:00.123Z"
    assert parse_time_ms("t", iso(1_735_689_600_123)) == 1_735_689_600_123
    assert iso(None) is None


def test_a_rendered_key_shows_the_hash_and_hint_only() -> None:
    raw = "sk-a-very-secret-value-1234"
    row = KeyRow(token_hash=hash_key(raw), key_hint="sk-...1234", models=("gpt-test",),
                 max_budget_nanousd=1_500_000_000, budget_duration="30d",
                 budget_duration_s=2_592_000, budget_anchor_s=5, expires_at_ms=None,
                 created_at_ms=1_735_689_600_000, model_rpm_limit={"gpt-test": 3})
    out = render_row(row)
    assert out["token"] == hash_key(raw) and "token_hash" not in out
    assert out["key_name"] == out["key_hint"] == "sk-...1234"
    assert out["max_budget"] == 1.5 and out["max_budget_nanousd"] == 1_500_000_000
    assert out["models"] == ["gpt-test"] and out["model_rpm_limit"] == {"gpt-test": 3}
    assert out["created_at"] == "2025-01-01T00:00:00.000Z" and out["expires"] is None
    assert "budget_anchor_s" not in out and "budget_duration_s" not in out
    assert raw not in str(out)


def test_a_rendered_tag_is_named_as_litellm_names_it() -> None:
    out = render_row(TagRow(tag="batch", max_budget_nanousd=None))
    assert out["name"] == "batch" and out["max_budget"] is None


def test_budget_rendering() -> None:
    state = BudgetState(period=3, period_end_ms=1_735_689_600_000, spend_nanousd=1_234,
                        reserved_nanousd=5, max_budget_nanousd=10_000)
    assert render_budget(state) == {"spend": 1.234e-06, "spend_nanousd": 1234,
                                    "reserved_nanousd": 5,
                                    "budget_reset_at": "2025-01-01T00:00:00.000Z"}
    assert render_budget(None)["spend_nanousd"] is None


def test_key_candidates() -> None:
    digest = hash_key("sk-x")
    assert key_candidates("sk-x") == [digest]
    assert key_candidates(digest) == [digest, hash_key(digest)]


@pytest.mark.parametrize(("query", "expected"), [
    ({}, (1, 100)), ({"page": "3", "size": "7"}, (3, 7)), ({"page_size": "9"}, (1, 9)),
    ({"size": ""}, (1, 100)),
])
def test_paging(query: dict[str, str], expected: tuple[int, int]) -> None:
    assert paging(query) == expected


@pytest.mark.parametrize("query", [{"page": "0"}, {"size": "1001"}, {"page": "x"},
                                   {"size": "-1"}, {"page": "\u00b2"}, {"size": "\u0663"}])
def test_bad_paging(query: dict[str, str]) -> None:
    with pytest.raises(ApiError):
        paging(query)


def test_page_count() -> None:
    assert [page_count(n, 10) for n in (0, 1, 10, 11)] == [1, 1, 1, 2]


def test_every_admin_route_is_litellm_shaped() -> None:
    table = routes()
    for path in ("/key/generate", "/key/update", "/key/delete", "/team/new", "/team/delete",
                 "/user/new", "/customer/new", "/tag/new", "/team/update"):
        assert ("POST", path) in table
    for path in ("/key/info", "/key/list", "/team/info", "/team/list", "/user/info",
                 "/customer/info", "/tag/info", "/tag/list", "/spend/logs", "/spend/daily"):
        assert ("GET", path) in table


def test_the_master_key_is_never_a_custom_key() -> None:
    from triogate.api.admin.bounds import check_custom_key

    master = "sk-" + "m" * 30
    with pytest.raises(ApiError, match="master key"):
        check_custom_key(master, master)
    assert check_custom_key("sk-" + "k" * 30, master) == "sk-" + "k" * 30
