"""The SQL tables (SQLAlchemy Core), one ``MetaData`` for SQLite and PostgreSQL alike.

Column names follow LiteLLM's where it has one (``token``'s hash aside), so that its
admin tooling and reports map onto triogate's database. Money columns are BIGINT
nano-USD; times are BIGINT epoch milliseconds, except ``budget_anchor_s`` (epoch seconds,
as the budget period arithmetic in ``governance.principals.Limits`` uses).

Keys are stored hashed: ``keys.token_hash`` is the SHA-256 hex of the raw key, and
``key_hint`` (``"sk-...abcd"``) is all that is kept of the key itself.

The schema is created on open with ``metadata.create_all`` (idempotent; see
``queries.create_schema`` for the guard against two processes creating it at once).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()


def _budget_columns() -> list[sa.Column[Any]]:
    """Budget and rate-limit columns shared by keys, teams, users, end users and tags."""
    return [
        sa.Column("max_budget_nanousd", sa.BigInteger, nullable=True),
        sa.Column("budget_duration", sa.Text, nullable=True),
        sa.Column("budget_duration_s", sa.BigInteger, nullable=True),
        sa.Column("budget_anchor_s", sa.BigInteger, nullable=True),
        sa.Column("tpm_limit", sa.BigInteger, nullable=True),
        sa.Column("rpm_limit", sa.BigInteger, nullable=True),
    ]


def _alert_budget_columns(*, models: bool) -> list[sa.Column[Any]]:
    """Added after the first release (nullable, so ``migrate.upgrade`` adds them): the soft
    budget (an alert, not a refusal) and, on keys and teams, per-model budgets
    (``{group: {"budget_limit_nanousd": n, "time_period": "1d"}}``)."""
    columns: list[sa.Column[Any]] = [sa.Column("soft_budget_nanousd", sa.BigInteger,
                                               nullable=True)]
    if models:
        columns.append(sa.Column("model_max_budget", sa.JSON, nullable=True))
    return columns


def _times() -> list[sa.Column[Any]]:
    return [
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    ]


def _rotation_columns() -> list[Any]:
    """Key rotation (``/key/regenerate``, ``auto_rotate``): the key's id (``token_hash``)
    stays, its secret changes. ``secret_hash`` is the current secret's SHA-256 (null:
    the id's), ``previous_secret_hash`` the one before, accepted until
    ``previous_secret_expires_at`` (a grace period)."""
    return [
        sa.Column("secret_hash", sa.Text, nullable=True),
        sa.Column("previous_secret_hash", sa.Text, nullable=True),
        sa.Column("previous_secret_expires_at", sa.BigInteger, nullable=True),
        sa.Column("auto_rotate", sa.Boolean, nullable=True),
        sa.Column("rotation_interval", sa.Text, nullable=True),
        sa.Column("key_rotation_at", sa.BigInteger, nullable=True),
        sa.Column("last_rotation_at", sa.BigInteger, nullable=True),
        sa.Column("rotation_count", sa.BigInteger, nullable=True),
        sa.Index("ux_keys_secret_hash", "secret_hash", unique=True),
        sa.Index("ix_keys_previous_secret_hash", "previous_secret_hash"),
        sa.Index("ix_keys_key_rotation_at", "key_rotation_at"),
    ]


keys = sa.Table(
    "keys",
    metadata,
    sa.Column("token_hash", sa.Text, primary_key=True),
    sa.Column("key_alias", sa.Text, nullable=True),
    sa.Column("key_hint", sa.Text, nullable=True),
    sa.Column("team_id", sa.Text, nullable=True, index=True),
    sa.Column("user_id", sa.Text, nullable=True, index=True),
    sa.Column("models", sa.JSON, nullable=False),
    *_budget_columns(),
    sa.Column("max_parallel_requests", sa.BigInteger, nullable=True),
    sa.Column("model_rpm_limit", sa.JSON, nullable=False),
    sa.Column("model_tpm_limit", sa.JSON, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("tags", sa.JSON, nullable=False),
    sa.Column("expires_at", sa.BigInteger, nullable=True),
    sa.Column("blocked", sa.Boolean, nullable=False),
    *_times(),
    # Added after the first release: nullable, so ``migrate.upgrade`` can add them.
    sa.Column("aliases", sa.JSON, nullable=True),
    sa.Column("budget_id", sa.Text, nullable=True),
    *_alert_budget_columns(models=True),
    # LiteLLM finds keys by alias: two keys with one alias would make that ambiguous.
    sa.Index("ux_keys_key_alias", "key_alias", unique=True),
    *_rotation_columns(),
)

teams = sa.Table(
    "teams",
    metadata,
    sa.Column("team_id", sa.Text, primary_key=True),
    sa.Column("team_alias", sa.Text, nullable=True),
    sa.Column("models", sa.JSON, nullable=False),
    *_budget_columns(),
    sa.Column("max_parallel_requests", sa.BigInteger, nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("blocked", sa.Boolean, nullable=False),
    *_times(),
    sa.Column("model_aliases", sa.JSON, nullable=True),
    sa.Column("budget_id", sa.Text, nullable=True),
    *_alert_budget_columns(models=True),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("user_id", sa.Text, primary_key=True),
    sa.Column("user_email", sa.Text, nullable=True),
    sa.Column("user_alias", sa.Text, nullable=True),
    sa.Column("models", sa.JSON, nullable=False),
    *_budget_columns(),
    sa.Column("max_parallel_requests", sa.BigInteger, nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("blocked", sa.Boolean, nullable=False),
    *_times(),
    sa.Column("user_role", sa.Text, nullable=True),
    sa.Column("budget_id", sa.Text, nullable=True),
    *_alert_budget_columns(models=False),
)

end_users = sa.Table(
    "end_users",
    metadata,
    sa.Column("user_id", sa.Text, primary_key=True),
    sa.Column("alias", sa.Text, nullable=True),
    *_budget_columns(),
    sa.Column("max_parallel_requests", sa.BigInteger, nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("blocked", sa.Boolean, nullable=False),
    *_times(),
    sa.Column("budget_id", sa.Text, nullable=True),
    *_alert_budget_columns(models=False),
)

tags = sa.Table(
    "tags",
    metadata,
    sa.Column("tag", sa.Text, primary_key=True),
    sa.Column("description", sa.Text, nullable=True),
    *_budget_columns(),
    *_times(),
)

#: LiteLLM's ``members_with_roles``: who is in a team, as ``admin`` or ``user``.
team_members = sa.Table(
    "team_members",
    metadata,
    sa.Column("team_id", sa.Text, primary_key=True),
    sa.Column("user_id", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("user_email", sa.Text, nullable=True),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Index("ix_team_members_user", "user_id"),
    # Per-member limits inside the team (``max_budget_in_team``); null = none.
    sa.Column("max_budget_nanousd", sa.BigInteger, nullable=True),
    sa.Column("tpm_limit", sa.BigInteger, nullable=True),
    sa.Column("rpm_limit", sa.BigInteger, nullable=True),
)

#: LiteLLM's budget table: limits shared by every key, team, user or end user whose
#: ``budget_id`` names it.
budgets = sa.Table(
    "budgets",
    metadata,
    sa.Column("budget_id", sa.Text, primary_key=True),
    *_budget_columns(),
    sa.Column("max_parallel_requests", sa.BigInteger, nullable=True),
    *_times(),
)

spend_logs = sa.Table(
    "spend_logs",
    metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("api", sa.Text, nullable=False),
    sa.Column("key_hash", sa.Text, nullable=True),
    sa.Column("key_alias", sa.Text, nullable=True),
    sa.Column("team_id", sa.Text, nullable=True),
    sa.Column("user_id", sa.Text, nullable=True),
    sa.Column("end_user", sa.Text, nullable=True),
    sa.Column("tags", sa.JSON, nullable=False),
    sa.Column("model_group", sa.Text, nullable=True),
    sa.Column("deployment_id", sa.Text, nullable=True),
    sa.Column("upstream_model", sa.Text, nullable=True),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_nanousd", sa.BigInteger, nullable=False),
    sa.Column("cache_hit", sa.Boolean, nullable=False),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("http_status", sa.Integer, nullable=True),
    sa.Column("latency_ms", sa.BigInteger, nullable=False),
    sa.Column("start_time_ms", sa.BigInteger, nullable=False),
    sa.Column("end_time_ms", sa.BigInteger, nullable=False),
    # Added after the first release: nullable, so ``migrate.upgrade`` can add them.
    sa.Column("response_id", sa.Text, nullable=True),
    sa.Column("client_request_id", sa.Text, nullable=True),
    # The guardrails that ran and their verdicts: a JSON list as text (nullable: added).
    sa.Column("guardrails", sa.Text, nullable=True),
    sa.Index("ix_spend_logs_client_request_id", "client_request_id"),
    # LiteLLM's spend-log fields: JSON text (metadata, messages, response), and the
    # response-cache key and the deployment's api_base.
    sa.Column("metadata", sa.Text, nullable=True),
    sa.Column("cache_key", sa.Text, nullable=True),
    sa.Column("api_base", sa.Text, nullable=True),
    sa.Column("messages", sa.Text, nullable=True),
    sa.Column("response", sa.Text, nullable=True),
    # One index per report filter; each ends with the time so ranges stay indexed.
    sa.Index("ix_spend_logs_key_time", "key_hash", "start_time_ms"),
    sa.Index("ix_spend_logs_team_time", "team_id", "start_time_ms"),
    sa.Index("ix_spend_logs_user_time", "user_id", "start_time_ms"),
    sa.Index("ix_spend_logs_end_user_time", "end_user", "start_time_ms"),
    sa.Index("ix_spend_logs_time", "start_time_ms"),
)

#: One row per (request, tag): an exact, indexable tag filter (a LIKE on the JSON text
#: would match "a" inside "ab"). ``start_time_ms`` is copied so tag + range stays indexed.
spend_log_tags = sa.Table(
    "spend_log_tags",
    metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("tag", sa.Text, primary_key=True),
    sa.Column("start_time_ms", sa.BigInteger, nullable=False),
    sa.Index("ix_spend_log_tags_tag_time", "tag", "start_time_ms"),
)

#: Entity tables in the order reports and tests walk them.
ENTITY_TABLES = (keys, teams, users, end_users, tags, budgets)
