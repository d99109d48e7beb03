"""The shape of the code: the batch library's exports, the package graph, knots inside
packages, module sizes.

Every import counts: at module level, inside functions (lazy imports) and under
``if TYPE_CHECKING:`` (a record imported only for a type annotation still ties two modules
together, and is the usual start of an upward import). Relative imports are resolved.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import triogate.batch

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

PACKAGE = Path(triogate.batch.__file__).parents[1]

#: Which part of triogate may import which (a part is a subpackage or a top-level module).
#: Read bottom-up: each part names only parts listed above it. ``triogate`` is the root
#: package itself (version, package data). Anything not listed is a wrong-way import.
ALLOWED: dict[str, frozenset[str]] = {name: frozenset(deps) for name, deps in {
    "triogate": (),
    "errors": (),
    "_log": (),
    "metrics": (),
    "_watch": (),  # time-outs by one watchdog task: trio only, shared by the three below
    "batch": ("_watch",),  # the library: knows nothing of the gateway
    "testing": (),  # the fake upstream: a server of its own, imports nothing of the gateway
    "server": ("_watch",),  # the HTTP server: serves any ASGI app, nothing of the gateway
    "lua": (),
    "config_litellm": ("errors",),
    "config_governance": ("errors",),
    "config_cloud": (),  # the cloud providers' settings (Bedrock, Gemini, Vertex AI)
    "config_settings": (),  # the ``triogate:`` section's settings
    "config_file": ("config_settings",),  # the file's shape, LiteLLM's sections
    "config": ("triogate", "errors", "config_cloud", "config_file", "config_litellm",
               "config_governance", "config_settings"),
    "redis_server": ("errors",),
    "store": ("errors",),
    "providers": ("_watch", "config", "config_cloud", "errors"),
    "governance": ("batch", "config", "config_governance", "config_settings", "errors",
                   "store"),
    "routing": ("batch", "config", "config_litellm", "errors", "governance"),
    "cache": ("batch", "config", "governance", "providers"),
    "otel": ("batch", "config", "routing"),
    "api": ("_log", "batch", "cache", "config", "config_governance", "errors", "governance",
            "metrics", "otel",
            "providers", "routing", "store"),
    "ui": ("api", "batch", "config", "errors", "governance", "routing", "store"),
    "app": ("api", "batch", "cache", "config", "config_governance", "errors", "governance",
            "metrics", "otel",
            "providers", "redis_server", "routing", "server", "store"),
    "asgi": ("_log", "api", "app", "config", "errors"),  # the ASGI application: app's lifespan
    "bench": ("api", "app", "batch", "config", "errors", "redis_server"),
    "cli": ("_log", "app", "asgi", "bench", "config", "errors", "redis_server", "server"),
    "docgen": ("api", "cli", "config_file"),  # the generated documentation pages
    "__main__": ("cli",),
}.items()}

#: Wrong-way imports that are known and left, by module, each with why. The test fails if a
#: new one appears, and also when one of these is gone (then delete its line).
KNOWN_WRONG_WAY: frozenset[tuple[str, str]] = frozenset({
    # The route table mounts the dashboard's routes. The way out is for app.py (the
    # composition root) to hand ui's routes to api; left while api/ and ui/ are being edited.
    ("triogate.api.routes", "triogate.ui.routes"),
})

#: Import cycles between modules of one package, left for now (each set is one strongly
#: connected component). None are left: the test fails when one appears. If one must be
#: left for a while, list it here with why; it may then only shrink.
KNOWN_KNOTS: frozenset[frozenset[str]] = frozenset()


# --------------------------------------------------------------------------- the import graph


def modules(root: Path = PACKAGE) -> list[Path]:
    return sorted(root.rglob("*.py"))


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: Path, root: Path = PACKAGE) -> set[tuple[str, str]]:
    """What this file imports anywhere in it (module level, functions, TYPE_CHECKING
    blocks), relative imports resolved, as (module, name) pairs: ``import a.b`` is
    ``("a.b", "")``, ``from a import b`` is ``("a", "b")`` (b may be a module or a name)."""
    me = module_name(path, root).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.update((module, alias.name) for alias in node.names)
    return found


def module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module → the modules of the package it imports. ``from a import b`` is an edge to
    ``a.b`` when that is a module, else to ``a``; a dotted name resolves to the longest
    module it names."""
    paths = {module_name(p, root): p for p in modules(root)}
    top = root.name
    graph: dict[str, set[str]] = {}
    for name, path in sorted(paths.items()):
        targets: set[str] = set()
        for module, attr in imported_names(path, root):
            if module != top and not module.startswith(top + "."):
                continue
            target = f"{module}.{attr}" if f"{module}.{attr}" in paths else module
            while target not in paths and "." in target:
                target = target.rpartition(".")[0]
            if target in paths and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def part_of(module: str) -> str:
    """The part a module belongs to: ``triogate.api.admin.keys`` → ``api``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def wrong_way_imports(graph: Mapping[str, Iterable[str]],
                      allowed: Mapping[str, frozenset[str]]) -> set[tuple[str, str]]:
    """Module edges that cross parts in a direction ``allowed`` does not list."""
    wrong = set()
    for module, targets in graph.items():
        mine = part_of(module)
        for target in targets:
            theirs = part_of(target)
            if theirs != mine and theirs not in allowed.get(mine, frozenset()):
                wrong.add((module, target))
    return wrong


def knots(graph: Mapping[str, Iterable[str]]) -> set[frozenset[str]]:
    """Import cycles among the modules of one part (Tarjan's strongly connected components,
    over edges that stay inside a part)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    inside = {m: [t for t in ts if part_of(t) == part_of(m)] for m, ts in graph.items()}

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in inside.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(inside):
        if v not in index:
            visit(v)
    return found


# --------------------------------------------------------------------------- the tests


def test_every_part_of_the_package_is_in_the_graph() -> None:
    parts = {part_of(m) for m in module_graph()}
    assert parts == set(ALLOWED), (
        f"new parts: {parts - set(ALLOWED)}; gone: {set(ALLOWED) - parts}")


def test_the_allowed_graph_points_one_way() -> None:
    """Each part names only parts listed before it, so the allowed graph has no cycle."""
    seen: set[str] = set()
    for part, deps in ALLOWED.items():
        assert deps <= seen, f"{part} may import {deps - seen}, which are not below it"
        seen.add(part)


def test_every_import_points_down_the_graph() -> None:
    wrong = wrong_way_imports(module_graph(), ALLOWED)
    new = wrong - KNOWN_WRONG_WAY
    assert not new, "wrong-way imports:\n" + "\n".join(f"  {a} -> {b}" for a, b in sorted(new))
    gone = KNOWN_WRONG_WAY - wrong
    assert not gone, f"no longer imported, remove from KNOWN_WRONG_WAY: {sorted(gone)}"


def test_modules_inside_a_package_do_not_import_each_other_in_a_circle() -> None:
    found = knots(module_graph())
    new = found - KNOWN_KNOTS
    assert not new, "new import cycles: " + "; ".join(" <-> ".join(sorted(k)) for k in new)
    changed = KNOWN_KNOTS - found
    assert not changed, ("untied or changed, update KNOWN_KNOTS: "
                         + "; ".join(" <-> ".join(sorted(k)) for k in changed))


def write_package(root: Path, files: Mapping[str, str]) -> Path:
    package = root / "triogate"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_the_check_catches_a_wrong_way_import_in_every_spelling(tmp_path: Path) -> None:
    """The checker itself, on a small tree: absolute, relative, function-local and
    TYPE_CHECKING imports of a higher part are each reported; a downward one is not."""
    package = write_package(tmp_path, {
        "__init__.py": "",
        "errors.py": "",
        "store/__init__.py": "",
        "store/schema.py": "from triogate import errors\n",
        "store/absolute.py": "import triogate.api.http\n",
        "store/relative.py": "from ..api import http\n",
        "store/lazy.py": "def f():\n    from triogate.api.http import Request\n",
        "store/typing_only.py": ("from typing import TYPE_CHECKING\n"
                                 "if TYPE_CHECKING:\n    from triogate.api.http import Request\n"),
        "api/__init__.py": "",
        "api/http.py": "from triogate.store import schema\n",
    })
    allowed = {"triogate": frozenset(), "errors": frozenset(),
               "store": frozenset({"errors"}), "api": frozenset({"store"})}
    wrong = wrong_way_imports(module_graph(package), allowed)
    assert wrong == {(f"triogate.store.{m}", "triogate.api.http")
                     for m in ("absolute", "relative", "lazy", "typing_only")}


def test_the_check_catches_a_knot_inside_a_package(tmp_path: Path) -> None:
    package = write_package(tmp_path, {
        "__init__.py": "",
        "routing/__init__.py": "",
        "routing/a.py": "from triogate.routing import b\n",
        "routing/b.py": ("from typing import TYPE_CHECKING\n"
                         "if TYPE_CHECKING:\n    from .a import Record\n"),
        "routing/c.py": "from triogate.routing import a\n",
    })
    assert knots(module_graph(package)) == {
        frozenset({"triogate.routing.a", "triogate.routing.b"})}


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
        if "batch" in path.relative_to(PACKAGE).parts:
            continue
        private = {m for m, _ in imported_names(path) if m.startswith("triogate.batch._")}
        assert not private, f"{path.relative_to(PACKAGE)} imports {private}"


def test_no_module_is_over_budget() -> None:
    for path in modules():
        lines = len(path.read_text().splitlines())
        assert lines <= 1200, f"{path.relative_to(PACKAGE)} has {lines} lines"
        if lines > 800:
            warnings.warn(f"{path.relative_to(PACKAGE)} has {lines} lines", stacklevel=1)


def documented_layout() -> tuple[set[str], set[str]]:
    """The architecture page's layout tree: (entries directly under ``triogate/``,
    top-level entries)."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = page.split("## Layout", 1)[1].split("```\n", 2)[1]
    inner, top = set(), set()
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 4):
            continue  # a description's continuation, or a sub-entry such as api/admin/
        name = line.split()[0]
        (inner if line.startswith("  ") else top).add(name)
    return inner, top


def test_the_documented_layout_matches_the_tree() -> None:
    inner, top = documented_layout()
    actual = {f"{p.name}/" for p in PACKAGE.iterdir()
              if p.is_dir() and (p / "__init__.py").exists()}
    actual |= {p.name for p in PACKAGE.iterdir()
               if p.suffix in (".py", ".yaml") and p.name != "__init__.py"}
    assert inner == actual, f"missing: {actual - inner}; not in the tree: {inner - actual}"
    assert "triogate/" in top
    for name in top:
        assert (PACKAGE.parent / name).exists(), f"docs/architecture.md's layout names {name}"
