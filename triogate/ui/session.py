"""Who is signed in to the dashboard: :func:`ui_principal`, signed session cookies, CSRF.

* :func:`ui_principal` is the one place that decides what a key may see and do, with the
  admin API's roles (``api/admin/roles.py``): the master key and a ``proxy_admin`` user's
  key see and change everything; a ``proxy_admin_viewer`` user's key reads every page and
  changes nothing; a team admin's key manages its teams' keys; any other key that is
  neither blocked nor expired (nor its user blocked) signs in read-only to its own key's
  page. Pages ask :meth:`UiPrincipal.can`; changes and reads of rows run as
  :attr:`UiPrincipal.caller`, so the admin API's ownership rules decide which rows.
* The session is a cookie the gateway signs (HMAC-SHA256 with a secret derived from the
  master key, so every process and worker accepts it, and changing the master key signs
  everyone out). It holds the principal's subject (``master`` or the key's hash, never the
  key), an expiry and a nonce; it is re-checked on every page (a blocked or deleted key's
  session stops at once). Signing out records the nonce in Redis until the session would
  have expired, so a copy of the cookie stops working too. ``HttpOnly; SameSite=Strict;
  Path=/ui``, and ``Secure`` when the request came over TLS.
* CSRF: every form carries ``HMAC(secret, "csrf:" + nonce)``; a POST without the right
  token, or from another origin, is refused. The sign-in form has a token too, bound to a
  short-lived pre-session cookie (no login CSRF).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING, Any, Literal, final

import attrs
import orjson

from triogate.api.admin import roles
from triogate.api.admin.roles import Caller
from triogate.api.auth import is_master
from triogate.batch import BackendUnavailable
from triogate.store import hash_key

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.services import Services

logger = logging.getLogger("triogate.ui")

COOKIE = "triogate_ui"
#: A signed-out session's nonce, until the session would have expired (every process sees it).
REVOKED_KEY = "tg:ui:revoked:{nonce}"
PRE_COOKIE = "triogate_ui_pre"
SESSION_TTL_S = 8 * 3600
PRE_TTL_S = 3600

Action = Literal["read", "write", "self", "team"]

#: What each role may do: ``read`` every page, ``write`` change things, ``self`` its own
#: key, ``team`` the teams it administers and their keys (the admin API decides which rows).
ROLE_ACTIONS: Mapping[str, frozenset[str]] = {
    "proxy_admin": frozenset({"read", "write", "self"}),
    "proxy_admin_viewer": frozenset({"read", "self"}),
    "internal_user": frozenset({"self"}),
    "internal_user_viewer": frozenset({"self"}),
    "team_admin": frozenset({"self", "team"}),
    "key": frozenset({"self"}),
}


@final
@attrs.frozen(kw_only=True)
class UiPrincipal:
    """A signed-in person, as far as the dashboard cares.

    Attributes:
        subject: ``"master"`` or the key's SHA-256 (never the key itself).
        role: a LiteLLM role name (see :data:`ROLE_ACTIONS`).
        label: how the header names them.
        key_hash: the key whose own page ``self`` shows (None for the master key).
    """

    subject: str
    role: str
    label: str
    key_hash: str | None = None
    #: Who the admin API sees when this principal changes or reads something.
    caller: Caller = attrs.field(default=roles.MASTER, eq=False, repr=False)

    def can(self, action: Action) -> bool:
        return action in ROLE_ACTIONS.get(self.role, frozenset())

    def can_any(self, actions: tuple[Action, ...]) -> bool:
        return any(self.can(a) for a in actions)


MASTER = UiPrincipal(subject="master", role="proxy_admin", label="master key")


async def ui_principal(services: Services, key: str) -> UiPrincipal | None:
    """The principal ``key`` signs in as, or None (wrong, blocked or expired key).

    A checkpoint when it reads the store.
    """
    key = key.strip()
    if not key:
        return None
    if is_master(services, key):
        return MASTER
    if services.store is None:
        return None
    # A rotated key's secret is not its id: the session's subject is the id.
    found = (await services.store.keys_by_secret([hash_key(key)])).get(hash_key(key))
    if found is None or found[1] is not None:  # unknown, or a secret on its way out
        return None
    return await principal_of(services, found[0].token_hash)


async def principal_of(services: Services, subject: str) -> UiPrincipal | None:
    """The principal a session's subject still is (re-checked on every page)."""
    if subject == "master":
        return MASTER if services.config.master_key is not None else None
    if services.store is None:
        return None
    row = (await services.store.get_keys([subject])).get(subject)
    if row is None or row.blocked:
        return None
    expires = row.expires_at_ms
    if expires is not None and expires <= services.clock_ms():
        return None
    # The admin API's rule (roles.resolve_caller): a key acts with its user's role, an
    # internal user when the user has none; a blocked user's keys sign in to nothing. A
    # user who is an admin of teams manages those teams' keys here.
    api_role, user, admin_of, member_of = roles.KEY, None, set(), set()
    if row.user_id is not None:
        user = (await services.store.get_users([row.user_id])).get(row.user_id)
        if user is not None:
            if user.blocked:
                return None
            api_role = user.user_role or roles.INTERNAL
            for m in await services.store.memberships(row.user_id):
                member_of.add(m.team_id)
                if m.role == "admin":
                    admin_of.add(m.team_id)
    caller = Caller(role=api_role, key_hash=subject, user_id=row.user_id, team_id=row.team_id,
                    user=user, admin_of=frozenset(admin_of), member_of=frozenset(member_of))
    role = api_role
    if role not in (roles.ADMIN, roles.VIEWER) and admin_of:
        role = "team_admin"
    label = row.key_alias or row.key_hint or "virtual key"
    if role != "key":
        label = f"{label} ({role.replace('_', ' ')})"
    return UiPrincipal(subject=subject, role=role, label=label, key_hash=subject,
                       caller=caller)


def secret_of(services: Services) -> bytes:
    """The signing secret: derived from the master key (shared by every process).

    An open gateway (no master key) has no secret to share; its dashboard is as open as
    its admin API, and the secret only binds forms to its own pages.
    """
    master = services.config.master_key
    seed = master.encode() if master else str(services.config.state_dir).encode()
    return hashlib.sha256(b"triogate-ui-session\0" + seed).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(secret: bytes, payload: Mapping[str, Any]) -> str:
    body = _b64(orjson.dumps(dict(payload)))
    mac = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unsign(secret: bytes, value: str, *, now_s: float) -> dict[str, Any] | None:
    """The payload of a signed value that is intact and not expired, else None."""
    body, _, mac = value.partition(".")
    if not body or not mac:
        return None
    good = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(good, _unb64(mac)):
            return None
        payload = orjson.loads(_unb64(body))
    except (ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("exp"), int | float):
        return None
    return payload if payload["exp"] > now_s else None


@final
@attrs.frozen(kw_only=True)
class Session:
    """A verified session cookie."""

    subject: str
    nonce: str
    expires_s: float

    def csrf(self, secret: bytes) -> str:
        return csrf_token(secret, self.nonce)


def csrf_token(secret: bytes, nonce: str) -> str:
    return _b64(hmac.new(secret, f"csrf:{nonce}".encode(), hashlib.sha256).digest())


def csrf_ok(secret: bytes, nonce: str, token: str | None) -> bool:
    """Whether ``token`` is the CSRF token of the session (or pre-session) ``nonce``."""
    return bool(token) and hmac.compare_digest(csrf_token(secret, nonce), token or "")


def new_session(secret: bytes, principal: UiPrincipal, *, now_s: float) -> tuple[Session, str]:
    """A session for ``principal`` and its cookie value."""
    nonce = secrets.token_urlsafe(18)
    exp = now_s + SESSION_TTL_S
    value = sign(secret, {"sub": principal.subject, "nonce": nonce, "exp": exp})
    return Session(subject=principal.subject, nonce=nonce, expires_s=exp), value


def read_session(secret: bytes, cookies: Mapping[str, str], *, now_s: float) -> Session | None:
    payload = unsign(secret, cookies.get(COOKIE, ""), now_s=now_s)
    if payload is None or not isinstance(payload.get("sub"), str):
        return None
    return Session(subject=payload["sub"], nonce=str(payload.get("nonce", "")),
                   expires_s=float(payload["exp"]))


def new_pre_session(secret: bytes, *, now_s: float) -> tuple[str, str]:
    """For the sign-in form: (cookie value, CSRF token)."""
    nonce = secrets.token_urlsafe(18)
    return sign(secret, {"pre": nonce, "exp": now_s + PRE_TTL_S}), csrf_token(secret, nonce)


def read_pre_session(secret: bytes, cookies: Mapping[str, str], *, now_s: float) -> str | None:
    """The pre-session nonce, if its cookie is intact."""
    payload = unsign(secret, cookies.get(PRE_COOKIE, ""), now_s=now_s)
    return str(payload["pre"]) if payload and isinstance(payload.get("pre"), str) else None


def cookie(name: str, value: str, *, max_age_s: int, secure: bool) -> str:
    """A ``Set-Cookie`` value: HttpOnly, SameSite=Strict, Path=/ui, Secure over TLS."""
    parts = [f"{name}={value}", "Path=/ui", f"Max-Age={max_age_s}", "HttpOnly",
             "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def parse_cookies(header: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in out:
            out[name] = value
    return out


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a POST came from this site (``Origin``, else ``Referer``, names our host).

    Browsers send ``Origin`` on every POST; a request with neither header (a script, not a
    browser) is let through to the CSRF token check, which it cannot pass without a page.
    """
    host = headers.get("host", "")
    origin = headers.get("origin") or headers.get("referer")
    if not origin:
        return True
    if origin == "null":
        return False
    rest = origin.split("://", 1)[-1]
    return rest.split("/", 1)[0] == host


async def revoke(services: Services, session: Session, *, now_s: float) -> bool:
    """Record that ``session`` signed out (until it would have expired). A checkpoint.

    Returns False when Redis did not answer (the cookie is still cleared in the browser).
    """
    ttl_ms = max(1, int((session.expires_s - now_s) * 1000))
    key = REVOKED_KEY.format(nonce=session.nonce)
    try:
        replies = await services.backends["counters"].execute([("SET", key, "1", "PX", ttl_ms)])
    except BackendUnavailable as exc:
        logger.warning("dashboard: sign-out not recorded (Redis unavailable: %s)", exc.reason)
        return False
    return not isinstance(replies[0], Exception)


async def is_revoked(services: Services, session: Session) -> bool:
    """Whether ``session`` signed out. Redis unreachable: not revoked (the signature and
    expiry still hold; the dashboard stays usable to watch an incident). A checkpoint."""
    key = REVOKED_KEY.format(nonce=session.nonce)
    try:
        replies = await services.backends["counters"].execute([("EXISTS", key)])
    except BackendUnavailable:
        return False
    return replies[0] == 1


#: Failed sign-ins per client address and minute before the form refuses to try more.
SIGN_IN_FAILURES_PER_MIN = 10
FAILURES_KEY = "tg:ui:signin-failures:{client}"


async def sign_in_blocked(services: Services, client: str) -> bool:
    """Whether ``client`` failed to sign in too often this minute (Redis down: no).
    A checkpoint."""
    try:
        [count] = await services.backends["counters"].execute(
            [("GET", FAILURES_KEY.format(client=client))])
    except BackendUnavailable:
        return False
    if not isinstance(count, bytes | str | int):
        return False  # None: no failure this minute
    try:
        return int(count) >= SIGN_IN_FAILURES_PER_MIN
    except ValueError:
        return False


async def note_failed_sign_in(services: Services, client: str) -> None:
    """Count a failed sign-in of ``client`` (a fixed window of one minute). A checkpoint."""
    key = FAILURES_KEY.format(client=client)
    with contextlib.suppress(BackendUnavailable):
        # SET NX starts the minute (any Redis version); INCR keeps the expiry.
        await services.backends["counters"].execute(
            [("SET", key, "0", "PX", 60_000, "NX"), ("INCR", key)])


#: A create form's one-time token, once used (a reload of the page that showed a new key
#: would post the form again and create a second one).
ONCE_KEY = "tg:ui:once:{token}"
ONCE_TTL_MS = PRE_TTL_S * 1000 * 8


def once_token() -> str:
    return secrets.token_urlsafe(12)


async def use_once(services: Services, token: str) -> bool:
    """Mark ``token`` used; False if it was used before. Redis unreachable, or no token
    (a script, not the form): True, the admin API's own checks still apply. A checkpoint."""
    if not token:
        return True
    try:
        [reply] = await services.backends["counters"].execute(
            [("SET", ONCE_KEY.format(token=token[:64]), "1", "PX", ONCE_TTL_MS, "NX")])
    except BackendUnavailable:
        return True
    return reply is not None and not isinstance(reply, Exception)
