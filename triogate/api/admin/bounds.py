"""Bounds on every admin input: what the store, the clock and the renderer can hold.

An admin body is checked whole before anything is written (the handlers parse every
field first), and each bound here turns a value that used to fail deep inside SQL,
``datetime`` or ``orjson`` (a 500, sometimes after the row was stored) into a 400 that
names the field. Pure and synchronous.

* **Text** (ids, aliases, emails, tags, model names): at most :data:`MAX_TEXT` characters,
  no control characters (NUL is refused by PostgreSQL's TEXT, others by log readers).
* **Times**: epoch milliseconds in ``[0, MAX_TIME_MS]`` (year 9999, the last moment
  ``datetime`` renders).
* **Durations**: at most :data:`MAX_DURATION_S` (100 years).
* **JSON objects** (``metadata``, per-model limits): nested at most :data:`MAX_DEPTH`
  levels, at most :data:`MAX_ITEMS` entries per list or object.
* **Custom keys**: ``sk-`` then at least :data:`MIN_CUSTOM_KEY_CHARS` characters from a
  URL-safe alphabet; never the master key.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

from triogate.api.errors import ApiError

MAX_TEXT = 1024
MAX_ITEMS = 1000
MAX_DEPTH = 32
#: 9999-12-31T23:59:59.999Z, the last instant ``datetime`` can render.
MAX_TIME_MS = 253_402_300_799_999
MAX_DURATION_S = 100 * 365 * 86_400
#: Characters after ``sk-`` in a key chosen by the admin.
MIN_CUSTOM_KEY_CHARS = 20
MAX_CUSTOM_KEY_CHARS = 256
_CUSTOM_KEY = re.compile(r"^sk-[A-Za-z0-9_\-.]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Largest page number accepted: far beyond any real listing, far below OFFSET overflow.
MAX_PAGE = 1_000_000


def bad(name: str, message: str) -> ApiError:
    """A 400 about field ``name``."""
    return ApiError(400, f"field '{name}' {message}", "invalid_request_error", param=name)


def check_text(name: str, value: str, *, max_chars: int = MAX_TEXT) -> str:
    """``value`` if it is short enough and free of control characters."""
    if len(value) > max_chars:
        raise bad(name, f"must be at most {max_chars} characters")
    if _CONTROL.search(value):
        raise bad(name, "must not contain control characters (NUL, newline, ...)")
    return value


def check_time_ms(name: str, value: int) -> int:
    """``value`` if it is an epoch-ms time between 1970 and the year 9999."""
    if not 0 <= value <= MAX_TIME_MS:
        raise bad(name, "must be a time between 1970-01-01 and 9999-12-31")
    return value


def check_duration_s(name: str, seconds: int) -> int:
    """``seconds`` if it is at most 100 years."""
    if seconds > MAX_DURATION_S:
        raise bad(name, f"must be at most {MAX_DURATION_S // 86_400}d (100 years)")
    return seconds


def check_json(name: str, value: Any) -> None:
    """Nesting and size bounds on a JSON value (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[Any] = list(item.values())
            for k in item:
                check_text(name, k)
        elif isinstance(item, list):
            children = item
        else:
            if isinstance(item, str):
                check_text(name, item, max_chars=65_536)
            continue
        if depth > MAX_DEPTH:
            raise bad(name, f"must not be nested more than {MAX_DEPTH} levels deep")
        if len(children) > MAX_ITEMS:
            raise bad(name, f"must not hold more than {MAX_ITEMS} entries per object or list")
        stack.extend((c, depth + 1) for c in children)


def json_depth_ok(value: Any) -> bool:
    """Whether ``value`` renders (rows written before the bounds existed may not)."""
    try:
        check_json("value", value)
    except ApiError:
        return False
    return True


def check_custom_key(raw: Any, master_key: str | None) -> str:
    """A key the admin chose: ``sk-`` + 20..256 URL-safe characters, not the master key."""
    rule = (f"must be a string 'sk-' followed by {MIN_CUSTOM_KEY_CHARS} to "
            f"{MAX_CUSTOM_KEY_CHARS} characters from A-Z a-z 0-9 _ - .")
    if not isinstance(raw, str) or not _CUSTOM_KEY.match(raw):
        raise bad("key", rule)
    if not MIN_CUSTOM_KEY_CHARS <= len(raw) - 3 <= MAX_CUSTOM_KEY_CHARS:
        raise bad("key", rule)
    if master_key is not None and hmac.compare_digest(raw.encode(), master_key.encode()):
        raise bad("key", "must not be the master key")
    return raw
