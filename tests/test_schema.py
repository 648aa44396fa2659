"""The SQLite schema: recognised, migrated in place, newer refused, foreign files left untouched.

`tests/fixtures/schema/v1.db` was written by steerable before ownership (schema 1, no
application id; `make_v1.py` beside it shows how). Issue 18 item 6: opening a file that is not
a steerable database changes nothing in it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from steerable.actors import Runtime, SqliteStore
from steerable.actors._cli import main as cli_main
from steerable.actors._stores.schema import APPLICATION_ID, SCHEMA_VERSION
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import ErrorCode, RunState, SteerableError, UserMessage

FIXTURE = Path(__file__).parent / "fixtures" / "schema" / "v1.db"
FINISHED = "run_01M8T7BC3QG6Z9ESFYCFC1GVVN"
WAITING = "run_01M8T7BC3T5V49326NYJHHVRF9"
MIDWAY = "run_01M8T7BC45PD4F5WTBDQFEYZ7R"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_a_schema_1_database_is_migrated_in_place_and_keeps_every_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    shutil.copy(FIXTURE, path)
    store = SqliteStore(path)
    try:
        assert {r.run_id: r.state for r in store.runs()} == {
            FINISHED: RunState.FINISHED,
            WAITING: RunState.WAITING,
            MIDWAY: RunState.RUNNING,
        }
        waiting = store.load(WAITING)
        queued = [*waiting.snapshot.pending_messages, *waiting.messages]
        assert [m.content for m in queued if isinstance(m, UserMessage)] == ["a queued note"]
        assert list(store.load(MIDWAY).journal)  # the finished call's result survived
        assert store.load(FINISHED).snapshot.output == "done"
        assert store.lease(MIDWAY) is None  # never claimed: an orphan for whoever resumes it
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
    conn.close()
    # Migrated once: opening again changes nothing more, and the run resumes from it.
    with Runtime(store=SqliteStore(path), agents={}) as rt:
        assert sorted(rt.unfinished()) == [WAITING, MIDWAY]
        outcome = rt.resume(FINISHED, agent=ScriptedAgent(name="a1")).result(5.0)
        assert outcome.state is RunState.FINISHED


def test_a_newer_schema_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    shutil.copy(FIXTURE, path)
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.close()
    before = digest(path)
    with pytest.raises(SteerableError) as info:
        SqliteStore(path)
    assert info.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
    assert "99" in info.value.error.message
    assert str(path) in info.value.error.message
    assert digest(path) == before


def foreign_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, note TEXT)")
    conn.execute("INSERT INTO runs (note) VALUES ('mine')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (foreign_db, ErrorCode.CHECKPOINT_INCOMPATIBLE),
        (lambda p: p.write_bytes(os.urandom(4096)), ErrorCode.CHECKPOINT_CORRUPT),
        (lambda p: p.write_bytes(b"SQLite format 3\x00" + os.urandom(4080)), None),
        # Byte 19 (read version 2) says WAL: SQLite makes -wal and -shm on a read-only open (it
        # did so at random above, 1 time in 256).
        (lambda p: p.write_bytes(b"SQLite format 3\x00\x10\x00\x02\x02" + os.urandom(4076)), None),
    ],
    ids=[
        "another-apps-database",
        "random-bytes",
        "sqlite-header-then-garbage",
        "wal-header-then-garbage",
    ],
)
def test_a_file_that_is_not_steerables_is_refused_and_not_modified(
    tmp_path: Path, make: object, code: ErrorCode | None
) -> None:
    path = tmp_path / "notes.db"
    make(path)  # type: ignore[operator]
    before, files = digest(path), siblings(path)
    with pytest.raises(SteerableError) as info:
        SqliteStore(path)
    if code is not None:
        assert info.value.code is code
    else:
        assert info.value.code in {ErrorCode.CHECKPOINT_CORRUPT, ErrorCode.CHECKPOINT_INCOMPATIBLE}
    assert str(path) in info.value.error.message
    assert digest(path) == before
    assert siblings(path) == files  # no -wal, no -shm: not switched to WAL


def test_another_applications_database_with_a_custom_application_id_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id=1234")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(SteerableError) as info:
        SqliteStore(path)
    assert info.value.code is ErrorCode.CHECKPOINT_INCOMPATIBLE
    assert digest(path) == before


def test_create_false_refuses_a_missing_database_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "runs.db"
    with pytest.raises(SteerableError) as info:
        SqliteStore(path, create=False)
    assert info.value.code is ErrorCode.NOT_FOUND
    assert str(path) in info.value.error.message
    assert not path.parent.exists()


@pytest.mark.parametrize("kind", ["foreign", "random", "missing-dir"])
def test_the_cli_reports_a_bad_database_without_a_traceback_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "notes.db"
    if kind == "foreign":
        foreign_db(path)
    elif kind == "random":
        path.write_bytes(os.urandom(2048))
    else:
        path = tmp_path / "nowhere" / "runs.db"
    before = digest(path) if path.exists() else None
    code = cli_main(["runs", "--db", str(path)])
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in out + err
    assert str(path) in err
    if before is not None:
        assert digest(path) == before
        assert siblings(path) == ["notes.db"]
    else:
        assert not path.parent.exists()
