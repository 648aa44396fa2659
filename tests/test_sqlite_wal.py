"""SqliteStore's WAL checkpoint thread (`steerable-sqlite-wal`, actors/_stores/sqlite_wal.py).

The writer's commits never checkpoint; the thread does, when the writer signals it, on its own
connection; it lives exactly as long as the store, outlives a failing checkpoint, and keeps
the WAL bounded under a writer that never pauses (the WAL restarts after a checkpoint that the
thread finished under the write lock).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Runtime, SqliteStore
from steerable.actors._stores import sqlite_wal
from steerable.actors.testing import ScriptedAgent
from steerable.protocol import Finish, RunState

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.store_faults_kit import WAIT, until
    from tests.test_stores import message
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from store_faults_kit import WAIT, until
    from test_stores import message


def _wal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "steerable-sqlite-wal" and t.is_alive()]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    made = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    try:
        yield made
    finally:
        made.close()


def _wal_frames(path: Path) -> int:
    """Frames in the WAL now (a passive checkpoint on a connection of the test's own says)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        conn.close()
    return int(row[1])


def test_the_thread_lives_as_long_as_the_store(tmp_path: Path) -> None:
    before = len(_wal_threads())
    store = SqliteStore(tmp_path / "runs.db")
    assert len(_wal_threads()) == before + 1
    store.close()
    assert len(_wal_threads()) == before
    store.close()  # idempotent


def test_no_thread_is_left_after_the_runtime_shuts_down(tmp_path: Path) -> None:
    before = len(_wal_threads())
    store = SqliteStore(tmp_path / "runs.db")
    with Runtime(store=store) as rt:
        outcome = rt.start("t", agent=ScriptedAgent([Finish(output=1)])).result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
    store.close()
    assert len(_wal_threads()) == before


def test_the_writer_never_checkpoints_and_the_thread_does_every_few_commits(
    store: SqliteStore,
) -> None:
    assert store._writer_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    for seq in range(sqlite_wal.EVERY - 1):
        store.append_message("r", message(seq))
    assert store._wal.checkpoints == 0
    store.append_message("r", message(sqlite_wal.EVERY))  # the EVERY-th commit signals
    until(lambda: store._wal.checkpoints == 1, "checkpointed")
    assert _wal_frames(store.path) >= 0


def test_a_failing_checkpoint_is_tried_again_at_the_next_signal(store: SqliteStore) -> None:
    real = store._wal._connect
    calls: list[int] = []

    def flaky() -> sqlite3.Connection:
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("unable to open database file")
        return real()

    store._wal._connect = flaky
    store._wal.checkpoint_now()
    until(lambda: store._wal.failures == 1, "the failure counted")
    store._wal.checkpoint_now()
    until(lambda: store._wal.checkpoints == 1, "checkpointed after the failure")
    store.append_message("r", message(1))  # the writer never noticed
    assert store.statistics() == {"write_retries": 0, "writes_given_up": 0}


def test_a_wal_past_the_limit_is_checkpointed_under_the_write_lock_and_restarts(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_wal, "LIMIT", 10)
    monkeypatch.setattr(sqlite_wal, "EVERY", 1_000_000)  # checkpoints only when the test asks
    for seq in range(100):
        store.append_message("r", message(seq, "x" * 2000))
    real = store._wal._connect
    more = iter(range(100, 150))

    class Racing:
        """The thread's connection: the writer commits more while the first pass runs."""

        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn = conn
            self.passes = 0

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            cursor = self._conn.execute(sql, *args)
            self.passes += 1
            if self.passes == 1:
                for seq in more:  # frames past the ones this pass checkpointed
                    store.append_message("r", message(seq, "x" * 2000))
            return cursor

        def close(self) -> None:
            self._conn.close()

    racing: list[Racing] = []

    def connect() -> sqlite3.Connection:
        racing.append(Racing(real()))
        return racing[-1]  # type: ignore[return-value]

    store._wal._connect = connect
    store._wal.checkpoint_now()
    until(lambda: store._wal.checkpoints == 1, "checkpointed")
    assert store._wal.locked == 1
    assert racing[0].passes == 2
    store.append_message("r", message(150))  # the writer's next commit restarts the WAL
    assert _wal_frames(store.path) <= 5
