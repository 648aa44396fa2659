"""`SqliteStore`: the embedded durable default, on the standard library's sqlite3.

One file in WAL mode. Every write goes through one writer thread that commits in batches
(group commit): checkpoints and journal entries are handed over without waiting, so the
supervisor never blocks on disk (docs/pykka.md, last section); host messages wait for their commit,
so `send()` returns only once the message is stored (durable steering). Each batch is one
transaction: a crash leaves every checkpoint either whole or absent, never half-written.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
import zlib
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
from steerable.protocol._codec import decode, decode_body, encode, encode_body

from .store import (
    CheckpointStore,
    RevisionInfo,
    RunSummary,
    StoredRun,
    check_record,
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


def _crc(blob: bytes) -> int:
    return zlib.crc32(blob)


def _checked(blob: bytes, crc: int, run_id: str, what: str) -> bytes:
    """The row's bytes, if their checksum holds (the codec alone cannot see a flipped bit
    inside a string or a number)."""
    if not isinstance(blob, bytes) or zlib.crc32(blob) != crc:
        raise _corrupt(
            f"run {run_id}: {what} fails its checksum (damaged or truncated row)",
            run_id=run_id,
            row=what,
        )
    return blob


def _report_refused(refused: list[tuple[Any, ValueError]]) -> set[int]:
    """Tell the waiters of refused writes; the ids of their callbacks (never `on_stored`)."""
    for done, exc in refused:
        if isinstance(done, Future) and not done.done():
            done.set_exception(exc)
    return {id(done) for done, _ in refused if done is not None}


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


def _corrupt(message: str, **details: Any) -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.CHECKPOINT_CORRUPT, message, **details))


class SqliteStore(CheckpointStore):
    """A durable store in one SQLite file (WAL), safe for many concurrent runs.

    Args:
        path: The database file (created with its folder if missing).
        synchronous: SQLite's `synchronous` pragma. "NORMAL" (default) survives a process
            crash (SIGKILL) without losing a committed write; "FULL" also survives power loss,
            at a cost per commit.
        max_batch: Most writes committed in one transaction.

    The store starts one writer thread (`steerable-sqlite`); `close()` (or the Runtime's
    shutdown) flushes and stops it.
    """

    durable = True

    def __init__(
        self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL", max_batch: int = 512
    ) -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"unknown synchronous mode {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._synchronous = synchronous.upper()
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._local = threading.local()
        self._closed = False
        self._close_lock = threading.Lock()
        self._failed: BaseException | None = None
        self._static_written: set[str] = set()  # touched by the writer thread only
        conn = self._connect()
        self._init_schema(conn)
        self._writer_conn = conn
        self._thread = threading.Thread(
            target=self._write_loop, name="steerable-sqlite", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ connections

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

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

    def _submit(self, op: tuple[Any, ...], wait: bool) -> None:
        self._check_open()
        if not wait:
            self._queue.put((op, None))
            return
        done: Future[None] = Future()
        self._queue.put((op, done))
        done.result()

    def append_message(self, run_id: str, message: HostMessage) -> None:
        """Store a host message; returns once it is committed (durable steering)."""
        check_record(message)
        self._submit(
            ("inbox", run_id, message.seq, encode(message, kind="host_message")), wait=True
        )

    def journal(self, run_id: str, result: ToolResult | SubagentResult) -> None:
        """Queue a tool result for the journal (committed in the next batch)."""
        check_record(result)
        self._submit(("journal", run_id, result.call_id, encode(result, kind="entry")), wait=False)

    def write_checkpoint(
        self,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: Sequence[TranscriptEntry],
        on_stored: Callable[[], None] | None = None,
    ) -> None:
        """Queue a checkpoint; encoded and committed on the writer thread, then `on_stored`."""
        op = ("checkpoint", run_id, revision, snapshot, entries_from, list(entries))
        if on_stored is None:
            self._submit(op, wait=False)
        else:
            self._check_open()
            self._queue.put((op, on_stored))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is committed."""
        if self._closed or not self._thread.is_alive():
            return True
        done: Future[None] = Future()
        self._queue.put((("flush",), done))
        try:
            done.result(timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Flush, stop the writer thread and close connections. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
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

    def _commit(self, conn: sqlite3.Connection, batch: list[tuple[Any, Any]]) -> None:
        refused: list[tuple[Any, ValueError]] = []
        try:
            conn.execute("BEGIN")
            for item in batch:
                self._apply_one(conn, item, refused)
            conn.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter, and logged
            _log.error("sqlite_commit_failed", path=str(self.path), exc_info=True)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not isinstance(exc, sqlite3.OperationalError):
                self._failed = exc
            for _, done in batch:
                if isinstance(done, Future) and not done.done():
                    done.set_exception(
                        SteerableError(
                            AgentError.of(ErrorCode.INTERNAL_ERROR, f"storing failed: {exc!r}")
                        )
                    )
            return
        skip = _report_refused(refused)
        for _, done in batch:
            if id(done) in skip:
                continue  # not stored: no on_stored (the run's writes stay held)
            if isinstance(done, Future):
                if not done.done():
                    done.set_result(None)
            elif done is not None:
                try:
                    done()  # on_stored: a tell to the run that waits for this revision
                except Exception:  # noqa: BLE001 - the writer must go on
                    _log.error("on_stored_failed", exc_info=True)

    def _apply_one(
        self,
        conn: sqlite3.Connection,
        item: tuple[Any, Any],
        refused: list[tuple[Any, ValueError]],
    ) -> None:
        """Apply one write inside its own savepoint: a value the codec refuses (entry points
        check with the same `check_storable`, so this is a last line) rolls back that write
        alone and is reported to its waiter; the rest of the batch commits."""
        op, done = item
        conn.execute("SAVEPOINT op")
        try:
            self._apply(conn, op)
        except ValueError as exc:
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            if op[0] == "checkpoint":
                self._static_written.discard(op[1])
            _log.error("sqlite_write_refused", path=str(self.path), op=op[0], error=str(exc))
            refused.append((done, exc))
            return
        conn.execute("RELEASE op")

    def _apply(self, conn: sqlite3.Connection, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "checkpoint":
            self._apply_checkpoint(conn, *op[1:])
        elif kind == "journal":
            _, run_id, call_id, blob = op
            conn.execute(
                "INSERT OR REPLACE INTO journal VALUES (?,?,?,?)",
                (run_id, call_id, blob, _crc(blob)),
            )
        elif kind == "inbox":
            _, run_id, seq, blob = op
            conn.execute(
                "INSERT OR REPLACE INTO inbox VALUES (?,?,?,?)", (run_id, seq, blob, _crc(blob))
            )

    def _apply_checkpoint(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: list[TranscriptEntry],
    ) -> None:
        static, dynamic = split_snapshot(snapshot)
        if run_id not in self._static_written:
            # Once per run and process: config, capabilities and the task never change while
            # a run lives, so revisions store only what does (W4: bytes <= 3x the transcript).
            blob = encode_body("snapshot", static)
            conn.execute(
                "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(run_id) DO UPDATE "
                "SET state=excluded.state, revision=excluded.revision, "
                "updated_at=excluded.updated_at, static=excluded.static, crc=excluded.crc",
                (
                    run_id,
                    snapshot["parent_run_id"],
                    snapshot["task"],
                    snapshot["agent"],
                    snapshot["state"],
                    revision,
                    snapshot["updated_at"],
                    blob,
                    _crc(blob),
                ),
            )
            self._static_written.add(run_id)
        else:
            conn.execute(
                "UPDATE runs SET state=?, revision=?, updated_at=? WHERE run_id=?",
                (snapshot["state"], revision, snapshot["updated_at"], run_id),
            )
        blob = encode_body("snapshot", dynamic)
        conn.execute(
            "INSERT OR REPLACE INTO revisions VALUES (?,?,?,?)",
            (run_id, revision, blob, _crc(blob)),
        )
        if entries:
            conn.execute("DELETE FROM entries WHERE run_id=? AND idx>=?", (run_id, entries_from))
            rows = []
            for i, entry in enumerate(entries):
                blob = encode(entry, kind="entry")
                rows.append((run_id, entries_from + i, blob, _crc(blob)))
            conn.executemany("INSERT INTO entries VALUES (?,?,?,?)", rows)
        if not snapshot["plan"]:
            conn.execute("DELETE FROM journal WHERE run_id=?", (run_id,))
        if RunState(snapshot["state"]).is_terminal:
            self._static_written.discard(run_id)

    # ------------------------------------------------------------------ reads

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        """Load a run at `revision` (None: the latest).

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` for a row whose checksum fails
                (bit flips, truncation), a missing transcript entry or a record that does not
                decode; `checkpoint_incompatible` for a newer format.
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
            snapshot = join_snapshot(
                _checked(static_blob, static_crc, run_id, "run"),
                _checked(rev[0], rev[1], run_id, f"revision {wanted}"),
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
        if len(entries) != snapshot.transcript_len or any(
            idx != i for i, (idx, _, _) in enumerate(entries)
        ):
            raise _corrupt(
                f"run {run_id}: transcript has {len(entries)} of {snapshot.transcript_len} entries",
                run_id=run_id,
            )
        return StoredRun(
            snapshot=snapshot,
            transcript=[
                decode(_checked(b, c, run_id, f"entry {i}"), kind="entry") for i, b, c in entries
            ],
            journal={
                cid: decode(_checked(b, c, run_id, f"journal {cid}"), kind="entry")
                for cid, b, c in journal
            },
            messages=[
                decode(_checked(b, c, run_id, f"message {seq}"), kind="host_message")
                for seq, b, c in messages
            ],
        )

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every revision of a run, oldest first."""
        self.flush()
        rows = (
            self._reader()
            .execute(
                "SELECT snapshot, crc FROM revisions WHERE run_id=? ORDER BY revision", (run_id,)
            )
            .fetchall()
        )
        if not rows:
            raise not_found(run_id)
        out = []
        for blob, crc in rows:
            _, body = decode_body(_checked(blob, crc, run_id, "revision"), kind="snapshot")
            out.append(
                RevisionInfo(
                    run_id=run_id,
                    revision=body["revision"],
                    state=RunState(body["state"]),
                    transcript_len=body["transcript_len"],
                    updated_at=body["updated_at"],
                )
            )
        return out

    def runs(self) -> list[RunSummary]:
        """Every run in the store, oldest first (run ids sort by creation time)."""
        self.flush()
        rows = (
            self._reader()
            .execute(
                "SELECT run_id, state, revision, task, agent, parent_run_id, updated_at FROM runs "
                "ORDER BY run_id"
            )
            .fetchall()
        )
        return [
            RunSummary(
                run_id=r[0],
                state=RunState(r[1]),
                revision=r[2],
                task=r[3],
                agent=r[4],
                parent_run_id=r[5],
                updated_at=r[6],
            )
            for r in rows
        ]

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"
