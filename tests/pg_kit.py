"""A PostgreSQL server for the tests: its DSN, a fresh schema per test, chaos helpers.

`.ci/run` and `just test-pg` start a throwaway server (scripts/pg-server) and export
`STEERABLE_PG_DSN` (and `STEERABLE_PG_DIR`, its folder, so a test can restart it). Without a
DSN the PostgreSQL tests skip, saying why; with `CI=true` they fail instead: CI must run them.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from steerable.actors import PostgresStore

DSN_ENV = "STEERABLE_PG_DSN"
DIR_ENV = "STEERABLE_PG_DIR"
SERVER_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pg-server"
_names = itertools.count()


def _missing(why: str) -> None:
    message = f"PostgreSQL tests need a server: {why} (`just test-pg` starts one)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


def require_dsn() -> str:
    """The test server's DSN; skips (fails under CI=true) without one or without psycopg."""
    dsn = os.environ.get(DSN_ENV, "")
    if not dsn:
        _missing(f"{DSN_ENV} is not set")
    try:
        import psycopg
    except ImportError:
        _missing("psycopg is not installed (pip install -e '.[dev]')")
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        _missing(f"{DSN_ENV} does not answer ({exc})")
    return dsn


def admin(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a connection of its own; its rows (if any)."""
    import psycopg

    with psycopg.connect(require_dsn(), autocommit=True) as conn:
        cur = conn.execute(sql.encode(), params)
        return list(cur.fetchall()) if cur.description else []


def new_schema() -> str:
    """A schema name no other test of this session uses."""
    return f"t{os.getpid()}_{next(_names)}"


def drop_schema(name: str) -> None:
    admin(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema for one test's PostgresStore objects, dropped afterwards."""
    require_dsn()
    name = new_schema()
    yield name
    drop_schema(name)


def pg_store(schema: str, **kwargs: Any) -> PostgresStore:
    """A PostgresStore on the test server, in `schema`."""
    return PostgresStore(require_dsn(), schema=schema, **kwargs)


class IterationSchemas:
    """A fresh schema per crash-loop iteration folder (`schemas(work)` names it), under `base`.

    `create`: make each schema (with the store's tables) when first named, before processes
    race to open it. `drop()` drops every one named.
    """

    def __init__(self, base: str, *, create: bool = False) -> None:
        self.base = base
        self.create = create
        self.names: list[str] = []

    def __call__(self, work: Path) -> str:
        name = f"{self.base}_{work.name.replace('-', '_')}"
        if name not in self.names:
            if self.create:
                pg_store(name).close()
            self.names.append(name)
        return name

    def runs(self) -> int:
        """Runs stored in all of them (an iteration killed before its first commit has none)."""
        return sum(admin(f"SELECT count(*) FROM {name}.runs")[0][0] for name in self.names)

    def drop(self) -> None:
        for name in self.names:
            drop_schema(name)


def terminate_backends(application: str | None = None) -> int:
    """`pg_terminate_backend` every other connection to the test database (or only those of
    `application`); how many were terminated."""
    where = "" if application is None else " AND application_name = %s"
    rows = admin(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = current_database() AND pid <> pg_backend_pid(){where}",
        () if application is None else (application,),
    )
    return int(rows[0][0])


def _server(action: str) -> None:
    folder = os.environ.get(DIR_ENV, "")
    if not folder:
        _missing(f"{DIR_ENV} is not set (this test needs the server's folder)")
    subprocess.run([str(SERVER_SCRIPT), action, folder], check=True, timeout=120)


def restart_server() -> None:
    """Restart the test server (fast shutdown: every connection is dropped)."""
    _server("restart")


def stop_server() -> None:
    """Stop the test server (fast shutdown); `start_server_again()` brings it back."""
    _server("stop")


def start_server_again() -> None:
    """Start the stopped test server again, with its data."""
    _server("up")
