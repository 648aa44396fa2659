"""The store a driver process opens from its DB argument (shared by tests/crash_drivers/*.py).

DB is a SQLite file, or `pg:SCHEMA`: that schema on the server of $STEERABLE_PG_DSN (the
processes then stand for hosts sharing one database, as tests/test_postgres_processes.py runs
them).
"""

from __future__ import annotations

import os
from typing import Any

from steerable.actors import SqliteStore


def open_store(db: str, **kwargs: Any) -> Any:
    """A SqliteStore on the file `db`, or a PostgresStore when `db` is `pg:SCHEMA`."""
    if db.startswith("pg:"):
        from steerable.actors import PostgresStore

        return PostgresStore(os.environ["STEERABLE_PG_DSN"], schema=db[3:], **kwargs)
    return SqliteStore(db, **kwargs)
