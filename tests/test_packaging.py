"""The built wheel: `actors/` and `protocol/` ship as `steerable.actors` and `steerable.protocol`.

docs/decisions/0001-packaging.md. The wheel is built once per module from a clean copy of the
source tree (never in place: a stale `build/` would leak into it), then installed into a fresh
virtual environment (with its dependencies, from PyPI or pip's cache).
"""

from __future__ import annotations

import configparser
import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"actors": "steerable/actors", "protocol": "steerable/protocol"}
REQUIRED = ("pykka", "pydantic", "structlog", "msgpack")


def _run(args: list[str | Path], cwd: Path, timeout: float = 180) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(
        ROOT,
        src,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".typecheck",
            ".hypothesis",
            "*.db",
            "*.db-*",
        ),
    )
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", dist, src], cwd=src)
    (built,) = dist.glob("steerable-*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        (path,) = [n for n in zf.namelist() if n.endswith(f".dist-info/{name}")]
        return zf.read(path).decode()


def _source_files(folder: str) -> Iterator[str]:
    base = ROOT / folder
    for path in sorted(base.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
            yield path.relative_to(base).as_posix()


def test_wheel_ships_both_packages_under_steerable(names: list[str]) -> None:
    for folder, package in PACKAGES.items():
        assert f"{package}/__init__.py" in names
        assert f"{package}/py.typed" in names
        # Every source file, subpackages included (they must be listed in pyproject's packages).
        missing = [f for f in _source_files(folder) if f"{package}/{f}" not in names]
        assert not missing, f"{folder}/ files missing from the wheel: {missing}"


def test_wheel_has_nothing_else(names: list[str]) -> None:
    top_level = {n.split("/", 1)[0] for n in names}
    (dist_info,) = (t for t in top_level if t.endswith(".dist-info"))
    assert top_level == {"steerable", dist_info}  # no bare actors/, protocol/, tests/
    assert "steerable/__init__.py" not in names  # an implicit namespace package
    assert not [n for n in names if "/tests/" in n or n.endswith("conftest.py")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_wheel_metadata_requires_the_runtime_dependencies(wheel: Path) -> None:
    metadata = email.parser.Parser().parsestr(_dist_info(wheel, "METADATA"))
    assert metadata["Name"] == "steerable"
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    runtime = {r.name: r for r in requirements if r.marker is None}
    assert set(REQUIRED) <= set(runtime)
    pykka = runtime["pykka"].specifier
    assert "4.5.0" in pykka
    assert "4.9" in pykka
    assert "4.4" not in pykka
    assert "5.0" not in pykka
    dev = {r.name for r in requirements if r.marker is not None}
    assert {"pytest", "build"} <= dev  # the dev extra, not runtime dependencies


def test_wheel_declares_the_console_script(wheel: Path) -> None:
    entry_points = configparser.ConfigParser()
    entry_points.read_string(_dist_info(wheel, "entry_points.txt"))
    scripts = entry_points["console_scripts"]
    assert scripts.get("steerable", "").startswith("steerable.actors.")


def test_wheel_installs_and_imports_in_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    _run([python, "-m", "pip", "install", "--quiet", wheel], cwd=tmp_path, timeout=300)

    # From an empty directory: the repository is nowhere on sys.path.
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    out = _run(
        [
            python,
            "-c",
            "import steerable, steerable.protocol, steerable.actors; "
            "print(steerable.protocol.__file__); print(list(steerable.__path__))",
        ],
        cwd=cwd,
    )
    protocol_file, namespace_path = out.splitlines()
    assert Path(protocol_file).is_relative_to(venv)
    assert str(ROOT) not in namespace_path
    for bare in ("actors", "protocol"):
        proc = subprocess.run(
            [str(python), "-c", f"import {bare}"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode != 0
        assert "ModuleNotFoundError" in proc.stderr
    assert (bindir / "steerable").exists()
