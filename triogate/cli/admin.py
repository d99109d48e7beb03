"""``triogate keys|teams|users|tags ...``: the admin API from a shell.

Thin: each command is one HTTP call to a *running* gateway's admin API (httpx, sync),
printed as a table (or ``--json``, the API's body unchanged). The master key comes from
``--master-key`` or ``TRIOGATE_MASTER_KEY``; the environment is passed in by the entry
point (``triogate.cli``), never read here. An error prints the API's own message and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

import httpx

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    Render = Callable[[Any], str]
    Action = Callable[[httpx.Client, argparse.Namespace], tuple[Any, Render]]

#: Top-level commands this module adds (``triogate.cli`` dispatches them to :func:`run`).
COMMANDS = ("keys", "teams", "users", "tags")
DEFAULT_URL = "http://127.0.0.1:4000"


class AdminCallFailed(Exception):
    """Raised by :func:`_call` when the gateway answers with an error status."""


# --------------------------------------------------------------------------- output


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":")) if value else "-"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns (a header line, then one line per row)."""
    cells = [list(columns)] + [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    return "\n".join(lines)


def fields(columns: Sequence[str]) -> Render:
    """One object as ``name: value`` lines (only ``columns`` present in it)."""

    def render(obj: Any) -> str:
        width = max(len(c) for c in columns)
        return "\n".join(f"{c.ljust(width)}  {_cell(obj.get(c))}" for c in columns if c in obj)

    return render


def rows_of(columns: Sequence[str], key: str | None = None) -> Render:
    """A list (or ``obj[key]``) as a table, with a count line."""

    def render(obj: Any) -> str:
        items = obj[key] if key is not None else obj
        out = table(items, columns) if items else "(none)"
        if isinstance(obj, dict) and "total_count" in obj:
            out += (f"\n{len(items)} of {obj['total_count']} (page {obj['current_page']} "
                    f"of {obj['total_pages']})")
        return out

    return render


# --------------------------------------------------------------------------- HTTP


def _call(client: httpx.Client, method: str, path: str, *, json_body: Any = None,
          params: Mapping[str, Any] | None = None) -> Any:
    response = client.request(method, path, json=json_body, params=params)
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text.strip() or response.reason_phrase
        raise AdminCallFailed(f"{response.status_code}: {message}")
    return response.json()


def _limits_body(args: argparse.Namespace) -> dict[str, Any]:
    """The shared limit options, only those given."""
    body: dict[str, Any] = {}
    for option, name in (("max_budget", "max_budget"), ("budget_duration", "budget_duration"),
                         ("rpm_limit", "rpm_limit"), ("tpm_limit", "tpm_limit"),
                         ("max_parallel_requests", "max_parallel_requests")):
        value = getattr(args, option, None)
        if value is not None:
            body[name] = value
    models = getattr(args, "models", None)
    if models:
        body["models"] = [m for item in models for m in item.split(",") if m]
    metadata = getattr(args, "metadata", None)
    if metadata is not None:
        body["metadata"] = metadata
    return body


_KEY_COLUMNS = ("token", "key_name", "key_alias", "team_id", "user_id", "models",
                "max_budget", "budget_duration", "rpm_limit", "tpm_limit", "blocked",
                "expires")
_TEAM_COLUMNS = ("team_id", "team_alias", "models", "max_budget", "budget_duration",
                 "rpm_limit", "tpm_limit", "blocked")
_TAG_COLUMNS = ("name", "description", "max_budget", "budget_duration", "rpm_limit",
                "tpm_limit")


def _keys_create(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    body = _limits_body(args)
    for option in ("key_alias", "team_id", "user_id", "duration"):
        if getattr(args, option) is not None:
            body[option] = getattr(args, option)
    if args.tags:
        body["tags"] = [t for item in args.tags for t in item.split(",") if t]
    reply = _call(client, "POST", "/key/generate", json_body=body)
    render = fields(("key", *_KEY_COLUMNS))
    return reply, lambda obj: render(obj) + "\n(the key is shown once: store it now)"


def _keys_list(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    params = {"return_full_object": "true", "page": args.page, "size": args.size}
    for option in ("team_id", "user_id"):
        if getattr(args, option):
            params[option] = getattr(args, option)
    return _call(client, "GET", "/key/list", params=params), rows_of(_KEY_COLUMNS, "keys")


def _keys_delete(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    reply = _call(client, "POST", "/key/delete", json_body={"keys": args.keys})
    return reply, lambda obj: "\n".join(f"deleted {h}" for h in obj["deleted_keys"])


def _keys_info(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    reply = _call(client, "GET", "/key/info", params={"key": args.key})
    render = fields((*_KEY_COLUMNS, "spend", "budget_reset_at"))
    return reply, lambda obj: render(obj["info"])


def _keys_block(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    path = "/key/unblock" if args.action == "unblock" else "/key/block"
    return _call(client, "POST", path, json_body={"key": args.key}), fields(_KEY_COLUMNS)


def _teams_create(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    body = _limits_body(args)
    if args.team_id is not None:
        body["team_id"] = args.team_id
    if args.team_alias is not None:
        body["team_alias"] = args.team_alias
    return _call(client, "POST", "/team/new", json_body=body), fields(_TEAM_COLUMNS)


def _teams_list(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    return _call(client, "GET", "/team/list"), rows_of(_TEAM_COLUMNS)


def _teams_delete(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    reply = _call(client, "POST", "/team/delete", json_body={"team_ids": args.team_ids})
    return reply, lambda obj: "\n".join(f"deleted team {t}" for t in obj["deleted"])


def _users_create(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    body = _limits_body(args)
    for option in ("user_id", "user_email", "user_alias"):
        if getattr(args, option) is not None:
            body[option] = getattr(args, option)
    body["auto_create_key"] = not args.no_key
    render = fields(("user_id", "user_email", "user_alias", "models", "max_budget",
                     "budget_duration", "key", "token", "key_name"))
    return _call(client, "POST", "/user/new", json_body=body), render


def _tags_create(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    body = _limits_body(args)
    body["name"] = args.name
    if args.description is not None:
        body["description"] = args.description
    return _call(client, "POST", "/tag/new", json_body=body), fields(_TAG_COLUMNS)


def _tags_list(client: httpx.Client, args: argparse.Namespace) -> tuple[Any, Render]:
    return _call(client, "GET", "/tag/list"), rows_of(_TAG_COLUMNS)


# --------------------------------------------------------------------------- parsers


def _common() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--url", default=DEFAULT_URL,
                        help=f"the gateway's base URL (default {DEFAULT_URL})")
    parent.add_argument("--master-key", help="default: $TRIOGATE_MASTER_KEY")
    parent.add_argument("--json", action="store_true", help="print the API's JSON reply")
    parent.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    return parent


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _limit_options(parser: argparse.ArgumentParser, *, models: bool = True,
                   parallel: bool = True) -> None:
    parser.add_argument("--max-budget", help="USD per budget period (e.g. 10 or 0.5)")
    parser.add_argument("--budget-duration", help="period: 30s, 1h, 1d, 30d, 1mo ...")
    parser.add_argument("--rpm-limit", type=int, help="requests per minute")
    parser.add_argument("--tpm-limit", type=int, help="tokens per minute")
    if parallel:
        parser.add_argument("--max-parallel-requests", type=int)
        parser.add_argument("--metadata", type=_json_object, help="a JSON object")
    if models:
        parser.add_argument("--models", action="append",
                            help="allowed model groups (comma-separated, repeatable)")


def add_parsers(subparsers: Any) -> None:
    """Add ``keys``, ``teams``, ``users`` and ``tags`` to ``subparsers`` (argparse's)."""
    common = _common()

    def leaf(group: Any, name: str, action: Action, help_: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = group.add_parser(name, parents=[common], help=help_)
        parser.set_defaults(admin_action=action)
        return parser

    keys = subparsers.add_parser("keys", help="virtual keys (through a running gateway)")
    sub = keys.add_subparsers(dest="action", required=True)
    create = leaf(sub, "create", _keys_create, "generate a key (shown once)")
    create.add_argument("--alias", dest="key_alias")
    create.add_argument("--team-id")
    create.add_argument("--user-id")
    create.add_argument("--duration", help="lifetime, e.g. 30d (default: never expires)")
    create.add_argument("--tags", action="append", help="comma-separated, repeatable")
    _limit_options(create)
    listing = leaf(sub, "list", _keys_list, "list keys")
    listing.add_argument("--team-id")
    listing.add_argument("--user-id")
    listing.add_argument("--page", type=int, default=1, help="page number (default 1)")
    listing.add_argument("--size", type=int, default=100, help="keys per page (default 100)")
    leaf(sub, "delete", _keys_delete, "delete keys").add_argument(
        "keys", nargs="+", help="keys or their hashes (token)")
    leaf(sub, "info", _keys_info, "a key's limits and spend").add_argument("key")
    leaf(sub, "block", _keys_block, "block a key").add_argument("key")
    leaf(sub, "unblock", _keys_block, "unblock a key").add_argument("key")

    teams = subparsers.add_parser("teams", help="teams (through a running gateway)")
    sub = teams.add_subparsers(dest="action", required=True)
    create = leaf(sub, "create", _teams_create, "create a team")
    create.add_argument("--team-id", help="default: a new UUID")
    create.add_argument("--alias", dest="team_alias")
    _limit_options(create)
    leaf(sub, "list", _teams_list, "list teams")
    leaf(sub, "delete", _teams_delete, "delete teams").add_argument("team_ids", nargs="+")

    users = subparsers.add_parser("users", help="internal users (through a running gateway)")
    sub = users.add_subparsers(dest="action", required=True)
    create = leaf(sub, "create", _users_create, "create a user (and a key for it)")
    create.add_argument("--user-id", help="default: a new UUID")
    create.add_argument("--email", dest="user_email")
    create.add_argument("--alias", dest="user_alias")
    create.add_argument("--no-key", action="store_true", help="do not create a key")
    _limit_options(create)

    tags = subparsers.add_parser("tags", help="tags with budgets (through a running gateway)")
    sub = tags.add_subparsers(dest="action", required=True)
    create = leaf(sub, "create", _tags_create, "create a tag")
    create.add_argument("name")
    create.add_argument("--description")
    _limit_options(create, models=False, parallel=False)
    leaf(sub, "list", _tags_list, "list tags")


def run(args: argparse.Namespace, environ: Mapping[str, str], *,
        stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the admin command in ``args``; return the exit status (0, or 1 on error).

    Args:
        args: parsed by a parser :func:`add_parsers` extended.
        environ: the environment (``TRIOGATE_MASTER_KEY``), passed in by the entry point.
        stdout, stderr: where to print (default: the process's).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    master = args.master_key or environ.get("TRIOGATE_MASTER_KEY")
    headers = {"authorization": f"Bearer {master}"} if master else {}
    try:
        with httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout) as client:
            reply, render = args.admin_action(client, args)
    except AdminCallFailed as exc:
        print(f"triogate: {exc}", file=err)
        return 1
    except httpx.HTTPError as exc:
        print(f"triogate: cannot reach the gateway at {args.url}: {type(exc).__name__}: {exc}",
              file=err)
        return 1
    print(json.dumps(reply, indent=2) if args.json else render(reply), file=out)
    return 0
