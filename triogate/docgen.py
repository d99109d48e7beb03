"""The documentation pages generated from the code: one command rewrites them all.

``python3 -m triogate.docgen`` (from the project's root) writes:

* ``docs/configuration-reference.md``: every key of the config file, from the attrs
  classes in :mod:`triogate.config` (its type, its default, and its meaning: the ``#:``
  comment above the field, else the class docstring's ````name``: ...`` paragraph, else
  :data:`MEANINGS`);
* the field and route tables in ``docs/migrating-from-litellm.md``, between their
  markers (:mod:`triogate.api.admin.docs`);
* ``docs/cli.md``: every command and option of ``triogate``, with its default.

``python3 -m triogate.docgen --check`` writes nothing and exits 1 when a page differs.
``tests/unit/test_docgen.py`` runs the same comparison.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import attrs

from triogate.api.admin import docs as admin_docs
from triogate.config_file import ConfigFile

#: Where the pages live, relative to the project's root.
CONFIG_PAGE = Path("docs/configuration-reference.md")
MIGRATION_PAGE = Path("docs/migrating-from-litellm.md")
CLI_PAGE = Path("docs/cli.md")

#: Meanings of the keys whose class says nothing of them, by key path (``[]`` marks a
#: list item). A ``#:`` comment above the field (``config_file.py``,
#: ``config_settings.py``) takes precedence.
MEANINGS: dict[str, str] = {
    "model_list[].model_name": "the model group clients ask for; deployments with the same "
                               "name share its traffic",
    "model_list[].model_info": "free-form details: `id` (the deployment's id), `mode` "
                               "(`embedding` for embedding models), `access_groups`, "
                               "`max_*_tokens` and `supports_*` for `/model_group/info`",
    "model_list[].litellm_params.model": "`provider/model`: `openai/…` (any OpenAI-compatible "
                                         "server), `anthropic/…`, `mock/…`; a bare name gets "
                                         "its provider inferred; `*` makes a wildcard",
    "model_list[].litellm_params.api_base": "the upstream's base URL (default: the "
                                            "provider's public API)",
    "model_list[].litellm_params.api_key": "the upstream's key; `os.environ/NAME` or "
                                           "`${NAME}` reads it from the environment",
    "model_list[].litellm_params.rpm": "this deployment's requests per minute, for routing",
    "model_list[].litellm_params.tpm": "this deployment's tokens per minute, for routing",
    "model_list[].litellm_params.timeout": "seconds for a whole call to this deployment",
    "model_list[].litellm_params.stream_timeout": "seconds for a streamed call "
                                                  "(default: `timeout`)",
    "model_list[].litellm_params.weight": "share of traffic under `simple-shuffle`",
    "model_list[].litellm_params.input_cost_per_token": "USD per prompt token (default: the "
                                                        "list price, if known)",
    "model_list[].litellm_params.output_cost_per_token": "USD per completion token "
                                                         "(default: the list price, if known)",
    "model_list[].litellm_params.mock_response": "`mock/` only: the answer's text (default: "
                                                 "`Mock reply from <model> to: <prompt>`)",
    "model_list[].litellm_params.mock_latency_ms": "`mock/` only: milliseconds before the "
                                                   "answer",
    "model_list[].litellm_params.mock_first_token_ms": "`mock/` only: milliseconds before a "
                                                       "stream's first event",
    "model_list[].litellm_params.mock_output_tokens": "`mock/` only: completion tokens to "
                                                      "report",
    "model_list[].litellm_params.mock_failure_rate": "`mock/` only: share of calls that fail "
                                                     "(0 to 1)",
    "model_list[].litellm_params.mock_failure_status": "`mock/` only: the failing calls' "
                                                       "HTTP status",
    "router_settings.routing_strategy": "`simple-shuffle`, `least-busy`, "
                                        "`usage-based-routing` (`-v2`), "
                                        "`latency-based-routing`",
    "router_settings.num_retries": "retries of a failed call, on other deployments first",
    "router_settings.timeout": "default seconds for a call (a deployment's own wins)",
    "router_settings.allowed_fails": "failures of a deployment within a minute before its "
                                     "cooldown",
    "router_settings.cooldown_time": "seconds a failing deployment is left out",
    "router_settings.retry_after": "seconds before the first retry within a group, doubled "
                                   "for each later one",
    "router_settings.fallbacks": "`[{group: [other groups]}]`: tried when a group fails",
    "router_settings.context_window_fallbacks": "groups tried when the upstream says the "
                                                "prompt is too long for its model",
    "router_settings.redis_host": "LiteLLM's Redis host; becomes the Redis URL",
    "router_settings.redis_port": "LiteLLM's Redis port",
    "router_settings.redis_password": "LiteLLM's Redis password",
    "router_settings.redis_url": "LiteLLM's Redis URL",
    "general_settings.master_key": "the admin key (`TRIOGATE_MASTER_KEY` overrides it)",
    "general_settings.database_url": "SQLAlchemy URL of the SQL store, `sqlite:///…` or "
                                     "`postgresql://…` (`TRIOGATE_DATABASE_URL` overrides "
                                     "it; default: SQLite in `state_dir`)",
    "general_settings.proxy_batch_write_at": "accepted, no effect (spend rows are written in "
                                             "batches as requests end)",
    "general_settings.proxy_budget_rescheduler_min_time": "accepted, no effect (budget "
                                                          "periods follow the clock)",
    "general_settings.proxy_budget_rescheduler_max_time": "accepted, no effect (budget "
                                                          "periods follow the clock)",
    "general_settings.store_model_in_db": "`false` only: `model_list` is the only source of "
                                          "models",
    "litellm_settings.cache": "the response cache (Redis) on or off",
    "litellm_settings.cache_params.type": "`redis`, the only cache",
    "litellm_settings.cache_params.ttl": "seconds a cached answer lives",
    "litellm_settings.cache_params.host": "LiteLLM's cache Redis host; becomes the Redis URL",
    "litellm_settings.cache_params.port": "LiteLLM's cache Redis port",
    "litellm_settings.cache_params.password": "LiteLLM's cache Redis password",
    "litellm_settings.cache_params.url": "LiteLLM's cache Redis URL",
    "litellm_settings.cache_params.redis_url": "LiteLLM's cache Redis URL",
    "litellm_settings.request_timeout": "the default deployment timeout, seconds",
    "litellm_settings.num_retries": "the router's default when `router_settings.num_retries` "
                                    "is not set",
    "litellm_settings.drop_params": "leave out what an upstream's API cannot express instead "
                                    "of answering 400",
    "litellm_settings.set_verbose": "debug logging for `triogate.*`",
    "litellm_settings.json_logs": "accepted: logs are JSON lines already",
    "litellm_settings.telemetry": "`false` only: triogate reports usage nowhere",
    "litellm_settings.success_callback": "as `callbacks`",
    "litellm_settings.failure_callback": "as `callbacks`",
    "litellm_settings.context_window_fallbacks": "as `router_settings.context_window_"
                                                 "fallbacks`",
    "triogate.state_dir": "folder of the embedded Redis, the SQLite file, the journal and "
                          "spill files",
    "triogate.redis.url": "`redis://`, `rediss://`, `unix://` or `redis+cluster://h1:p1,h2:p2`"
                          " (`TRIOGATE_REDIS_URL` overrides it; default: an embedded server "
                          "in `state_dir`)",
    "triogate.redis.timeout_s": "longest wait for one Redis round; then the check fails open "
                                "or closed as `policies` say",
    "triogate.redis.pool_size": "connections per worker to each Redis server",
    "triogate.policies.budgets": "what a budget check does when Redis does not answer: "
                                 "`fail-open` or `fail-closed` (503)",
    "triogate.policies.rate_limits": "the same for rate limits",
    "triogate.governance.identity_ttl_s": "seconds a key's identity is kept in memory",
    "triogate.governance.end_user_header": "the header naming the end user (besides the "
                                           "body's `user`)",
    "triogate.cache.scope": "who shares cached answers: `team`, `key` or `global` "
                            "(LiteLLM's behaviour)",
    "triogate.cache.max_entry_bytes": "answers larger than this are not cached",
    "triogate.http.cors_max_age_s": "seconds browsers may keep a preflight's answer",
    "triogate.tracing": "count Redis waits per request and add `x-triogate-trace-id` and "
                        "`x-triogate-redis-waits-before` to responses",
    "triogate.log_prompts": "each request's log line carries its body and answer "
                            "(streams too)",
    "triogate.max_body_bytes": "largest request body; larger is 413",
    "triogate.shutdown_grace_s": "seconds in-flight requests may finish after a stop signal",
    "triogate.post_call_deadline_s": "accepted; has no effect at present",
    "triogate.spend_log_interval_s": "seconds between spend-log writes",
    "triogate.spend_log_batch_rows": "most spend-log rows in one write",
    "triogate.upstream_max_connections": "connections per worker to each upstream origin",
    "triogate.max_admission_wait_s": "longest a request waits for its turn at the pre-call "
                                     "checks before a 503",
}


def _type(annotation: Any) -> str:
    """``annotation`` as the page shows it: ``or`` between choices, literals quoted."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " or ".join(f'"{value}"' for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return str(getattr(annotation, "__name__", annotation))


def _default(field: attrs.Attribute[Any]) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    factory = getattr(default, "factory", None)
    if isinstance(default, attrs.Factory) and factory is not None:  # type: ignore[arg-type]
        default = factory()
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, (list, dict)):
        return f"`{default!r}`"
    return f"`{default}`"


def _comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment above each field of ``cls``, and ````name``: ...`` paragraphs of
    its docstring, by field name."""
    found: dict[str, str] = {}
    doc = inspect.getdoc(cls) or ""
    for match in re.finditer(r"^``(\w+)``: (.*?)(?=^``\w+``: |\Z)", doc, re.S | re.M):
        found[match[1]] = " ".join(match[2].split())
    source = inspect.getsource(cls)
    lines = source.splitlines()
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                above.insert(0, lines[row].strip().removeprefix("#:").strip())
                row -= 1
            if above:
                found[node.target.id] = " ".join(above)
    return found


def config_rows(cls: type = ConfigFile, prefix: str = "") -> list[tuple[str, ...]]:
    """One row per key under ``cls``: (section, key, type, default, meaning); a nested
    attrs class is a section of its own, not a row."""
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    comments = _comments(cls)
    rows: list[tuple[str, ...]] = []
    nested: list[tuple[type, str]] = []
    for field in attrs.fields(cls):
        path = f"{prefix}{field.name}"
        hint = hints[field.name]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if attrs.has(hint):
            nested.append((hint, f"{path}."))
            continue
        if item is not None and attrs.has(item):
            nested.append((item, f"{path}[]."))
            continue
        meaning = comments.get(field.name) or MEANINGS.get(path, "")
        section = prefix.rstrip(".") or "(top level)"
        rows.append((section, path, _type(hint), _default(field), meaning))
    for inner, inner_prefix in nested:
        rows += config_rows(inner, inner_prefix)
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    """The whole configuration reference page."""
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `python3 -m triogate.docgen` from triogate/config*.py: "
        "do not edit by hand -->",
        "",
        "Every key the config file accepts, with its type and default. Any other key is "
        "refused at start-up, naming its path. Durations are in seconds, money in USD. "
        "In any string value, `os.environ/NAME` or `${NAME}` is read from the environment; "
        "`TRIOGATE_REDIS_URL`, `TRIOGATE_DATABASE_URL` and `TRIOGATE_MASTER_KEY` override "
        "the file. [Configuration](configuration.md) explains the file with an example.",
    ]
    section = None
    for where, key, kind, default, meaning in config_rows():
        if where != section:
            section = where
            out += ["", f"## `{where}`" if where != "(top level)" else "## Top level", "",
                    "| key | type | default | meaning |", "|---|---|---|---|"]
        out.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(out) + "\n"


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def commands(parser: argparse.ArgumentParser,
             name: str = "triogate") -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` for ``parser`` and each subcommand under it, depth first."""
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                found += commands(child, f"{name} {sub}")
    return found


def cli_reference() -> str:
    """The command-line page: every command, its options, their defaults."""
    from triogate.cli import parser

    out = [
        "# Command line",
        "",
        "<!-- generated by `python3 -m triogate.docgen` from triogate/cli/: "
        "do not edit by hand -->",
        "",
        "`triogate` (or `python3 -m triogate`). The admin commands (`keys`, `teams`, "
        "`users`, `tags`) call a running gateway's admin API.",
    ]
    for line, command in commands(parser()):
        rows = [a for a in _actions(command) if not isinstance(a, argparse._SubParsersAction)]
        subs = [a for a in command._actions
                if isinstance(a, argparse._SubParsersAction)]
        if not rows and not subs:
            continue
        out += ["", f"## `{line}`", ""]
        if command.description:
            out += [command.description, ""]
        if subs:
            out += ["| command | what |", "|---|---|"]
            for choice in subs[0]._choices_actions:
                out.append(f"| `{line} {choice.dest}` | {_cell(choice.help or '')} |")
            if rows:
                out.append("")
        if rows:
            out += ["| option | default | what |", "|---|---|---|"]
            for action in rows:
                flag = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
                default = ("" if action.default in (None, False) or not action.option_strings
                           else f"`{action.default}`")
                out.append(f"| {flag} | {default} | {_cell(action.help or '')} |")
    return "\n".join(out) + "\n"


def pages(root: Path) -> dict[Path, str]:
    """Each generated page's path under ``root`` and the text it should hold."""
    migration = (root / MIGRATION_PAGE).read_text()
    return {root / CONFIG_PAGE: config_reference(),
            root / MIGRATION_PAGE: admin_docs.render_into(migration),
            root / CLI_PAGE: cli_reference()}


def main(argv: list[str] | None = None) -> int:
    """Write the generated pages (``--check``: compare only); returns the exit status."""
    args = argparse.ArgumentParser(prog="python3 -m triogate.docgen", description=__doc__)
    args.add_argument("--root", type=Path, default=Path(), help="the project's root")
    args.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    options = args.parse_args(argv)
    stale = []
    for path, text in pages(options.root).items():
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not options.check:
                path.write_text(text)
    for path in stale:
        print(f"{'stale' if options.check else 'wrote'}: {path}")
    return 1 if stale and options.check else 0


if __name__ == "__main__":  # pragma: no cover - a maintainer's tool
    sys.exit(main())
