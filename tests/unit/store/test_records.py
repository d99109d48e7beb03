"""Pure helpers of the store: durations, key hashing, key hints, principals."""

from __future__ import annotations

import re

import pytest

from triogate.governance.from_rows import key_principal, tag_principal
from triogate.store import KeyRow, TagRow, generate_key, hash_key, key_hint, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("1h", 3600),
        ("24h", 86_400),
        ("1d", 86_400),
        ("30d", 2_592_000),
        ("2w", 1_209_600),
        ("1mo", 2_592_000),
        ("3mo", 7_776_000),
        (" 7d ", 604_800),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "1.5h", "1y", "1 month", "1M", "1dd"])
def test_bad_durations_are_a_clear_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text)) + ".*e.g. '30s'"):
        parse_duration(text)


def test_hash_key_is_sha256_hex() -> None:
    # The published SHA-256 test vector for "abc".
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_generated_keys_are_distinct_and_url_safe() -> None:
    keys = {generate_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(re.fullmatch(r"sk-[A-Za-z0-9_-]{43}", k) for k in keys)


def test_key_hint_shows_the_last_four_characters_only() -> None:
    assert key_hint("sk-abcdefgh1234") == "sk-...1234"
    assert key_hint("plainsecretWXYZ") == "...WXYZ"


def test_principals_default_a_missing_anchor_to_zero() -> None:
    key = key_principal(KeyRow(token_hash="h", model_tpm_limit={"m": 3}))
    assert key.limits.budget_anchor_s == 0
    assert key.model_tpm == {"m": 3}
    assert key.allows_model("anything")
    tag = tag_principal(TagRow(tag="t", rpm_limit=3))
    assert tag.limits.rpm == 3 and tag.limits.max_parallel is None
