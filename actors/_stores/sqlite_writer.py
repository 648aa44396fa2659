"""`SqliteStore`'s writer thread: group commit, retries with backoff, fencing.

A mixin of `SqliteStore` (split from sqlite.py along its seam): the facade queues writes
(`append_message`, `journal`, `write_checkpoint`, `flush`, `close`); this part drains the
queue on the `steerable-sqlite` thread, commits each batch as one transaction and retries
transient failures for `write_timeout` seconds; the SQL of a batch (fencing, revisions on
their predecessor) is its base `SqliteApply`, sqlite_apply.py (docs/reliability.md, "Store
faults"; docs/durability.md, "Ownership").
"""

from __future__ import annotations

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
from .sqlite_files import full_disk, notify_failed, notify_stored, transient, unavailable
from .sqlite_queue import WriteQueue
from .sqlite_rows import bound_blob, checksum
from .store import STATIC_KEYS, dynamic_part

__all__ = ["SqliteWriter"]

_log = get_logger("steerable.sqlite")

_STOP = object()
_ATTEMPT_BUSY = 1.0  # seconds one attempt waits for a lock; retries go on to `write_timeout`
_PROBE = 0.25  # seconds of retrying a store whose last write was given up gets
_FIRST_BACKOFF = 0.01
_MAX_BACKOFF = 0.5
_POLL = 0.005
"""Seconds between the writer's looks at lazily queued writes (`WriteQueue.put_lazy`): the
most a write nobody waits for waits for a commit while writes keep coming."""
_ACTIVE = 1.0  # seconds without a put after which the writer stops polling


class _NotDone:
    """`_transact` while helping: nothing was done, the writer thread does it."""


_NOT_DONE = _NotDone()


class SqliteWriter(SqliteApply):
    """The writer thread's side of `SqliteStore` (which opens the connection and queues)."""

    def _init_commits(self, busy_ms: int) -> None:
        self._commit_lock = threading.Lock()
        """Held to take writes off the queue and commit them: by the writer thread, or by a
        pool worker whose run waits for them (`commit_now`), so they commit in order."""
        self._busy_ms = busy_ms  # the writer connection's busy wait, restored after a help
        self._puts_seen = 0  # the writer's: the queue's put count at its last wait
        self._put_at = 0.0  # the writer's: when it last saw that count change

    def _write_loop(self) -> None:
        conn = self._writer_conn
        queue_ = self._queue
        try:
            while True:
                self._wait(queue_)
                while True:
                    with self._commit_lock:
                        taken, stop = self._drain(conn)
                    if stop:
                        return
                    if taken < self._max_batch:
                        break  # else more is queued: the next batch at once
        finally:
            with self._write_lock:
                conn.close()
                self._conn_closed = True

    def _wait(self, queue_: WriteQueue) -> None:
        """Wait for a ring, the next poll, or the stored events' window, whichever is first.

        While writes keep coming (one in the last `_ACTIVE` seconds) the writer looks every
        `_POLL` seconds for writes queued lazily; otherwise it dozes until rung, and a lazy
        put rings it (`WriteQueue.put_lazy`).
        """
        now = time.monotonic()
        puts = queue_._put
        if puts != self._puts_seen:
            self._puts_seen = puts
            self._put_at = now
        # Stored events ride with the commits of the next EVENT_DELAY at most, then go in one
        # batch: encoding and writing them per step would hold every checkpoint's commit back
        # (docs/benchmarks.md W1).
        due = self._events_due()
        timeout = None if due is None else max(0.0, due - now)
        if now - self._put_at < _ACTIVE:
            timeout = _POLL if timeout is None else min(timeout, _POLL)
        else:
            queue_.dozing = True
            if not queue_.empty():  # a lazy put that read `dozing` before it was set
                queue_.dozing = False
                return
        queue_.wait(timeout)
        queue_.dozing = False

    def _drain(self, conn: sqlite3.Connection) -> tuple[int, bool]:
        """Take the next batch off the queue and commit it (the commit lock held).

        Returns how many items were taken, and whether the writer is to stop.
        """
        items = self._queue.take(self._max_batch)
        batch = []
        stop = False
        for index, item in enumerate(items):
            if item is _STOP:
                stop = True
                del items[index:]  # what follows a stop is never written, as before
                break
            if item is not EVENTS_WAKE:
                batch.append(item)
        # A flush (close, a read of events) wants every event written before it returns.
        force = stop or any(op[0] == "flush" and op[1] for op, _, _ in batch)
        batch.extend(self._take_events(force))
        if batch:
            self._commit(conn, batch)
        self._queue.done(len(items))
        if stop:
            self._commit_events(conn, force=True)
        return len(items), stop

    def commit_now(self, run_id: str) -> bool:
        """Commit what is queued on the calling thread, if it is all `run_id`'s and that needs
        no waiting.

        For a run that waits for its own checkpoint on a pool worker (it may block there for
        a commit, never on a dispatcher): it commits its writes itself instead of waking the
        writer and sleeping until the writer wakes it (two cross-thread wakes per W1
        iteration; docs/decisions/0004-waiting-run-commits.md). Other runs' writes in the
        queue leave it to the writer, which commits them all in one transaction (a helper per
        run would split the group commit of concurrent runs). One attempt that waits for no
        lock: with the writer busy, another process holding the file's lock, a failing store,
        a flush or a stop queued, or any error, it does nothing but ring the writer and returns
        False (the writer commits, retries or gives up as for any write). True once committed
        or refused as the writer would have (each write's waiter is told either way).
        """
        queue_ = self._queue
        if not self._commit_lock.acquire(blocking=False):
            queue_.ring()  # busy: it looks again when done, and finds what was queued since
            return False
        try:
            if self._given_up is not None or self._closing.is_set() or self._conn_closed:
                queue_.ring()
                return False
            items = queue_.take(self._max_batch)
            batch = [item for item in items if item is not EVENTS_WAKE]
            if not all(item is not _STOP and item[0][1] == run_id for item in batch):
                queue_.give_back(items)  # another run's write, a flush (op[1] a bool), a stop
                return False
            if batch and not self._commit(self._writer_conn, batch, helping=True):
                queue_.give_back(items)
                return False
            queue_.done(len(items))
            return True
        finally:
            self._commit_lock.release()

    def commit_soon(self) -> None:
        """Wake the writer for what was queued lazily: a run waits for it (its outcome, its
        passivation, a write-ahead call), and the writer commits it with the other runs'."""
        self._queue.ring()

    def _commit_events(self, conn: sqlite3.Connection, *, force: bool) -> None:
        """Commit the events still waiting (at the writer's stop)."""
        events = self._take_events(force)
        if events:
            self._commit(conn, events)

    def _commit(
        self, conn: sqlite3.Connection, batch: list[tuple[Any, Any, Any]], *, helping: bool = False
    ) -> bool:
        """Commit `batch` and tell each write's waiter; False (nothing done) only when
        `helping` and the one attempt did not commit (`commit_now`)."""
        refused: dict[int, SteerableError] = {}
        error = self._transact(conn, batch, refused, helping=helping)
        if isinstance(error, _NotDone):
            return False
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
        return True

    def _transact(
        self,
        conn: sqlite3.Connection,
        batch: list[tuple[Any, Any, Any]],
        refused: dict[int, SteerableError],
        *,
        helping: bool = False,
    ) -> SteerableError | _NotDone | None:
        """Commit `batch` as one transaction, retrying transient failures with backoff.

        Returns None once committed, else the error every write of the batch gets. When
        `helping` (a pool worker's `commit_now`): one attempt that waits for no lock, and
        `_NOT_DONE` instead of any error, retry or give-up (the writer does those).
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
            return _NOT_DONE if helping else self._writer_failed(exc)
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
                    self._begin(conn, helping)
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
                if helping:
                    return self._helper_failed(exc)
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

    def _helper_failed(self, exc: BaseException) -> _NotDone:
        """A run's own attempt (`commit_now`) failed: the writer will try the batch again."""
        if full_disk(exc):
            # A retry as any of the writer's own; a busy lock is not one (this attempt waits
            # for none by design, and the writer takes its turn).
            self._retries += 1
            _log.warning("sqlite_write_retry", path=str(self.path), attempt=1, error=str(exc))
        return _NOT_DONE

    def _begin(self, conn: sqlite3.Connection, helping: bool) -> None:
        # IMMEDIATE: the fence check reads the lease and the write follows in the same
        # transaction; a deferred one could not upgrade after another process's claim.
        if not helping:
            conn.execute("BEGIN IMMEDIATE")
            return
        conn.execute("PRAGMA busy_timeout=0")  # no busy wait on a run's thread
        try:
            conn.execute("BEGIN IMMEDIATE")
        finally:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")

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
                rows.append((run_id, entries_from + i, bound_blob(blob), checksum(blob)))
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
        row = (run_id, seq, bound_blob(blob), checksum(blob), message_id)
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
