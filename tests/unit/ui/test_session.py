"""Session cookies, CSRF tokens and who may sign in (a real SQLite store for keys)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import pytest

from triogate.config import parse_config
from triogate.store import open_store
from triogate.ui import session as sess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from triogate.store import Store

SECRET = b"s" * 32
NOW = 1_800_000_000.0


def test_a_session_round_trips_and_names_no_key() -> None:
    session, value = sess.new_session(SECRET, sess.MASTER, now_s=NOW)
    payload = sess.unsign(SECRET, value, now_s=NOW)
    assert payload is not None and set(payload) == {"sub", "nonce", "exp"}
    read = sess.read_session(SECRET, {sess.COOKIE: value}, now_s=NOW + 10)
    assert read == session
    assert read is not None and read.expires_s == NOW + sess.SESSION_TTL_S


def test_a_tampered_or_foreign_cookie_is_refused() -> None:
    _, value = sess.new_session(SECRET, sess.MASTER, now_s=NOW)
    body, _, mac = value.partition(".")
    forged = sess.sign(b"other secret", {"sub": "master", "nonce": "n", "exp": NOW + 99})
    for bad in (f"{body}x.{mac}", f"{body}.{mac[:-2]}AA", forged, "", "garbage", ".",
                f"{body}.", "e30.e30"):
        assert sess.read_session(SECRET, {sess.COOKIE: bad}, now_s=NOW) is None


def test_a_session_expires() -> None:
    _, value = sess.new_session(SECRET, sess.MASTER, now_s=NOW)
    assert sess.read_session(SECRET, {sess.COOKIE: value}, now_s=NOW + sess.SESSION_TTL_S
                             ) is None


def test_csrf_tokens_are_bound_to_the_session() -> None:
    a, _ = sess.new_session(SECRET, sess.MASTER, now_s=NOW)
    b, _ = sess.new_session(SECRET, sess.MASTER, now_s=NOW)
    assert sess.csrf_ok(SECRET, a.nonce, a.csrf(SECRET))
    assert not sess.csrf_ok(SECRET, a.nonce, b.csrf(SECRET))
    assert not sess.csrf_ok(SECRET, a.nonce, None)
    assert not sess.csrf_ok(SECRET, a.nonce, "")
    assert not sess.csrf_ok(b"other", a.nonce, a.csrf(SECRET))


def test_the_sign_in_form_has_its_own_token() -> None:
    value, token = sess.new_pre_session(SECRET, now_s=NOW)
    nonce = sess.read_pre_session(SECRET, {sess.PRE_COOKIE: value}, now_s=NOW)
    assert nonce is not None and sess.csrf_ok(SECRET, nonce, token)
    assert sess.read_pre_session(SECRET, {sess.PRE_COOKIE: value},
                                 now_s=NOW + sess.PRE_TTL_S) is None
    # A session cookie is not a pre-session cookie, and the other way round.
    _, session_value = sess.new_session(SECRET, sess.MASTER, now_s=NOW)
    assert sess.read_pre_session(SECRET, {sess.PRE_COOKIE: session_value}, now_s=NOW) is None
    assert sess.read_session(SECRET, {sess.COOKIE: value}, now_s=NOW) is None


def test_cookie_attributes() -> None:
    plain = sess.cookie("c", "v", max_age_s=60, secure=False)
    assert plain == "c=v; Path=/ui; Max-Age=60; HttpOnly; SameSite=Strict"
    assert sess.cookie("c", "v", max_age_s=60, secure=True).endswith("; Secure")


def test_cookie_header_parsing_keeps_the_first_of_a_name() -> None:
    assert sess.parse_cookies("a=1; b=2=3; a=9; junk; =x") == {"a": "1", "b": "2=3"}


@pytest.mark.parametrize(("headers", "ok"), [
    ({"host": "gw:4000", "origin": "http://gw:4000"}, True),
    ({"host": "gw:4000", "referer": "https://gw:4000/ui/keys"}, True),
    ({"host": "gw:4000", "origin": "http://evil.example"}, False),
    ({"host": "gw:4000", "origin": "http://gw:4000.evil.example"}, False),
    ({"host": "gw:4000", "origin": "null"}, False),
    ({"host": "gw:4000"}, True),  # no browser: the CSRF token still decides
])
def test_same_origin(headers: dict[str, str], ok: bool) -> None:
    assert sess.same_origin(headers) is ok


def test_roles_decide_what_a_principal_may_do() -> None:
    assert sess.MASTER.can("read") and sess.MASTER.can("write")
    viewer = sess.UiPrincipal(subject="x", role="proxy_admin_viewer", label="v")
    assert viewer.can("read") and not viewer.can("write")
    own = sess.UiPrincipal(subject="x", role="key", label="k", key_hash="x")
    assert own.can("self") and not own.can("read") and not own.can("write")
    assert not sess.UiPrincipal(subject="x", role="nobody", label="?").can("self")


@attrs.frozen
class _Services:
    """The fields ``ui_principal`` reads (a unit test of its logic, with a real store)."""

    config: Any
    store: Store | None
    now_ms: int = 1_800_000_000_000

    def clock_ms(self) -> int:
        return self.now_ms


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(None, state_dir=tmp_path) as s:
        yield s


def _config(tmp_path: Path) -> Any:
    return parse_config({
        "model_list": [{"model_name": "m", "litellm_params": {"model": "mock/m"}}],
        "general_settings": {"master_key": "sk-master-123"},
        "triogate": {"state_dir": str(tmp_path)}})


async def test_who_may_sign_in(tmp_path: Path, store: Store) -> None:
    services: Any = _Services(config=_config(tmp_path), store=store)
    assert await sess.ui_principal(services, "sk-master-123") == sess.MASTER
    assert await sess.ui_principal(services, " sk-master-123 ") == sess.MASTER
    assert await sess.ui_principal(services, "sk-master-1234") is None
    assert await sess.ui_principal(services, "") is None
    raw, row = await store.create_key(key_alias="mine")
    me = await sess.ui_principal(services, raw)
    assert me is not None and me.role == "key" and me.key_hash == row.token_hash
    assert me.subject == row.token_hash and raw not in repr(me)
    await store.update_key(row.token_hash, blocked=True)
    assert await sess.ui_principal(services, raw) is None
    assert await sess.principal_of(services, row.token_hash) is None  # its session ends
    raw2, _ = await store.create_key(expires_at_ms=services.now_ms - 1)
    assert await sess.ui_principal(services, raw2) is None


@pytest.mark.parametrize(("user_role", "read", "write"), [
    ("proxy_admin", True, True), ("proxy_admin_viewer", True, False),
    ("internal_user", False, False), ("internal_user_viewer", False, False),
    (None, False, False)])
async def test_a_key_signs_in_with_its_users_role(
        tmp_path: Path, store: Store, user_role: str | None, read: bool, write: bool) -> None:
    services: Any = _Services(config=_config(tmp_path), store=store)
    await store.create_user(user_id="u1", user_role=user_role)
    raw, row = await store.create_key(user_id="u1", key_alias="ops")
    who = await sess.ui_principal(services, raw)
    assert who is not None and who.role == (user_role or "internal_user")
    assert (who.can("read"), who.can("write"), who.can("self")) == (read, write, True)
    assert who.subject == row.token_hash and who.key_hash == row.token_hash
    await store.update_user("u1", blocked=True)  # a blocked user's keys sign in to nothing
    assert await sess.principal_of(services, row.token_hash) is None


def test_the_secret_follows_the_master_key(tmp_path: Path) -> None:
    one: Any = _Services(config=_config(tmp_path), store=None)
    other_config = attrs.evolve(_config(tmp_path), master_key="sk-rotated")
    two: Any = _Services(config=other_config, store=None)
    assert sess.secret_of(one) == sess.secret_of(one)
    assert sess.secret_of(one) != sess.secret_of(two)
    assert b"sk-master-123" not in sess.secret_of(one)


async def test_a_team_admin_signs_in_to_its_teams(tmp_path: Path, store: Store) -> None:
    services: Any = _Services(config=_config(tmp_path), store=store)
    await store.create_user(user_id="tina")
    for team in ("pay", "ops"):
        await store.create_team(team_id=team)
    await store.change_team_members("pay", add=[("tina", "admin", None)])
    await store.change_team_members("ops", add=[("tina", "user", None)])
    raw, row = await store.create_key(user_id="tina")
    who = await sess.ui_principal(services, raw)
    assert who is not None and who.role == "team_admin"
    assert who.can("team") and who.can("self") and not who.can("read")
    assert who.caller.role == "internal_user" and who.caller.key_hash == row.token_hash
    assert who.caller.admin_of == {"pay"} and who.caller.member_of == {"pay", "ops"}
    # An admin user stays an admin, whatever teams it also administers.
    await store.update_user("tina", user_role="proxy_admin")
    boss = await sess.ui_principal(services, raw)
    assert boss is not None and boss.role == "proxy_admin" and boss.can("write")
    assert sess.MASTER.caller.role == "proxy_admin"
