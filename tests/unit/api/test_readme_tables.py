"""The migration page's tables are the ones the code enforces."""

from __future__ import annotations

from pathlib import Path

from triogate.api.admin import docs, roles
from triogate.api.admin.routes import handlers_by_route

PAGE = Path(__file__).resolve().parents[3] / "docs" / "migrating-from-litellm.md"


def test_the_migration_page_holds_the_generated_field_and_route_tables() -> None:
    text = PAGE.read_text()
    assert docs.render_into(text) == text, (
        "docs/migrating-from-litellm.md's tables are stale: run python3 -m triogate.docgen")


def test_every_admin_route_has_exactly_one_rule_and_one_row() -> None:
    assert set(roles.RULES) == set(handlers_by_route())
    table = docs.route_table()
    for method, path in roles.RULES:
        assert table.count(f"| `{method} {path}` |") == 1


def test_every_accepted_field_has_a_row() -> None:
    table = docs.field_table()
    for fields, extra in docs.ENTITIES.values():
        for name in (*fields, *extra):
            assert f"| `{name}` |" in table
