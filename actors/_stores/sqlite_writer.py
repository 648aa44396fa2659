"""`SqliteStore`'s writer thread: group commit, retries with backoff, fencing.

A mixin of `SqliteStore` (split from sqlite.py along its seam): the facade queues writes
(`append_message`, `journal`, `write_checkpoint`, `flush`, `close`); this part drains the
queue on the `steerable-sqlite` thread, commits each batch as one transaction and retries
transient failures for `write_timeout` seconds; the SQL of a batch (fencing, revisions on
their predecessor) is its base `SqliteApply`, sqlite_apply.py (docs/reliability.md, "Store
faults"; docs/durability.md, "Ownership").
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from typing import Any

from steerable.actors._engine.inline import handoff_to_workers
from steerable.actors._engine.log import get_logger
from steerable.protocol import AgentError, ErrorCode, SteerableError
from steerable.protocol._codec import encode, encode_body

from .events import EVENTS_WAKE
from .lease import message_fenced
from .sqlite_apply import _FENCED_OPS, _INBOX_INSERT, SqliteApply
from .sqlite_files import notify_failed, notify_stored, transient, unavailable
from .sqlite_rows import checksum
from .store import STATIC_KEYS, dynamic_part

__all__ = ["SqliteWriter", "WriteQueue"]

_log = get_logger("steerable.sqlite")

_STOP = object()
_ATTEMPT_BUSY = 1.0  # seconds one attempt waits for a lock; retries go on to `write_timeout`
_PROBE = 0.25  # seconds of retrying a store whose last write was given up gets
_FIRST_BACKOFF = 0.01
_MAX_BACKOFF = 0.5


class WriteQueue(queue.SimpleQueue[Any]):
    """The writer's queue, counting what was put and what the writer is done with, so that
    a flush with nothing queued returns at once (a fresh process's `load`, W4)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._put = 0
        self._done = 0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        with self._lock:  # counted before it can be taken
            self._put += 1
        super().put(item, block, timeout)

    def done(self, count: int) -> None:
        """The writer thread is done with `count` items (committed, refused or given up)."""
        with self._lock:
            self._done += count

    def idle(self) -> bool:
        """Whether every item put so far is done."""
        with self._lock:
            return self._done >= self._put


class SqliteWriter(SqliteApply):
    """The writer thread's side of `SqliteStore` (which opens the connection and queues)."""

    def _write_loop(self) -> None:
        conn = self._writer_conn
        try:
            while True:
                # Stored events ride with the commits of the next EVENT_DELAY at most, then
                # go in one batch: encoding and writing them per step would hold every
                # checkpoint's commit back (docs/benchmarks.md W1).
                due = self._events_due()
                try:
                    if due is None:
                        item = self._queue.get()
                    else:
                        item = self._queue.get(timeout=max(0.0, due - time.monotonic()))
                except queue.Empty:
                    item = None  # the waiting events are due
                taken = 0 if item is None else 1
                if item is _STOP:
                    self._commit_events(conn, force=True)
                    return
                batch = [] if item is None or item is EVENTS_WAKE else [item]
                stop = False
                while len(batch) < self._max_batch:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                        break
                    taken += 1
                    if more is not EVENTS_WAKE:
                        batch.append(more)
                # A flush (close, a read of events) wants every event written before it returns.
                force = stop or any(op[0] == "flush" and op[1] for op, _, _ in batch)
                batch.extend(self._take_events(force))
                if batch:
                    self._commit(conn, batch)
                self._queue.done(taken)
                if stop:
                    self._commit_events(conn, force=True)
                    return
        finally:
            with self._write_lock:
                conn.close()
                self._conn_closed = True

    def _commit_events(self, conn: sqlite3.Connection, *, force: bool) -> None:
        """Commit the events still waiting (at the writer's stop)."""
        events = self._take_events(force)
        if events:
            self._commit(conn, events)

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[Any, Any, Any]]) -> None:
        refused: dict[int, SteerableError] = {}
        error = self._transact(conn, batch, refused)
        fenced, self._fenced_now = self._fenced_now, set()
        # The runs told here are handled by an idle worker, never on this thread: a handler
        # may flush, i.e. wait for this very thread.
        with handoff_to_workers():
            for index, (op, done, failed) in enumerate(batch):
                why = error if error is not None else refused.get(index)
                if why is None:
                    if op[0] not in _FENCED_OPS or op[1] not in fenced:
                        notify_stored(done)  # a refused (fenced) write is never said stored
                else:
                    notify_failed(done, failed, why)
        if fenced and error is None:
            self._fenced(fenced)

    def _transact(
        self,
        conn: sqlite3.Connection,
        batch: list[tuple[Any, Any, Any]],
        refused: dict[int, SteerableError],
    ) -> SteerableError | None:
        """Commit `batch` as one transaction, retrying transient failures with backoff.

        Returns None once committed, else the error every write of the batch gets.
        """
        budget = self._write_timeout
        if self._given_up is not None or self._closing.is_set():
            budget = min(budget, _PROBE)  # a failing store answers promptly
        started = time.monotonic()
        deadline = started + budget
        backoff = _FIRST_BACKOFF
        attempt = 0
        # Encoded once, before the transaction (and not again on a retry): a value the codec
        # refuses (the entry points check with the same rules, so this is a last line) refuses
        # that write alone, and the transaction holds the file's write lock only for SQL.
        try:
            prepared = [self._prepare(op, i, refused) for i, (op, _, _) in enumerate(batch)]
        except Exception as exc:  # noqa: BLE001 - reported to every waiter, and logged
            return self._writer_failed(exc)
        if all(op is None or op[0] == "flush" for op in prepared):
            return None  # nothing to write (a flush waits only for what was queued before it)
        refusals = dict(refused)
        savepoints = False  # each write in its own savepoint, after an unforeseen ValueError
        while True:
            attempt += 1
            refused.clear()
            refused.update(refusals)
            self._static_added.clear()
            try:
                with self._write_lock:
                    # IMMEDIATE: the fence check reads the lease and the write follows in the
                    # same transaction; a deferred one could not upgrade after another
                    # process's claim.
                    conn.execute("BEGIN IMMEDIATE")
                    checked: dict[str, bool] = {}
                    if savepoints:
                        for index, op in enumerate(prepared):
                            why = None if op is None else self._apply_one(conn, op, checked)
                            if why is not None:
                                refused[index] = why
                    else:
                        self._apply_batch(conn, prepared, checked, refused)
                    conn.execute("COMMIT")
                    self._wal.committed()
                self._fenced_now = {run_id for run_id, ok in checked.items() if not ok}
            except BaseException as exc:  # noqa: BLE001 - reported to every waiter, and logged
                with self._write_lock:
                    self._rollback(conn)
                if isinstance(exc, ValueError) and not savepoints:
                    savepoints = True  # the same attempt again, write by write
                    attempt -= 1
                    continue
                if not isinstance(exc, sqlite3.Error):
                    return self._writer_failed(exc)
                now = time.monotonic()
                if transient(exc) and now < deadline and not self._closing.is_set():
                    self._retries += 1
                    _log.warning(
                        "sqlite_write_retry", path=str(self.path), attempt=attempt, error=str(exc)
                    )
                    # Backoff that close() cuts short: a closing store tries once more, then
                    # gives up (no 30 s shutdown behind a full disk or a lock).
                    self._closing.wait(min(backoff, deadline - now))
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                return self._give_up(exc, attempt, round(now - started, 3))
            self._given_up = None
            return None

    def _give_up(self, exc: sqlite3.Error, attempt: int, seconds: float) -> SteerableError:
        self._given_up = exc
        self._gave_up += 1
        _log.error(
            "sqlite_write_given_up",
            path=str(self.path),
            attempts=attempt,
            seconds=seconds,
            error=str(exc),
        )
        return unavailable(
            f"storing in {self.path} failed ({exc}); given up after {attempt} "
            f"attempts in {seconds}s",
            exc,
            path=str(self.path),
            attempts=attempt,
            transient=transient(exc),
        )

    def _prepare(
        self, op: tuple[Any, ...], index: int, refused: dict[int, SteerableError]
    ) -> tuple[Any, ...] | None:
        """`op` with its blobs encoded (a checkpoint's), or None if the codec refuses it."""
        if op[0] != "checkpoint":
            return op
        _, run_id, revision, snapshot, entries_from, entries = op
        try:
            dynamic = encode_body("snapshot", dynamic_part(snapshot))
            rows = []
            for i, entry in enumerate(entries):
                blob = encode(entry, kind="entry")
                rows.append((run_id, entries_from + i, blob, checksum(blob)))
            static = None
            if run_id not in self._static_written:
                static = encode_body("snapshot", {key: snapshot[key] for key in STATIC_KEYS})
        except ValueError as exc:
            refused[index] = self._codec_refused("checkpoint", exc)
            return None
        return ("checkpoint", run_id, revision, snapshot, entries_from, rows, dynamic, static)

    def _writer_failed(self, exc: BaseException) -> SteerableError:
        _log.error("sqlite_commit_failed", path=str(self.path), exc_info=True)
        self._failed = exc
        return SteerableError(AgentError.of(ErrorCode.INTERNAL_ERROR, f"storing failed: {exc!r}"))

    def _store_now(self, run_id: str, seq: int, blob: bytes, message_id: str | None) -> bool:
        """Commit one inbox row on the calling thread, on the writer's connection.

        A host message waits for its commit anyway: writing it here saves the two thread
        switches of the writer's queue (W9). False if the write failed (nothing stored): the
        caller queues it, and the writer retries it or gives it up as any write.

        Raises:
            SteerableError: `run_ended` if the store is closed.
        """
        with self._held_lock:
            held = self._held.get(run_id)
        row = (run_id, seq, blob, checksum(blob), message_id)
        with self._write_lock:
            if self._conn_closed:
                raise SteerableError(AgentError.of(ErrorCode.RUN_ENDED, "the store is closed"))
            conn = self._writer_conn
            if conn.in_transaction:
                return False  # a failed transaction is still open: its INSERT would not commit
            try:
                # One statement in autocommit mode: its own transaction, committed on return.
                if held is None:
                    conn.execute(_INBOX_INSERT + "VALUES (?,?,?,?,?)", row)
                else:
                    # Fenced as every write of a run this store object holds: a zombie that
                    # lost the lease must not store (or replace) a message at a seq the new
                    # owner assigns.
                    owner, epoch = held
                    cur = conn.execute(
                        _INBOX_INSERT + "SELECT ?,?,?,?,? WHERE EXISTS (SELECT 1 FROM leases "
                        "WHERE run_id=? AND owner=? AND epoch=?) OR (?=1 AND NOT EXISTS "
                        "(SELECT 1 FROM leases WHERE run_id=?))",
                        (*row, run_id, owner.instance_id, epoch, epoch, run_id),
                    )
                    if cur.rowcount == 0:
                        self._fenced([run_id])
                        raise message_fenced(run_id, epoch)
            except sqlite3.Error:
                return False  # nothing stored: the statement's transaction is rolled back
            self._wal.committed()
        return True

    def _rollback(self, conn: sqlite3.Connection) -> None:
        for run_id in self._static_added:
            self._static_written.discard(run_id)
        self._static_added.clear()
        self._entries_len.clear()  # what the transaction wrote is gone: what is known too
        self._journal_empty.clear()
        self._runs_rev.clear()
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:  # the transaction is gone with the failure
                _log.warning("sqlite_rollback_failed", path=str(self.path), exc_info=True)
