"""`steerable.protocol` is pure data: importing it starts no thread and pulls in no runtime.

docs/style.md: protocol/ never imports pykka, structlog or steerable.actors; no I/O besides codecs.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import steerable.protocol

PROTOCOL_DIR = Path(steerable.protocol.__file__).resolve().parent
PROTOCOL_FILES = sorted(PROTOCOL_DIR.rglob("*.py"))

# Top-level modules protocol/ must not import: the runtime, and I/O beyond the codec.
BANNED_MODULES = frozenset({"pykka", "structlog", "actors", "sqlite3", "socket", "subprocess"})

# Runs in a fresh interpreter, so nothing the test process imported can hide an import.
PROBE = """
import importlib, json, pkgutil, sys, threading
import steerable.protocol as protocol
for info in pkgutil.walk_packages(protocol.__path__, "steerable.protocol."):
    importlib.import_module(info.name)
print(json.dumps({
    "modules": sorted(sys.modules),
    "threads": threading.active_count(),
    "file": protocol.__file__,
}))
"""


def test_importing_protocol_loads_no_runtime_and_starts_no_thread(tmp_path: Path) -> None:
    # From an empty directory, so the repository root is not on sys.path (no bare `actors`).
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    modules = set(report["modules"])
    # I/O modules (socket, subprocess...) are checked statically below: pydantic itself pulls
    # some of them in (socket, through email.utils), so sys.modules cannot tell.
    for name in ("pykka", "structlog", "steerable.actors", "actors"):
        assert name not in modules, f"importing steerable.protocol imported {name}"
    assert not {m for m in modules if m.startswith(("pykka.", "structlog.", "steerable.actors."))}
    assert report["threads"] == 1
    assert Path(report["file"]).resolve().parent == PROTOCOL_DIR


def _package_of(path: Path) -> str:
    """The dotted package a file of protocol/ belongs to once installed."""
    parts = path.relative_to(PROTOCOL_DIR).parent.parts
    return ".".join(("steerable", "protocol", *parts))


def _resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of `from ... import`, relative imports resolved against `package`."""
    if node.level == 0:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _is_banned(module: str) -> bool:
    return (
        module.split(".", maxsplit=1)[0] in BANNED_MODULES
        or module == "steerable.actors"
        or module.startswith("steerable.actors.")
    )


def _banned_imports(source: str, package: str) -> list[str]:
    """Imports of a banned module in `source` (a module of `package`), as 'line: statement'."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            # `from steerable import actors` imports the module steerable.actors.
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        if any(_is_banned(target) for target in targets):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_protocol_files_found() -> None:
    names = {p.name for p in PROTOCOL_FILES}
    assert {"__init__.py", "_state.py", "_errors.py", "_config.py"} <= names


@pytest.mark.parametrize("path", PROTOCOL_FILES, ids=lambda p: p.name)
def test_protocol_module_imports_nothing_banned(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert _banned_imports(source, _package_of(path)) == []


@pytest.mark.parametrize(
    "source",
    [
        "import pykka",
        "import structlog.stdlib",
        "from steerable.actors import Runtime",
        "from steerable import actors",
        "from ..actors import _tool",
        "from .. import actors",
        "import sqlite3",
        "from socket import socket",
        "import subprocess as sp",
        "def f():\n    import socket",
    ],
)
def test_the_static_check_catches(source: str) -> None:
    assert _banned_imports(source, "steerable.protocol")


def test_the_static_check_resolves_relative_imports_in_subpackages() -> None:
    assert _banned_imports("from ...actors import x", "steerable.protocol.migrations")
    assert _banned_imports("from .._base import Record", "steerable.protocol.migrations") == []


def test_the_static_check_allows_relative_and_pure_imports() -> None:
    source = (
        "from __future__ import annotations\nimport hashlib, os, time\n"
        "from enum import StrEnum\nfrom pydantic import Field\nimport msgpack\n"
        "from ._base import Record\nfrom . import _state\n"
    )
    assert _banned_imports(source, "steerable.protocol") == []
