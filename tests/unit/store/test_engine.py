"""PostgreSQL connection settings that keep a hung database from holding the gateway."""

from __future__ import annotations

import sqlalchemy as sa

from triogate.store.engine import make_engine, with_statement_timeout


def test_a_statement_timeout_joins_the_urls_other_options() -> None:
    url = sa.engine.make_url("postgresql+psycopg://u@h/db?options=-csearch_path%3Dx")
    assert with_statement_timeout(url, 1234).query["options"] == (
        "-csearch_path=x -c statement_timeout=1234")
    bare = sa.engine.make_url("postgresql+psycopg://u@h/db")
    assert with_statement_timeout(bare, 5).query["options"] == "-c statement_timeout=5"


def test_the_urls_own_statement_timeout_wins() -> None:
    url = sa.engine.make_url("postgresql+psycopg://u@h/db?options=-c%20statement_timeout%3D9")
    assert with_statement_timeout(url, 1234) is url


def test_a_postgres_engine_bounds_connects_pool_waits_and_statements() -> None:
    engine, _ = make_engine(sa.engine.make_url("postgresql+psycopg://u@h/db"))
    try:
        _args, kwargs = engine.dialect.create_connect_args(engine.url)
        assert "statement_timeout=30000" in kwargs["options"]
        assert engine.pool.timeout() == 10  # type: ignore[attr-defined]
    finally:
        engine.dispose()
