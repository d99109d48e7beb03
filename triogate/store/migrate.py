"""Bring an existing database up to the schema: add missing columns and indexes.

``metadata.create_all`` creates missing *tables* only. Columns and indexes added to a
table after a database was created are added here, in the same locked transaction as
``create_all`` (``engine.create_schema``), so two processes starting at once do it once.
New columns are always nullable (old rows read as None), so adding them never fails.
A unique index that existing rows violate (two keys sharing an alias, written before
aliases had to be unique) is skipped with a warning; the admin API still refuses new
duplicates.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import sqlalchemy as sa
import sqlalchemy.exc

from .schema import metadata

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

logger = logging.getLogger("triogate.store")


def upgrade(conn: Connection) -> None:
    """Add what ``create_all`` leaves out on tables that already existed (blocking)."""
    inspector = sa.inspect(conn)
    existing_tables = set(inspector.get_table_names())
    for table in metadata.sorted_tables:
        if table.name not in existing_tables:
            continue
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in have:
                continue
            kind = column.type.compile(dialect=conn.dialect)
            conn.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}')
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name in indexes:
                continue
            try:
                with conn.begin_nested():
                    index.create(conn)
            except sqlalchemy.exc.IntegrityError:
                logger.warning("index %s not created: existing rows violate it", index.name)
