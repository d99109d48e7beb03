"""The shape of the code: the batch library's exports, dependency direction, module sizes."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import triogate.batch

PACKAGE = Path(triogate.batch.__file__).parents[1]


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_every_public_name_of_the_batch_library_is_exported_once() -> None:
    exported = triogate.batch.__all__
    assert isinstance(exported, tuple)
    assert len(exported) == len(set(exported))
    for name in exported:
        value = getattr(triogate.batch, name)
        if not isinstance(value, str):  # BEFORE and AFTER are phase constants
            assert value.__module__.startswith("triogate.batch")
    public = {n for n in vars(triogate.batch) if not n.startswith("_")}
    assert public - {"testing"} == set(exported)


def test_gateway_code_uses_only_the_public_batch_api() -> None:
    for path in modules():
        if "batch" in path.parts:
            continue
        private = {m for m in imports_of(path) if m.startswith("triogate.batch._")}
        assert not private, f"{path.relative_to(PACKAGE)} imports {private}"


def test_the_batch_library_knows_nothing_of_the_gateway() -> None:
    for path in (PACKAGE / "batch").glob("*.py"):
        gateway = {m for m in imports_of(path)
                   if m.startswith("triogate") and not m.startswith("triogate.batch")}
        assert not gateway, f"{path.name} imports {gateway}"


def test_nothing_imports_upwards() -> None:
    """api → governance/routing/cache/providers → batch, store, config; app wires it all."""
    for path in modules():
        rel = path.relative_to(PACKAGE)
        top = rel.parts[0]
        for module in imports_of(path):
            if module in ("triogate.app", "triogate.cli"):
                assert top in ("cli", "__main__.py", "bench"), (
                    f"{rel} imports {module}")
            if module.startswith("triogate.api"):
                assert top in ("api", "ui", "app.py", "cli", "bench"), (
                    f"{rel} imports {module}")


def test_no_module_is_over_budget() -> None:
    for path in modules():
        lines = len(path.read_text().splitlines())
        assert lines <= 1200, f"{path.relative_to(PACKAGE)} has {lines} lines"
        if lines > 800:
            warnings.warn(f"{path.relative_to(PACKAGE)} has {lines} lines", stacklevel=1)
