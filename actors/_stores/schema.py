"""The SQLite store's schema: recognising a steerable database, creating it, migrating it.

A steerable database carries SQLite's `application_id` (`0x53544552`, "STER") and a `meta`
table with its `schema_version`. Schema 1 (steerable 0.1.0) had only the `meta` table; it is
recognised by that table and migrated in place. Any other file is refused with a typed error
before anything is written to it: not switched to WAL, no table added (docs/durability.md).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from steerable.protocol import AgentError, ErrorCode, SteerableError

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "check_foreign", "foreign", "migrate"]

APPLICATION_ID = 0x53544552
"""SQLite's `application_id` pragma of every steerable database ("STER")."""

SCHEMA_VERSION = 2
"""The version of the database layout; distinct from the codec's format."""

_V1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, parent_run_id TEXT, task TEXT NOT NULL, agent TEXT NOT NULL,
    state TEXT NOT NULL, revision INTEGER NOT NULL, updated_at REAL NOT NULL,
    static BLOB NOT NULL, crc INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS revisions (
    run_id TEXT NOT NULL, revision INTEGER NOT NULL, snapshot BLOB NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (run_id, revision)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entries (
    run_id TEXT NOT NULL, idx INTEGER NOT NULL, entry BLOB NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (run_id, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, message BLOB NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal (
    run_id TEXT NOT NULL, call_id TEXT NOT NULL, result BLOB NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (run_id, call_id)) WITHOUT ROWID;
"""

_V2 = """
CREATE TABLE leases (
    run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    epoch INTEGER NOT NULL, expires_at REAL NOT NULL, agent TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID;
CREATE INDEX leases_owner ON leases (owner);
CREATE TABLE events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, event BLOB NOT NULL, crc INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
ALTER TABLE inbox ADD COLUMN message_id TEXT;
ALTER TABLE revisions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
CREATE TABLE remote_ops (
    op_id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, message_id TEXT,
    message BLOB NOT NULL, crc INTEGER NOT NULL, seq INTEGER);
CREATE INDEX remote_ops_open ON remote_ops (seq) WHERE seq IS NULL;
CREATE UNIQUE INDEX inbox_message_id ON inbox (run_id, message_id) WHERE message_id IS NOT NULL;
"""
"""Schema 2 (ownership): leases with epochs (each revision records the epoch that wrote it),
stored events, caller-chosen message ids, and operations addressed to a run another process
owns (`remote_ops`: the owner gives each its inbox seq, or refuses it with seq -1)."""

_MIGRATIONS: dict[int, str] = {2: _V2}
"""Forward migrations: version -> the script that brings version - 1 to it."""


def _error(code: ErrorCode, path: Path, message: str, **details: Any) -> SteerableError:
    return SteerableError(AgentError.of(code, f"{path}: {message}", path=str(path), **details))


def foreign(path: Path, why: str) -> SteerableError:
    """The error for a file that is not a steerable database (nothing was changed)."""
    return _error(
        ErrorCode.CHECKPOINT_INCOMPATIBLE,
        path,
        f"not a steerable database ({why}); refusing to use it (nothing was changed)",
        reason="foreign",
    )


def check_foreign(path: Path) -> bool:
    """Read-only look at an existing file: True if it is a steerable database, False if empty.

    Raises:
        SteerableError: `checkpoint_corrupt` for a file that is not SQLite at all;
            `checkpoint_incompatible` for another application's SQLite database.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    # Only SQLite opens the file: closing a descriptor of our own on it would drop every POSIX
    # lock this process holds on it (a store already open here), and another process closing
    # its last connection would then delete the WAL this one still writes to.
    if not os.access(path, os.R_OK):
        raise _error(ErrorCode.CHECKPOINT_CORRUPT, path, "cannot read: permission denied")
    # A header that says WAL (byte 19, read version 2) makes even a read-only open create -wal
    # and -shm.
    absent = [s for s in _sidecars(path) if not s.exists()]
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error:
        return True  # the store's own open reports what is wrong (`store_unavailable`)
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id == APPLICATION_ID:
            return True
        if app_id != 0:
            raise foreign(path, f"application_id {app_id:#x}")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return False  # an empty SQLite database: ours to initialise
        if "meta" not in tables or "runs" not in tables:
            raise foreign(path, "its tables are not steerable's")
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            raise foreign(path, "no schema_version in its meta table")
        return True
    except sqlite3.OperationalError:
        # Cannot be read here (a read-only folder or file system with no -shm, a lock): the
        # store's own open reports it (`store_unavailable`), and it writes nothing either.
        return True
    except sqlite3.DatabaseError as exc:
        conn.close()
        # Not a database, so nobody uses it as one: the sidecars SQLite just made are ours to
        # take back, and the file is left as it was found.
        for sidecar in absent:
            sidecar.unlink(missing_ok=True)
        if "not a database" in str(exc):
            raise _error(ErrorCode.CHECKPOINT_CORRUPT, path, "not an SQLite database") from None
        raise _error(ErrorCode.CHECKPOINT_CORRUPT, path, f"unreadable: {exc}") from None
    finally:
        conn.close()


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]


def migrate(conn: sqlite3.Connection, path: Path) -> int:
    """Create or migrate the schema in place (one transaction); returns the version found.

    Raises:
        SteerableError: `checkpoint_incompatible` for a schema newer than this steerable's.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" in tables:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            found = int(row[0]) if row is not None else 1
        else:
            found = 0
        if found > SCHEMA_VERSION:
            raise _error(
                ErrorCode.CHECKPOINT_INCOMPATIBLE,
                path,
                f"written by a newer steerable (schema {found} > {SCHEMA_VERSION}); "
                "upgrade steerable to open it",
                schema_version=found,
                supported=SCHEMA_VERSION,
            )
        if found < SCHEMA_VERSION:
            if found == 0:
                _script(conn, _V1)
                found = 1
            for version in range(found + 1, SCHEMA_VERSION + 1):
                _script(conn, _MIGRATIONS[version])
            conn.execute(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found


def _script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT first; one statement at a time keeps the migration atomic.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)
