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

This module is the facade (connections, the queueing write calls, close); the writer thread
lives in sqlite_writer.py, the reads in sqlite_reads.py, leases in sqlite_own.py.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from steerable.actors._engine.inline import serving_inline
from steerable.actors._engine.log import get_logger
from steerable.protocol import (
    AgentError,
    ErrorCode,
    HostMessage,
    SteerableError,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)
from steerable.protocol._codec import encode

from .events import EventWindow
from .lease import Owner
from .schema import SCHEMA_VERSION, check_foreign, migrate
from .sqlite_events import SqliteEvents
from .sqlite_files import private_file, transient, unavailable
from .sqlite_own import SqliteOwnership
from .sqlite_queue import WriteQueue
from .sqlite_reads import SqliteReads
from .sqlite_wal import WalCheckpointer
from .sqlite_writer import (
    _ATTEMPT_BUSY,
    _FIRST_BACKOFF,
    _MAX_BACKOFF,
    _STOP,
    SqliteWriter,
)
from .store import CheckpointStore, check_record

__all__ = ["SCHEMA_VERSION", "SqliteStore", "default_db_path"]


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


_log = get_logger("steerable.sqlite")


def _locked(exc: sqlite3.OperationalError) -> bool:
    """A lock or busy error (worth waiting out), not a full disk (which fails the open)."""
    return transient(exc) and "full" not in str(exc).lower()


class SqliteStore(SqliteReads, SqliteWriter, SqliteOwnership, SqliteEvents, CheckpointStore):
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

    The store starts one writer thread (`steerable-sqlite`) and one WAL checkpoint thread
    (`steerable-sqlite-wal`, sqlite_wal.py); `close()` (or the Runtime's shutdown) flushes
    and stops both.
    """

    durable = True
    fences = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        max_batch: int = 512,
        write_timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"unknown synchronous mode {synchronous!r}")
        if not write_timeout >= 0:
            raise ValueError(f"write_timeout must be >= 0, not {write_timeout!r}")
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise SteerableError(
                AgentError.of(
                    ErrorCode.NOT_FOUND, f"{self.path}: no such database", path=str(self.path)
                )
            )
        check_foreign(self.path)  # before anything could write to a file that is not ours
        self._synchronous = synchronous.upper()
        self._max_batch = max_batch
        self._write_timeout = float(write_timeout)
        self._queue = WriteQueue()
        self._event_window = EventWindow()
        self._local = threading.local()
        self._closed = False
        self._closing = threading.Event()
        self._close_lock = threading.Lock()
        self._failed: BaseException | None = None
        self._given_up: BaseException | None = None  # the last write given up, until one lands
        self._retries = 0  # written under the commit lock (the writer, or a run's commit_now)
        self._gave_up = 0
        self._static_written: set[str] = set()  # touched by the writer thread only
        self._static_added: list[str] = []  # this transaction's additions (undone on rollback)
        self._held: dict[str, tuple[Owner, int]] = {}
        """Runs this store object writes for: run id -> (owner, epoch). Checked by the writer
        in each write's transaction (fencing)."""
        self._held_lock = threading.Lock()
        self._ttl = 5.0
        self._fenced_now: set[str] = set()  # the last transaction's fenced runs (writer only)
        self._entries_len: dict[str, tuple[int, int]] = {}
        """Runs whose entries this writer wrote last: run id -> (lease epoch, entry count)."""
        self._journal_empty: dict[str, int] = {}
        """Runs whose journal this writer cleared and wrote nothing to since: run id -> epoch."""
        self._runs_rev: dict[str, tuple[int, int]] = {}
        """Runs whose `runs` row this writer wrote last: run id -> (lease epoch, revision)."""
        self._write_lock = threading.Lock()
        """Held for each transaction on the writer's connection (the writer thread's, or a
        host message's committed on its sender's thread)."""
        self._init_commits(int(min(self._write_timeout, _ATTEMPT_BUSY) * 1000))
        self._conn_closed = False
        conn = self._open()
        self._writer_conn = conn
        try:
            # The writer's commits never checkpoint (its connection's `wal_autocheckpoint` is
            # 0): this thread does, every few commits, on its own connection (sqlite_wal.py).
            conn.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            conn.close()
            raise
        self._wal = WalCheckpointer(self.path, self._connect, self._write_lock)
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
        # A lock another process holds (its long transaction, or the recovery of a WAL a
        # killed process left) is waited out up to `write_timeout`, as a write would be; one
        # attempt's busy wait is shorter (`_ATTEMPT_BUSY`).
        deadline = time.monotonic() + self._write_timeout
        backoff = _FIRST_BACKOFF
        while True:
            conn: sqlite3.Connection | None = None
            try:
                conn = self._connect()
                migrate(conn, self.path)
                self._probe_writable(conn)
            except sqlite3.OperationalError as exc:
                if conn is not None:
                    conn.close()
                if _locked(exc) and time.monotonic() + backoff < deadline:
                    _log.warning("sqlite_open_retry", path=str(self.path), error=str(exc))
                    self._closing.wait(backoff)  # never set yet: a plain backoff
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
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

    def append_message(
        self, run_id: str, message: HostMessage, *, message_id: str | None = None
    ) -> None:
        """Store a host message; returns once it is committed (durable steering).

        `message_id` is stored with it (`message_seq` finds it; one message per id).

        Raises:
            SteerableError: `store_unavailable` if the write was given up (nothing stored).
            TypeError, ValueError: `check_record` refuses the message; nothing is stored.
        """
        check_record(message)
        self._check_open()
        blob = encode(message, kind="host_message")
        if self._given_up is None and self._store_now(run_id, message.seq, blob, message_id):
            return
        # The writer retries it (or gives it up) as any write; a store whose last write was
        # given up queues at once, so the writer's short probe answers.
        done: Future[None] = Future()
        self._queue.put((("inbox", run_id, message.seq, blob, message_id), done, None))
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
        item = (("journal", run_id, result.call_id, blob), None, on_failed)
        if serving_inline():
            # Committed with the run's next checkpoint, or at the writer's next poll; a run
            # whose call wrote rings the writer at once (`commit_soon`, decision 0004).
            self._queue.put_lazy(item)
        else:
            self._queue.put(item)

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
        if serving_inline():
            # A pool worker handling the run: the run commits it itself when it waits for it,
            # the writer's next poll otherwise (docs/decisions/0004-waiting-run-commits.md).
            self._queue.put_lazy((op, on_stored, on_failed))
        else:
            self._queue.put((op, on_stored, on_failed))

    def statistics(self) -> dict[str, int]:
        """Write failures so far: `write_retries` (attempts that failed for a transient
        reason and were tried again; of a run's own attempts, `commit_now`, only those a full
        disk refused: one that meets a lock leaves the write to the writer by design) and
        `writes_given_up` (batches given up)."""
        return {"write_retries": self._retries, "writes_given_up": self._gave_up}

    def flush(self, timeout: float | None = None, *, events: bool = True) -> bool:
        """Wait until every queued write is committed (or given up); `events=False` leaves
        the stored events that wait for their window (a read that does not read them)."""
        if (
            self._closed
            or not self._thread.is_alive()
            or (self._queue.idle() and (not events or self._events_due() is None))
        ):
            return True  # nothing queued before this call is left (a fresh process's load)
        done: Future[None] = Future()
        self._queue.put((("flush", events), done, None))
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
        self._wal.stop()  # after the writer: its last commits may have signalled it
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        self._close_watch()

    def _path_str(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"
