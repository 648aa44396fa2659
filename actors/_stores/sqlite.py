"""`SqliteStore`: the embedded durable default, on the standard library's sqlite3.

One file in WAL mode. Every write goes through one writer thread that commits in batches
(group commit): checkpoints and journal entries are handed over without waiting, so the
supervisor never blocks on disk (docs/pykka.md, last section); host messages wait for their commit,
so `send()` returns only once the message is stored (durable steering). Each batch is one
transaction: a crash leaves every checkpoint either whole or absent, never half-written.

A batch that fails for a transient reason (locked, busy, disk full) is retried with backoff for
`write_timeout` seconds; then it is given up and every waiter is told (`store_unavailable`).
A revision is stored only on top of its predecessor, so a write that was given up can never
leave a later revision with a hole in its transcript (docs/reliability.md, "Store faults").
"""

from __future__ import annotations

import functools
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from steerable.actors._engine.log import get_logger
from steerable.protocol import (
    AgentError,
    ErrorCode,
    HostMessage,
    RunState,
    SteerableError,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)
from steerable.protocol._codec import encode, encode_body

from .sqlite_files import (
    notify_failed,
    notify_stored,
    private_file,
    transient,
    unavailable,
)
from .sqlite_rows import checked, checksum, decoded, named, revision_info, summary
from .store import (
    CheckpointStore,
    RevisionInfo,
    RunSummary,
    StoredRun,
    check_record,
    corrupt_row,
    join_snapshot,
    not_found,
    split_snapshot,
)

__all__ = ["SCHEMA_VERSION", "SqliteStore", "default_db_path"]

_log = get_logger("steerable.sqlite")

SCHEMA_VERSION = 1
"""The version of the database layout (tables below); distinct from the codec's format."""

_SCHEMA = """
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

_STOP = object()
_ATTEMPT_BUSY = 1.0  # seconds one attempt waits for a lock; retries go on to `write_timeout`
_PROBE = 0.25  # seconds of retrying a store whose last write was given up gets
_FIRST_BACKOFF = 0.01
_MAX_BACKOFF = 0.5


def default_db_path() -> Path:
    """Where the CLI and the demo keep runs: `$STEERABLE_DB`, else the XDG data directory.

    That is `$XDG_DATA_HOME/steerable/runs.db`, by default `~/.local/share/steerable/runs.db`.
    """
    env = os.environ.get("STEERABLE_DB")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "steerable" / "runs.db"


def _incompatible(message: str, **details: Any) -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.CHECKPOINT_INCOMPATIBLE, message, **details))


class SqliteStore(CheckpointStore):
    """A durable store in one SQLite file (WAL), safe for many concurrent runs.

    Args:
        path: The database file. Created 0600 (its `-wal` and `-shm` files too), and any
            folder it needs 0700, whatever the umask; an existing file keeps its mode.
        synchronous: SQLite's `synchronous` pragma. "NORMAL" (default) survives a process
            crash (SIGKILL) without losing a committed write; "FULL" also survives power loss,
            at a cost per commit.
        max_batch: Most writes committed in one transaction.
        write_timeout: Seconds a write keeps being retried, with backoff, while it fails for
            a transient reason (the file locked by another process, the disk full); then it
            is given up with `store_unavailable`. Default 5. Once a write was given up, the
            next ones get one short attempt each until one succeeds.

    Raises:
        SteerableError: `store_unavailable` if the file cannot be opened for writing (a
            read-only file, folder or file system, a folder that cannot be created, a lock
            held past `write_timeout`), with the path and the underlying error;
            `checkpoint_incompatible` for a database of a newer steerable.

    The store starts one writer thread (`steerable-sqlite`); `close()` (or the Runtime's
    shutdown) flushes and stops it.
    """

    durable = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        max_batch: int = 512,
        write_timeout: float = 5.0,
    ) -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"unknown synchronous mode {synchronous!r}")
        if not write_timeout >= 0:
            raise ValueError(f"write_timeout must be >= 0, not {write_timeout!r}")
        self.path = Path(path)
        self._synchronous = synchronous.upper()
        self._max_batch = max_batch
        self._write_timeout = float(write_timeout)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._local = threading.local()
        self._closed = False
        self._closing = threading.Event()
        self._close_lock = threading.Lock()
        self._failed: BaseException | None = None
        self._given_up: BaseException | None = None  # the last write given up, until one lands
        self._retries = 0  # written by the writer thread only
        self._gave_up = 0
        self._static_written: set[str] = set()  # touched by the writer thread only
        self._static_added: list[str] = []  # this transaction's additions (undone on rollback)
        conn = self._open()
        self._writer_conn = conn
        self._thread = threading.Thread(
            target=self._write_loop, name="steerable-sqlite", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ connections

    def _open(self) -> sqlite3.Connection:
        """Create the file private to its owner, open it, and prove it can be written."""
        try:
            private_file(self.path)
        except OSError as exc:
            raise unavailable(
                f"cannot create {self.path}: {exc.strerror or exc}", exc, path=str(self.path)
            ) from None
        conn: sqlite3.Connection | None = None
        try:
            conn = self._connect()
            self._init_schema(conn)
            self._probe_writable(conn)
        except sqlite3.OperationalError as exc:
            if conn is not None:
                conn.close()
            raise unavailable(
                f"cannot open {self.path} for writing: {exc}", exc, path=str(self.path)
            ) from None
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        return conn

    def _connect(self) -> sqlite3.Connection:
        busy = min(self._write_timeout, _ATTEMPT_BUSY) if self._write_timeout else 0.0
        conn = sqlite3.connect(
            self.path, timeout=busy, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(busy * 1000)}")
        return conn

    def _probe_writable(self, conn: sqlite3.Connection) -> None:
        # Writes a read-only file, folder or mount refuses are otherwise found only at the
        # first commit, on the writer thread: an UPDATE of no row takes the write path of
        # SQLite (lock, journal) and changes nothing.
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("UPDATE meta SET value=value WHERE 0")
        finally:
            conn.execute("ROLLBACK")

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        conn.executescript(_SCHEMA)  # idempotent: CREATE ... IF NOT EXISTS
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) > SCHEMA_VERSION:
                raise _incompatible(
                    f"{self.path} was written by a newer steerable (schema {row[0]} > "
                    f"{SCHEMA_VERSION}); upgrade steerable to open it",
                    schema_version=int(row[0]),
                    supported=SCHEMA_VERSION,
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            conn.close()
            raise

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    # ------------------------------------------------------------------ writes

    def _check_open(self) -> None:
        if self._closed:
            raise SteerableError(AgentError.of(ErrorCode.RUN_ENDED, "the store is closed"))
        if self._failed is not None:
            raise SteerableError(
                AgentError.of(
                    ErrorCode.INTERNAL_ERROR, f"the store's writer failed: {self._failed!r}"
                )
            )

    def append_message(self, run_id: str, message: HostMessage) -> None:
        """Store a host message; returns once it is committed (durable steering).

        Raises:
            SteerableError: `store_unavailable` if the write was given up (nothing stored).
            TypeError, ValueError: `check_record` refuses the message; nothing is stored.
        """
        check_record(message)
        self._check_open()
        done: Future[None] = Future()
        self._queue.put(
            (("inbox", run_id, message.seq, encode(message, kind="host_message")), done, None)
        )
        done.result()

    def journal(
        self,
        run_id: str,
        result: ToolResult | SubagentResult,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        """Queue a tool result for the journal (committed in the next batch)."""
        check_record(result)
        self._check_open()
        blob = encode(result, kind="entry")
        self._queue.put((("journal", run_id, result.call_id, blob), None, on_failed))

    def write_checkpoint(
        self,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: Sequence[TranscriptEntry],
        on_stored: Callable[[], None] | None = None,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        """Queue a checkpoint; encoded and committed on the writer thread, then `on_stored`.

        `on_failed(error)` instead if the write is given up (`store_unavailable`) or refused
        because the run's previous revision was not stored.
        """
        self._check_open()
        op = ("checkpoint", run_id, revision, snapshot, entries_from, list(entries))
        self._queue.put((op, on_stored, on_failed))

    def statistics(self) -> dict[str, int]:
        """Write failures so far: `write_retries` (attempts that failed for a transient
        reason and were tried again) and `writes_given_up` (batches given up)."""
        return {"write_retries": self._retries, "writes_given_up": self._gave_up}

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is committed (or given up)."""
        if self._closed or not self._thread.is_alive():
            return True
        done: Future[None] = Future()
        self._queue.put((("flush",), done, None))
        try:
            done.result(timeout)
        except TimeoutError:
            return False
        except SteerableError:
            return True  # given up: nothing is left to wait for
        return True

    def close(self) -> None:
        """Flush, stop the writer thread and close connections. Idempotent.

        Writes still failing get a short last try (not `write_timeout`) and are given up.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        self._queue.put(_STOP)
        self._thread.join(30.0)
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _write_loop(self) -> None:
        conn = self._writer_conn
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                batch = [item]
                stop = False
                while len(batch) < self._max_batch:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                        break
                    batch.append(more)
                self._commit(conn, batch)
                if stop:
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[Any, Any, Any]]) -> None:
        refused: dict[int, SteerableError] = {}
        error = self._transact(conn, batch, refused)
        for index, (_, done, failed) in enumerate(batch):
            why = error if error is not None else refused.get(index)
            if why is None:
                notify_stored(done)
            else:
                notify_failed(done, failed, why)

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
        while True:
            attempt += 1
            refused.clear()
            self._static_added.clear()
            try:
                conn.execute("BEGIN")
                for index, (op, _, _) in enumerate(batch):
                    why = self._apply_one(conn, op)
                    if why is not None:
                        refused[index] = why
                conn.execute("COMMIT")
            except BaseException as exc:  # noqa: BLE001 - reported to every waiter, and logged
                self._rollback(conn)
                if not isinstance(exc, sqlite3.Error):
                    _log.error("sqlite_commit_failed", path=str(self.path), exc_info=True)
                    self._failed = exc
                    return SteerableError(
                        AgentError.of(ErrorCode.INTERNAL_ERROR, f"storing failed: {exc!r}")
                    )
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
                self._given_up = exc
                self._gave_up += 1
                seconds = round(now - started, 3)
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
            self._given_up = None
            return None

    def _rollback(self, conn: sqlite3.Connection) -> None:
        for run_id in self._static_added:
            self._static_written.discard(run_id)
        self._static_added.clear()
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:  # the transaction is gone with the failure
                _log.warning("sqlite_rollback_failed", path=str(self.path), exc_info=True)

    def _apply_one(self, conn: sqlite3.Connection, op: tuple[Any, ...]) -> SteerableError | None:
        """Apply one write inside its own savepoint: a value the codec refuses (entry points
        check with the same `check_storable`, so this is a last line) rolls back that write
        alone and is reported to its waiter; the rest of the batch commits."""
        conn.execute("SAVEPOINT op")
        try:
            why = self._apply(conn, op)
        except ValueError as exc:
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            if op[0] == "checkpoint":
                self._static_written.discard(op[1])
            _log.error("sqlite_write_refused", path=str(self.path), op=op[0], error=str(exc))
            return SteerableError(
                AgentError.of(
                    ErrorCode.INTERNAL_ERROR,
                    f"the codec refused a {op[0]} write that passed every entry check: {exc}",
                    write=op[0],
                )
            )
        conn.execute("RELEASE op")
        return why

    def _apply(self, conn: sqlite3.Connection, op: tuple[Any, ...]) -> SteerableError | None:
        kind = op[0]
        if kind == "checkpoint":
            return self._apply_checkpoint(conn, *op[1:])
        if kind == "journal":
            _, run_id, call_id, blob = op
            conn.execute(
                "INSERT OR REPLACE INTO journal VALUES (?,?,?,?)",
                (run_id, call_id, blob, checksum(blob)),
            )
        elif kind == "inbox":
            _, run_id, seq, blob = op
            conn.execute(
                "INSERT OR REPLACE INTO inbox VALUES (?,?,?,?)", (run_id, seq, blob, checksum(blob))
            )
        return None

    def _apply_checkpoint(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: list[TranscriptEntry],
    ) -> SteerableError | None:
        """Write one revision, only on top of the previous one: after a write of this run
        was given up, its later revisions are refused (the store keeps its last good one)
        rather than stored with a hole in their transcript. Returns the refusal, if any."""
        static, dynamic = split_snapshot(snapshot)
        if run_id not in self._static_written:
            # Once per run and process: config, capabilities and the task never change while
            # a run lives, so revisions store only what does (W4: bytes <= 3x the transcript).
            blob = encode_body("snapshot", static)
            cursor = conn.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(run_id) DO UPDATE "
                "SET state=excluded.state, revision=excluded.revision, "
                "updated_at=excluded.updated_at, static=excluded.static, crc=excluded.crc "
                "WHERE excluded.revision <= runs.revision + 1",
                (
                    run_id,
                    snapshot["parent_run_id"],
                    snapshot["task"],
                    snapshot["agent"],
                    snapshot["state"],
                    revision,
                    snapshot["updated_at"],
                    blob,
                    checksum(blob),
                ),
            )
            if cursor.rowcount == 1:
                self._static_written.add(run_id)
                self._static_added.append(run_id)
        else:
            cursor = conn.execute(
                "UPDATE runs SET state=?, revision=?, updated_at=? WHERE run_id=? AND revision>=?",
                (snapshot["state"], revision, snapshot["updated_at"], run_id, revision - 1),
            )
        if cursor.rowcount != 1:
            return unavailable(
                f"revision {revision} of run {run_id} not stored: an earlier revision of the "
                "run was not stored (its write was given up)",
                run_id=run_id,
                revision=revision,
            )
        blob = encode_body("snapshot", dynamic)
        conn.execute(
            "INSERT OR REPLACE INTO revisions VALUES (?,?,?,?)",
            (run_id, revision, blob, checksum(blob)),
        )
        if entries:
            conn.execute("DELETE FROM entries WHERE run_id=? AND idx>=?", (run_id, entries_from))
            rows = []
            for i, entry in enumerate(entries):
                blob = encode(entry, kind="entry")
                rows.append((run_id, entries_from + i, blob, checksum(blob)))
            conn.executemany("INSERT INTO entries VALUES (?,?,?,?)", rows)
        if not snapshot["plan"]:
            conn.execute("DELETE FROM journal WHERE run_id=?", (run_id,))
        if RunState(snapshot["state"]).is_terminal:
            self._static_written.discard(run_id)
        return None

    # ------------------------------------------------------------------ reads

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        """Load a run at `revision` (None: the latest).

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` (naming the run and revision)
                for a row whose checksum fails (bit flips, truncation), a missing transcript
                entry or a record that does not decode or validate; `checkpoint_incompatible`
                for a newer format.
        """
        self.flush()
        conn = self._reader()
        conn.execute("BEGIN")
        try:
            row = conn.execute(
                "SELECT revision, static, crc FROM runs WHERE run_id=?", (run_id,)
            ).fetchone()
            if row is None:
                raise not_found(run_id)
            latest, static_blob, static_crc = row
            wanted = latest if revision is None else revision
            rev = conn.execute(
                "SELECT snapshot, crc FROM revisions WHERE run_id=? AND revision=?",
                (run_id, wanted),
            ).fetchone()
            if rev is None:
                raise not_found(run_id, revision)
            at = wanted if type(wanted) is int else None
            snapshot = named(
                run_id,
                at,
                lambda: join_snapshot(
                    checked(static_blob, static_crc, run_id, "run"),
                    checked(rev[0], rev[1], run_id, f"revision {wanted}"),
                    run_id=run_id,
                    revision=at,
                ),
            )
            entries = conn.execute(
                "SELECT idx, entry, crc FROM entries WHERE run_id=? AND idx<? ORDER BY idx",
                (run_id, snapshot.transcript_len),
            ).fetchall()
            journal: list[tuple[str, bytes, int]] = []
            messages: list[tuple[int, bytes, int]] = []
            if wanted == latest:
                journal = conn.execute(
                    "SELECT call_id, result, crc FROM journal WHERE run_id=?", (run_id,)
                ).fetchall()
                messages = conn.execute(
                    "SELECT seq, message, crc FROM inbox WHERE run_id=? AND seq>? ORDER BY seq",
                    (run_id, snapshot.last_seq),
                ).fetchall()
        finally:
            conn.execute("COMMIT")
        if snapshot.revision != wanted:
            raise corrupt_row(run_id, at, f"the row holds revision {snapshot.revision}")
        if len(entries) != snapshot.transcript_len or any(
            idx != i for i, (idx, _, _) in enumerate(entries)
        ):
            raise corrupt_row(
                run_id,
                at,
                f"transcript has {len(entries)} of {snapshot.transcript_len} entries",
            )
        return StoredRun(
            snapshot=snapshot,
            transcript=[decoded(b, c, run_id, at, f"entry {i}", "entry") for i, b, c in entries],
            journal={
                cid: decoded(b, c, run_id, at, f"journal {cid}", "entry") for cid, b, c in journal
            },
            messages=[
                decoded(b, c, run_id, at, f"message {seq}", "host_message")
                for seq, b, c in messages
            ],
        )

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every revision of a run, oldest first.

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` naming the run and revision of
                a row that does not hold a revision.
        """
        self.flush()
        rows = (
            self._reader()
            .execute(
                "SELECT revision, snapshot, crc FROM revisions WHERE run_id=? ORDER BY revision",
                (run_id,),
            )
            .fetchall()
        )
        if not rows:
            raise not_found(run_id)
        out = []
        for number, blob, crc in rows:
            at = number if type(number) is int else None
            out.append(named(run_id, at, functools.partial(revision_info, run_id, at, blob, crc)))
        return out

    def runs(self) -> list[RunSummary]:
        """Every run in the store, oldest first (run ids sort by creation time).

        Raises:
            SteerableError: `checkpoint_corrupt` naming the run of a row that does not hold
                a run summary (a state steerable does not have, a column of the wrong type).
        """
        self.flush()
        rows = (
            self._reader()
            .execute(
                "SELECT run_id, state, revision, task, agent, parent_run_id, updated_at FROM runs "
                "ORDER BY run_id"
            )
            .fetchall()
        )
        return [summary(row) for row in rows]

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"
