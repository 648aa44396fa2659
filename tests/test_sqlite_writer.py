"""SqliteStore's writer (W1, W9): fewer statements per batch, host messages committed on the
sender's thread, and a flush with nothing queued that returns at once.

What a batch may leave out is only what could not change the database: a journal row the same
batch's checkpoint clears, a DELETE of entries or journal rows known (under the run's lease) not
to exist. Everything else (fencing, the no-hole rule, refusals) is as before: tests/test_stores.py
and tests/test_store_faults.py hold it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import SqliteStore
from steerable.actors._stores.events import EventRecord
from steerable.actors._stores.lease import Owner
from steerable.protocol import AgentError, EventKind, Phase, SystemNote, ToolResult

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.store_faults_kit import WAIT, Locker, retrying, until
    from tests.test_stores import message, notes, snapshot
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from store_faults_kit import WAIT, Locker, retrying, until
    from test_stores import message, notes, snapshot


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    made = SqliteStore(tmp_path / "runs.db", write_timeout=WAIT)
    try:
        yield made
    finally:
        made.close()


def _result(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, tool="t", ok=True, value="v")


class Batch:
    """Queue writes so that the writer commits them as one batch, recording its statements."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.statements: list[str] = []

    def __enter__(self) -> Batch:
        store = self.store
        store._write_lock.acquire()  # the writer blocks on it with a flush in hand ...
        done: Future[None] = Future()
        store._queue.put((("flush", True), done, None))
        until(store._queue.empty, "the writer took the flush")
        store._writer_conn.set_trace_callback(self.statements.append)
        return self  # ... while the batch's writes are queued behind it

    def __exit__(self, *exc: object) -> None:
        self.store._write_lock.release()
        assert self.store.flush(WAIT)
        self.store._writer_conn.set_trace_callback(None)

    def verbs(self) -> list[str]:
        return [" ".join(sql.split()[:3]) for sql in self.statements]


def _event(seq: int, **data: Any) -> EventRecord:
    return (seq, EventKind.STATE_CHANGED, Phase.REASON, 1000.0 + seq, data, "r", None)


def _held(store: SqliteStore, run_id: str) -> None:
    """Make `run_id` a run this store object writes for (a runtime's new run: epoch 1)."""
    store.register_new(run_id, Owner.new(), 30.0)


def test_a_result_and_the_boundary_that_clears_it_share_a_batch_without_a_journal_row(
    store: SqliteStore,
) -> None:
    _held(store, "r")
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=1), 0, notes("r", 0, 1))
    store.write_checkpoint("r", 1, snapshot("r", 1, transcript_len=2), 1, notes("r", 1, 1))
    assert store.flush(WAIT)
    with Batch(store) as batch:  # one W1 iteration: decision, result, the boundary after it
        plan = ["c2.0"]
        store.write_checkpoint(
            "r", 2, snapshot("r", 2, transcript_len=3, plan=plan), 2, notes("r", 2, 1)
        )
        store.journal("r", _result("c2.0"))
        store.write_checkpoint("r", 3, snapshot("r", 3, transcript_len=4), 3, notes("r", 3, 1))
    assert batch.verbs() == [
        "BEGIN IMMEDIATE",
        "SELECT owner, epoch",  # the fence, once per run and batch
        "INSERT OR REPLACE",  # revision 2 } one executemany
        "INSERT OR REPLACE",  # revision 3 }
        "INSERT INTO entries",  # } one executemany
        "INSERT INTO entries",  # }
        "UPDATE runs SET",  # once, to revision 3: the row is known to hold revision 1
        "COMMIT",
    ]  # no savepoint, no journal row written then deleted, no DELETE of rows known absent
    loaded = store.load("r")
    assert loaded.snapshot.revision == 3
    assert [e.text for e in loaded.transcript if isinstance(e, SystemNote)] == [
        f"r/{i}" for i in range(4)
    ]
    assert loaded.journal == {}


def test_a_batchs_event_batches_of_one_run_are_written_together_in_their_order(
    store: SqliteStore,
) -> None:
    _held(store, "r")
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
    assert store.flush(WAIT)
    store.event_retention = 3
    with Batch(store) as batch:
        store.append_events("r", "t" * 32, [_event(0), _event(1), _event(2)])
        store.append_events("r", "t" * 32, [_event(3), _event(1, step=10)])  # seq 1 again
        store.append_events("r", "t" * 32, [_event(4)])
    assert batch.verbs().count("INSERT OR REPLACE") == 6  # every row, in order
    assert batch.verbs().count("DELETE FROM events") == 1  # one trim, from the highest last
    assert [(e.seq, e.data) for e in store.events("r")] == [(2, {}), (3, {}), (4, {})]


def test_a_rewrite_in_the_batch_of_a_deferred_checkpoint_deletes_after_its_rows(
    store: SqliteStore,
) -> None:
    _held(store, "r")
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=2), 0, notes("r", 0, 2))
    assert store.flush(WAIT)
    with Batch(store) as batch:
        store.write_checkpoint("r", 1, snapshot("r", 1, transcript_len=4), 2, notes("r", 2, 2))
        # Revision 2 rewrites from entry 3: entry 3 of revision 1 goes, in the same batch.
        store.write_checkpoint(
            "r", 2, snapshot("r", 2, transcript_len=4), 3, [SystemNote(text="x")]
        )
    verbs = batch.verbs()
    assert verbs.index("DELETE FROM entries") > verbs.index("INSERT INTO entries")
    loaded = store.load("r")
    assert loaded.snapshot.revision == 2
    assert [e.text for e in loaded.transcript if isinstance(e, SystemNote)] == [
        "r/0",
        "r/1",
        "r/2",
        "x",
    ]


def test_a_revision_after_a_refused_one_in_the_same_batch_is_refused_too(
    store: SqliteStore,
) -> None:
    _held(store, "r")
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=1), 0, notes("r", 0, 1))
    assert store.flush(WAIT)
    failed: list[AgentError] = []
    with Batch(store):
        store.write_checkpoint("r", 1, snapshot("r", 1, transcript_len=2), 1, notes("r", 1, 1))
        # A hole (revision 3 on top of 1): refused, and so is 4 on top of the refused 3.
        store.write_checkpoint(
            "r", 3, snapshot("r", 3, transcript_len=3), 2, notes("r", 2, 1), on_failed=failed.append
        )
        store.write_checkpoint(
            "r", 4, snapshot("r", 4, transcript_len=4), 3, notes("r", 3, 1), on_failed=failed.append
        )
    assert [e.code.value for e in failed] == ["store_unavailable", "store_unavailable"]
    loaded = store.load("r")
    assert loaded.snapshot.revision == 1
    assert [e.text for e in loaded.transcript if isinstance(e, SystemNote)] == ["r/0", "r/1"]


def test_a_journal_row_stays_when_the_checkpoint_after_it_is_refused(store: SqliteStore) -> None:
    _held(store, "r")
    store.write_checkpoint(
        "r", 0, snapshot("r", 0, transcript_len=1, plan=["c1.0"]), 0, notes("r", 0, 1)
    )
    assert store.flush(WAIT)
    failed: list[AgentError] = []
    with Batch(store):
        store.journal("r", _result("c1.0"))
        # Revision 5 on top of revision 0: a hole, refused; the journal row must be kept.
        store.write_checkpoint(
            "r", 5, snapshot("r", 5, transcript_len=1), 1, [], on_failed=failed.append
        )
    assert [e.code.value for e in failed] == ["store_unavailable"]
    loaded = store.load("r")
    assert loaded.snapshot.revision == 0
    assert list(loaded.journal) == ["c1.0"]


def test_known_absent_rows_are_deleted_again_once_they_may_exist(store: SqliteStore) -> None:
    _held(store, "r")
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=3), 0, notes("r", 0, 3))
    store.journal("r", _result("c1.0"))  # after the journal was cleared: it holds a row again
    assert store.flush(WAIT)
    # A rewrite from entry 1 (a resumed run rewrites from its length): entries 1, 2 go.
    store.write_checkpoint("r", 1, snapshot("r", 1, transcript_len=2), 1, [SystemNote(text="x")])
    loaded = store.load("r")
    assert [e.text for e in loaded.transcript if isinstance(e, SystemNote)] == ["r/0", "x"]
    assert loaded.journal == {}


def test_a_host_message_is_committed_on_the_senders_thread(store: SqliteStore) -> None:
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
    assert store.flush(WAIT)
    threads: list[str] = []

    def trace(sql: str) -> None:
        if "INTO inbox" in sql:
            threads.append(threading.current_thread().name)

    store._writer_conn.set_trace_callback(trace)
    store.append_message("r", message(0))
    store._writer_conn.set_trace_callback(None)
    assert threads == [threading.current_thread().name]
    assert [m.seq for m in store.load("r").messages] == [0]


def test_a_host_message_the_file_lock_holds_back_is_retried_by_the_writer(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    store = SqliteStore(path, write_timeout=WAIT)
    locker = Locker(path)
    try:
        store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        assert store.flush(WAIT)
        locker.hold()
        returned = threading.Event()

        def send() -> None:
            store.append_message("r", message(0))
            returned.set()

        sender = threading.Thread(target=send)
        sender.start()
        until(retrying(store), "the writer retried the message")  # the direct try gave way
        locker.release()
        sender.join(WAIT)
        assert returned.is_set()
        assert [m.seq for m in store.load("r").messages] == [0]
    finally:
        locker.release()
        store.close()


def test_a_flush_with_nothing_queued_does_not_wait_for_the_writer(store: SqliteStore) -> None:
    assert store._queue.idle()
    store._write_lock.acquire()
    try:
        assert store.flush(0.0)  # a fresh process's load: nothing queued, nothing to wait for
        store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=0), 0, [])
        assert not store._queue.idle()
        assert not store.flush(0.05)  # something is queued: it waits for it
    finally:
        store._write_lock.release()
    assert store.flush(WAIT)
    assert store._queue.idle()


def test_the_change_counter_moves_for_another_connections_commit_not_the_stores_own(
    store: SqliteStore,
) -> None:
    # The wake thread reads it every 5 ms (actors/_host/remote.py): the store's own
    # checkpoints must not count, or every look takes pending operations for nothing.
    before = store.change_counter()
    store.write_checkpoint("r", 0, snapshot("r", 0, transcript_len=1), 0, notes("r", 0, 1))
    store.append_message("r", message(0))  # committed on this thread, on the writer's connection
    assert store.flush(WAIT)
    assert store.change_counter() == before
    other = SqliteStore(store.path)  # another process's store, as far as the file can tell
    try:
        other.append_message("r", message(1))
    finally:
        other.close()
    moved = store.change_counter()
    assert moved != before
    with store._write_lock:  # a transaction holds the writer's connection: another answers
        assert store.change_counter() != moved
    assert store.change_counter() != before
