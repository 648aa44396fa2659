"""The PostgreSQL store's schema: creating it, recognising it, migrating it forward.

Every table lives in one PostgreSQL schema (`steerable` unless `PostgresStore(schema=...)` says
otherwise), with a `meta` table holding its `schema_version`. Creation and migration run in
one transaction under an advisory lock, so hosts that start together never race. A schema that
holds tables but no steerable `meta` is another application's: refused, nothing changed. A
newer `schema_version` is refused with `checkpoint_incompatible` (docs/deployment.md).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from steerable.protocol import AgentError, ErrorCode, SteerableError

if TYPE_CHECKING:
    import psycopg

__all__ = ["SCHEMA_VERSION", "check_schema_name", "migrate"]

SCHEMA_VERSION = 2
"""The version of the PostgreSQL layout (its own counter, distinct from SQLite's)."""

_V1 = """
CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {s}.runs (
    run_id text PRIMARY KEY, parent_run_id text, task text NOT NULL, agent text NOT NULL,
    state text NOT NULL, revision bigint NOT NULL, updated_at double precision NOT NULL,
    static bytea NOT NULL, crc bigint NOT NULL);
CREATE TABLE {s}.revisions (
    run_id text NOT NULL, revision bigint NOT NULL, snapshot bytea NOT NULL, crc bigint NOT NULL,
    epoch bigint NOT NULL DEFAULT 0, PRIMARY KEY (run_id, revision));
CREATE TABLE {s}.entries (
    run_id text NOT NULL, idx bigint NOT NULL, entry bytea NOT NULL, crc bigint NOT NULL,
    PRIMARY KEY (run_id, idx));
CREATE TABLE {s}.inbox (
    run_id text NOT NULL, seq bigint NOT NULL, message bytea NOT NULL, crc bigint NOT NULL,
    message_id text, PRIMARY KEY (run_id, seq));
CREATE UNIQUE INDEX inbox_message_id ON {s}.inbox (run_id, message_id)
    WHERE message_id IS NOT NULL;
CREATE TABLE {s}.journal (
    run_id text NOT NULL, call_id text NOT NULL, result bytea NOT NULL, crc bigint NOT NULL,
    PRIMARY KEY (run_id, call_id));
CREATE TABLE {s}.leases (
    run_id text PRIMARY KEY, owner text NOT NULL, host text NOT NULL, pid bigint NOT NULL,
    epoch bigint NOT NULL, expires_at double precision NOT NULL, agent text NOT NULL DEFAULT '');
CREATE INDEX leases_owner ON {s}.leases (owner);
CREATE TABLE {s}.events (
    run_id text NOT NULL, seq bigint NOT NULL, event bytea NOT NULL, crc bigint NOT NULL,
    PRIMARY KEY (run_id, seq));
CREATE TABLE {s}.remote_ops (
    op_id bigserial PRIMARY KEY, run_id text NOT NULL, message_id text,
    message bytea NOT NULL, crc bigint NOT NULL, seq bigint);
CREATE INDEX remote_ops_open ON {s}.remote_ops (op_id) WHERE seq IS NULL;
CREATE UNIQUE INDEX remote_ops_message_id ON {s}.remote_ops (run_id, message_id)
    WHERE message_id IS NOT NULL;
"""
"""Schema 1: the layout of SQLite's schema 2, in PostgreSQL types (docs/checkpoint-format.md).
Lease expiries are seconds since the epoch on the database server's clock."""

OPEN_RUNS = "parent_run_id IS NULL AND state NOT IN ('finished', 'exhausted', 'cancelled', 'error')"
"""The top-level runs that are not terminal: the predicate of schema 2's `runs_open` index.
Queries that look for runs to adopt spell it exactly so (the planner matches it as text)."""

_V2 = f"""
CREATE INDEX runs_open ON {{s}}.runs (run_id) WHERE {OPEN_RUNS};
"""
"""Schema 2: an index of the open top-level runs, so an adoption pass reads the runs it may
adopt, not every run the database ever held (finished runs stay, with released leases).
The inbox's `message_id` column and unique index are schema 1's."""

_MIGRATIONS: dict[int, str] = {1: _V1, 2: _V2}
"""Forward migrations: version -> the script that brings version - 1 to it (0: nothing)."""

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")


def check_schema_name(name: str) -> str:
    """A schema name safe to put in SQL and in a NOTIFY channel name.

    Raises:
        ValueError: Not lowercase letters, digits and underscores (at most 41, no leading digit).
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"schema must be lowercase letters, digits and '_' (at most 41), not {name!r}"
        )
    return name


def _incompatible(schema: str, message: str, **details: Any) -> SteerableError:
    return SteerableError(
        AgentError.of(
            ErrorCode.CHECKPOINT_INCOMPATIBLE,
            f"PostgreSQL schema {schema!r}: {message}",
            schema=schema,
            **details,
        )
    )


def migrate(conn: psycopg.Connection[Any], schema: str) -> int:
    """Create or migrate the schema in one transaction; returns the version found (0: new).

    Raises:
        SteerableError: `checkpoint_incompatible` for a newer schema, or a schema of the same
            name that holds another application's tables (nothing is changed).
    """
    with conn.transaction():
        # One migrator at a time per schema, across every host that starts now.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"steerable:{schema}",))
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema=%s",
                (schema,),
            )
        }
        if "meta" in tables:
            row = conn.execute(
                f"SELECT value FROM {schema}.meta WHERE key='schema_version'"
            ).fetchone()
            if row is None:
                raise _incompatible(schema, "no schema_version in its meta table", reason="foreign")
            found = int(row[0])
        elif tables:
            raise _incompatible(
                schema,
                "its tables are not steerable's; refusing to use it (nothing was changed)",
                reason="foreign",
            )
        else:
            found = 0
        if found > SCHEMA_VERSION:
            raise _incompatible(
                schema,
                f"written by a newer steerable (schema {found} > {SCHEMA_VERSION}); "
                "upgrade steerable to open it",
                schema_version=found,
                supported=SCHEMA_VERSION,
            )
        if found < SCHEMA_VERSION:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[version].format(s=schema).split(";"):
                    if statement.strip():
                        conn.execute(statement.encode())
            conn.execute(
                f"INSERT INTO {schema}.meta VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                (str(SCHEMA_VERSION),),
            )
    return found
