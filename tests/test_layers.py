"""`steerable.actors` is layered: every import points down, never up or sideways.

docs/architecture.md ("Layers") names the layers and why each may use the ones below it. This
test reads every module's imports (absolute, relative, lazy and `TYPE_CHECKING` ones alike) and
fails on any edge the table below does not allow, as test_protocol_purity.py does for protocol/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import steerable.actors

ACTORS_DIR = Path(steerable.actors.__file__).resolve().parent
PACKAGE = "steerable.actors"

# layer -> the layers it may import (itself included). `protocol` is steerable.protocol;
# `public` is the package's own `__init__` (its public names), which only testing may use.
ALLOWED: dict[str, frozenset[str]] = {
    "_machine": frozenset({"_machine", "protocol"}),
    "_engine": frozenset({"_engine", "protocol"}),
    "_tools": frozenset({"_tools", "_engine", "protocol"}),
    "_stores": frozenset({"_stores", "_engine", "protocol"}),
    "_observe": frozenset({"_observe", "_engine", "protocol"}),
    "_host": frozenset(
        {"_host", "_machine", "_engine", "_tools", "_stores", "_observe", "protocol"}
    ),
    "models": frozenset({"models", "_tools", "_engine", "protocol", "public"}),
    "testing": frozenset({"protocol", "public", "testing"}),
    "_cli": frozenset(
        {"_cli", "_host", "_stores", "_tools", "_engine", "_observe", "protocol", "public"}
        | {"testing"}
    ),
    "__init__": frozenset(
        {"_host", "_machine", "_engine", "_tools", "_stores", "_observe", "protocol"}
    ),
}


def _layer_of_module(dotted: str) -> str | None:
    """The layer of an absolute module name, or None when it is not steerable's."""
    if dotted == "steerable.protocol" or dotted.startswith("steerable.protocol."):
        return "protocol"
    if dotted == PACKAGE:
        return "public"
    if dotted.startswith(PACKAGE + "."):
        return dotted[len(PACKAGE) + 1 :].split(".", maxsplit=1)[0]
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(ACTORS_DIR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([PACKAGE, *parts])


def _imports(path: Path, this: str | None = None) -> list[tuple[int, str]]:
    """Every module `path` imports, as absolute names, with the line of the import.

    `this` is the module's dotted name (found from its place under actors/ by default).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    this = this or _module_name(path)
    is_package = path.name == "__init__.py"
    base_parts = this.split(".") if is_package else this.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                assert node.module is not None
                target = node.module
            else:
                parts = base_parts[: len(base_parts) - (node.level - 1)]
                target = ".".join([*parts, *([node.module] if node.module else [])])
            if node.module is None or target in {PACKAGE, this}:
                # `from . import x` or `from steerable.actors import x`: name the submodules
                # when they are modules, else the package itself.
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.append((node.lineno, sub if _is_module(sub) else target))
            else:
                found.append((node.lineno, target))
    return found


def _is_module(dotted: str) -> bool:
    if not dotted.startswith(PACKAGE + "."):
        return False
    rel = Path(*dotted[len(PACKAGE) + 1 :].split("."))
    return (ACTORS_DIR / rel).with_suffix(".py").exists() or (ACTORS_DIR / rel).is_dir()


def _source_layer(path: Path) -> str:
    rel = path.relative_to(ACTORS_DIR)
    if rel == Path("__init__.py"):
        return "__init__"
    return rel.parts[0].removesuffix(".py")


SOURCES = sorted(p for p in ACTORS_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_belongs_to_a_known_layer() -> None:
    unknown = {str(p.relative_to(ACTORS_DIR)) for p in SOURCES if _source_layer(p) not in ALLOWED}
    assert not unknown, f"modules outside every layer (add them to a layer): {sorted(unknown)}"


def _wrong_edges(path: Path, layer: str, this: str | None = None) -> list[str]:
    allowed = ALLOWED[layer]
    wrong = []
    for line, target in _imports(path, this):
        if target == "actors" or target.startswith("actors."):
            wrong.append(f"line {line}: bare {target} (import steerable.actors...)")
            continue
        target_layer = _layer_of_module(target)
        if target_layer is not None and target_layer not in allowed:
            wrong.append(f"line {line}: {layer} -> {target_layer} ({target})")
    return wrong


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ACTORS_DIR)))
def test_imports_point_down(path: Path) -> None:
    wrong = _wrong_edges(path, _source_layer(path))
    assert not wrong, "imports that go the wrong way:\n" + "\n".join(wrong)


def test_the_machine_is_pure() -> None:
    """The run machine imports no threads, clock, I/O or actor library (STYLE: a pure core)."""
    banned = {"threading", "time", "pykka", "structlog", "sqlite3", "asyncio", "socket", "random"}
    for path in (ACTORS_DIR / "_machine").rglob("*.py"):
        for line, target in _imports(path):
            assert target.split(".")[0] not in banned, f"{path.name}:{line} imports {target}"


def test_the_checker_sees_a_wrong_edge(tmp_path: Path) -> None:
    """The rules are live: upward edges are reported, absolute, relative and lazy alike."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from steerable.protocol import RunState\n"
        "from .._host.runtime import Runtime\n"
        "def f():\n"
        "    from steerable.actors._stores.store import MemoryStore\n"
        "import actors._engine.mux\n"
    )
    wrong = _wrong_edges(probe, "_machine", this=f"{PACKAGE}._machine.probe")
    assert sorted(wrong) == [
        "line 2: _machine -> _host (steerable.actors._host.runtime)",
        "line 4: _machine -> _stores (steerable.actors._stores.store)",
        "line 5: bare actors._engine.mux (import steerable.actors...)",
    ]


# --------------------------------------------------------------------------- the host side

HOST = f"{PACKAGE}._host"
FACADE = f"{HOST}.runtime"


def _host_graph() -> dict[str, set[str]]:
    """_host module -> the _host modules it imports (lazy and TYPE_CHECKING ones too)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ACTORS_DIR / "_host").glob("*.py")):
        name = _module_name(path)
        graph[name] = {
            target
            for _, target in _imports(path)
            if target.startswith(HOST + ".") and target != name
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is a few dozen nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_host_side_has_no_import_cycle() -> None:
    """Handles talk to a port, supervisors to a host protocol: no module closes a loop."""
    graph = _host_graph()
    assert FACADE in graph  # the graph is really read
    assert len(graph) > 5
    assert _cycles(graph) == []


def test_nothing_but_the_package_and_the_cli_imports_the_runtime_facade() -> None:
    importers = sorted(
        str(path.relative_to(ACTORS_DIR))
        for path in SOURCES
        if any(target == FACADE for _, target in _imports(path))
    )
    assert all(p == "__init__.py" or p.startswith("_cli/") for p in importers), importers
    assert "__init__.py" in importers


def test_the_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert _cycles(graph) == [["a", "b", "c"], ["e"]]
