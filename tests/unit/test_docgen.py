"""The generated documentation pages (configuration reference, migration tables, command
line) are what ``python3 -m triogate.docgen`` writes, and the command line's help names
the defaults the code uses."""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs
import pytest

from triogate import cli, docgen
from triogate.config import load_config
from triogate.config_file import ConfigFile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", [docgen.CONFIG_PAGE, docgen.MIGRATION_PAGE, docgen.CLI_PAGE],
                         ids=str)
def test_the_generated_page_is_what_the_generator_writes(page: Path) -> None:
    expected = docgen.pages(ROOT)[ROOT / page]
    assert (ROOT / page).read_text() == expected, f"{page} is stale: run python3 -m triogate.docgen"


def test_every_config_key_has_a_row_with_a_meaning() -> None:
    rows = docgen.config_rows()
    keys = [row[1] for row in rows]
    assert len(keys) == len(set(keys))
    missing = [row[1] for row in rows if not row[4]]
    assert not missing, ("say what these keys mean: a #: comment above the field in "
                         f"triogate/config.py, or an entry in docgen.MEANINGS: {missing}")
    assert set(docgen.MEANINGS) <= set(keys), "docgen.MEANINGS names keys that do not exist"
    top = {f.name for f in attrs.fields(ConfigFile)}
    assert {key.split(".")[0].removesuffix("[]") for key in keys} == top


def test_the_reference_shows_real_defaults() -> None:
    page = docgen.config_reference()
    assert "| `triogate.redis.timeout_s` | float | `0.5` |" in page
    assert '| `triogate.cache.scope` | "team" or "key" or "global" | `"team"` |' in page
    assert "| `model_list[].litellm_params.model` | str | required |" in page


def _options() -> list[tuple[str, argparse.Action]]:
    return [(line, action) for line, command in docgen.commands(cli.parser())
            for action in command._actions
            if action.option_strings and action.help is not argparse.SUPPRESS
            and not isinstance(action, argparse._HelpAction)]


def test_every_option_with_a_default_names_it_in_its_help() -> None:
    checked = 0
    for line, action in _options():
        if action.default in (None, False):
            continue
        default = action.default
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        assert f"default {shown}" in (action.help or ""), (line, action.option_strings)
        checked += 1
    assert checked >= 8


def test_serve_names_the_config_it_loads_and_the_docs_agree() -> None:
    serve = dict(docgen.commands(cli.parser()))["triogate serve"]
    config = next(a for a in serve._actions if "--config" in a.option_strings)
    assert config.default is None
    assert "default: triogate/example.yaml" in (config.help or "")
    default = load_config(None, environ={})
    assert default.source == "triogate/example.yaml"
    packaged = load_config(ROOT / "triogate" / "example.yaml", environ={})
    assert attrs.evolve(packaged, source=default.source) == default
    for doc in ("README.md", "docs/getting-started.md", "docs/configuration.md"):
        text = (ROOT / doc).read_text()
        assert "triogate/example.yaml" in text, doc
        assert "127.0.0.1:4000" in text, doc
