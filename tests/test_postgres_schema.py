"""PostgresStore's schema versions and what schema 2 adds: a schema-1 database (built by the
released DDL, holding runs) migrates forward with nothing lost, a newer one is refused, and
the inbox keeps each send's `message_id` (a retried send is one message across store objects,
processes and restarts).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest

from steerable.actors import Runtime
from steerable.actors._stores.lease import Owner
from steerable.actors._stores.postgres_schema import _MIGRATIONS, OPEN_RUNS, SCHEMA_VERSION
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import AskUser, ErrorCode, RunState, SteerableError

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.pg_kit import admin, drop_schema, new_schema, pg_store, require_dsn
    from tests.test_stores import message, snapshot, texts, write_revisions
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from pg_kit import admin, drop_schema, new_schema, pg_store, require_dsn
    from test_stores import message, snapshot, texts, write_revisions

WAIT = 30.0  # fail-instead-of-hang bound

RELEASED_V1 = "e3b2fa2d5609b9f3d05eed0f5b09b3f8c281a46d85f6667a5a057891ad0d1060"
"""sha256 of schema 1's DDL as released: a shipped migration never changes."""

_TABLES = ("runs", "revisions", "entries", "inbox", "journal", "leases", "events", "remote_ops")


def _schema_1(name: str, rows_from: str | None = None) -> None:
    """A schema-1 database, as the released DDL made it (with `rows_from`'s rows)."""
    admin(f"CREATE SCHEMA {name}")
    for statement in _MIGRATIONS[1].format(s=name).split(";"):
        if statement.strip():
            admin(statement)
    admin(f"INSERT INTO {name}.meta VALUES ('schema_version', '1')")
    if rows_from is not None:
        for table in _TABLES:
            admin(f"INSERT INTO {name}.{table} SELECT * FROM {rows_from}.{table}")


def _indexes(schema: str) -> set[str]:
    return {r[0] for r in admin("SELECT indexname FROM pg_indexes WHERE schemaname=%s", (schema,))}


def test_schema_1_ddl_is_the_released_one() -> None:
    assert SCHEMA_VERSION == 2
    assert hashlib.sha256(_MIGRATIONS[1].encode()).hexdigest() == RELEASED_V1


def test_the_open_runs_predicate_names_every_terminal_state() -> None:
    terminal = [s.value for s in RunState if s.is_terminal]
    assert (
        "parent_run_id IS NULL AND state NOT IN (" + ", ".join(f"'{t}'" for t in terminal) + ")"
    ) == OPEN_RUNS


def test_a_schema_1_database_migrates_to_2_with_nothing_lost(pg_schema: str) -> None:
    source = new_schema()
    try:
        writer = pg_store(source)
        write_revisions(writer, "r", 4)
        writer.write_checkpoint("open", 0, snapshot("open", 0, transcript_len=0), 0, [])
        writer.append_message("r", message(0), message_id="req-1")
        writer.close()
        _schema_1(pg_schema, rows_from=source)
    finally:
        drop_schema(source)
    assert "runs_open" not in _indexes(pg_schema)

    store = pg_store(pg_schema)  # migrates
    try:
        assert admin(f"SELECT value FROM {pg_schema}.meta WHERE key='schema_version'") == [
            (str(SCHEMA_VERSION),)
        ]
        assert "runs_open" in _indexes(pg_schema)
        loaded = store.load("r")
        assert loaded.snapshot.revision == 3
        assert texts(loaded.transcript) == [f"r/{i}" for i in range(8)]
        assert loaded.messages == [message(0)]
        assert store.message_seq("r", "req-1") == 0
        assert [r.revision for r in store.revisions("r")] == [0, 1, 2, 3]
        # The adoption pass reads the open runs through the new index.
        taken, left = store.claim_orphans(Owner("me", "host", 1), 5.0, {"a"})
        assert {lease.run_id for lease in taken} | {run for run, _ in left} == {"open", "r"}
    finally:
        store.close()
    pg_store(pg_schema).close()  # a migrated schema opens as it is


def test_an_empty_schema_1_migrates_and_the_planner_uses_the_index(pg_schema: str) -> None:
    _schema_1(pg_schema)
    pg_store(pg_schema).close()
    import psycopg

    # Not a measure of speed: that the index's predicate is the one the adoption pass spells
    # (on an empty table the planner would rather scan; told not to, it must find the index).
    with psycopg.connect(require_dsn(), autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            f"EXPLAIN SELECT run_id FROM {pg_schema}.runs WHERE {OPEN_RUNS}".encode()
        ).fetchall()
    assert any("runs_open" in line[0] for line in plan), plan


def test_a_newer_schema_is_refused_with_checkpoint_incompatible(pg_schema: str) -> None:
    pg_store(pg_schema).close()
    admin(
        f"UPDATE {pg_schema}.meta SET value=%s WHERE key='schema_version'",
        (str(SCHEMA_VERSION + 1),),
    )
    with pytest.raises(SteerableError) as caught:
        pg_store(pg_schema)
    assert caught.value.error.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
    assert caught.value.error.details["schema_version"] == SCHEMA_VERSION + 1
    assert _indexes(pg_schema) >= {"runs_open"}  # nothing was changed


# --------------------------------------------------------------------------- message ids


def test_a_message_id_is_kept_with_its_message_across_store_objects(pg_schema: str) -> None:
    first = pg_store(pg_schema)
    try:
        first.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        first.append_message("r", message(0, "hello"), message_id="req-1")
        first.append_message("r", message(1, "again"), message_id="req-1")  # a retry: dropped
        first.append_message("r", message(2, "other"))
        assert first.message_seq("r", "req-1") == 0
        assert first.message_seq("r", "req-2") is None
        assert first.message_seq("elsewhere", "req-1") is None
    finally:
        first.close()
    second = pg_store(pg_schema)  # another process, or this one after a restart
    try:
        assert second.message_seq("r", "req-1") == 0
        assert [getattr(m, "content", None) for m in second.load("r").messages] == [
            "hello",
            "other",
        ]
        # The operation path (a run another host owns, or none) finds the same id.
        assert second.submit_op("r", message(0, "hello"), "req-1") == (0, 0)
    finally:
        second.close()


def _always_asking() -> ScriptedAgent:
    return ScriptedAgent([], then=lambda view: AskUser(question="more?"), name="asker")


def test_a_retried_send_to_a_resumed_run_returns_the_first_seq(pg_schema: str) -> None:
    with Runtime(store=pg_store(pg_schema)) as rt:
        handle = rt.start("t", agent=_always_asking())
        run_id = handle.run_id
        first = handle.send("hello", message_id="req-1")
        assert handle.send("hello", message_id="req-1") == first
    # That host is gone (its shutdown parked the run); another resumes it from the database
    # and knows nothing of req-1 but what the inbox row says.
    with Runtime(store=pg_store(pg_schema)) as rt:
        handle = rt.resume(run_id, agent=_always_asking())
        assert handle.send("hello", message_id="req-1") == first  # not a second message
        assert rt.store.message_seq(run_id, "req-1") == first
        handle.cancel()
        handle.result(WAIT)
    assert admin(
        f"SELECT seq FROM {pg_schema}.inbox WHERE run_id=%s AND message_id IS NOT NULL", (run_id,)
    ) == [(first,)]
