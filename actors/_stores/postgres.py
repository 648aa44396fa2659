"""`PostgresStore`: runs shared by many hosts on one PostgreSQL database (extra `postgres`).

The same contract as `SqliteStore`, for hosts on several machines: one writer thread per store
object commits checkpoints and journal entries in batches (group commit), each batch one
transaction in which every write of a run is fenced by the lease epoch this store object holds
(the lease rows are read `FOR SHARE`, so a claim waits for the write or the write sees the
claim). Host messages wait for their commit. Leases live on the database clock
(postgres_own.py); the owner learns of operations other hosts store by LISTEN/NOTIFY with a
polling fallback (postgres_listen.py). A dropped connection is a reconnect and a retry
(postgres_conn.py), never an error in a run, until `write_timeout` is spent: then the write is
given up with `store_unavailable` exactly as SQLite's is (docs/reliability.md).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.inline import handoff_to_workers
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

from .events import EVENTS_WAKE, EventWindow
from .lease import Owner, message_fenced
from .postgres_batch import FENCED_OPS, Batch, message_statement
from .postgres_conn import Connections, _redacted
from .postgres_events import PostgresEvents, event_rows
from .postgres_listen import PgWatcher
from .postgres_own import PostgresOwnership
from .postgres_reads import PostgresReads
from .postgres_schema import SCHEMA_VERSION, check_schema_name, migrate
from .sqlite_files import notify_failed, notify_stored
from .store import (
    CheckpointStore,
    check_record,
    split_snapshot,
)

if TYPE_CHECKING:
    import psycopg_pool

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

_log = get_logger("steerable.postgres")

_STOP = object()
_PROBE = 0.25  # seconds of retrying a store whose last write was given up gets


class PostgresStore(PostgresReads, PostgresEvents, PostgresOwnership, CheckpointStore):
    """A durable store in a PostgreSQL database, shared by any number of hosts.

    Args:
        dsn_or_pool: A libpq connection string or URL (the store makes a pool: health-checked
            connections, TCP keepalives on), or a `psycopg_pool.ConnectionPool` you own (it is
            not closed by `close()`). LISTEN needs a direct connection: behind a transaction
            pooler, give the store the server's address (docs/deployment.md).
        schema: The PostgreSQL schema that holds the tables (created if missing).
        min_size, max_size: The pool's size, when the store makes it (4 to 8: the writer,
            the lease thread and a few concurrent senders each hold one at a time).
        max_batch: Most writes committed in one transaction.
        write_timeout: Seconds a write (or any store operation) keeps being retried while it
            fails for a transient reason (connection lost, server restarting, deadlock); then
            it is given up with `store_unavailable`. Default 5.
        poll_interval: Seconds between two rescans of pending operations by the wake thread,
            the fallback when a notification was lost (default 1).
        connect_kwargs: More libpq connection parameters (for example
            `{"prepare_threshold": None}` behind PgBouncer).

    Raises:
        ImportError: The `postgres` extra (psycopg, psycopg_pool) is not installed.
        SteerableError: `store_unavailable` if the server cannot be reached within
            `write_timeout`; `checkpoint_incompatible` for a schema of a newer steerable or
            a schema that holds another application's tables.
    """

    durable = True
    fences = True

    def __init__(
        self,
        dsn_or_pool: str | psycopg_pool.ConnectionPool[Any],
        *,
        schema: str = "steerable",
        min_size: int = 4,
        max_size: int = 8,
        max_batch: int = 512,
        write_timeout: float = 5.0,
        poll_interval: float = 1.0,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not write_timeout >= 0:
            raise ValueError(f"write_timeout must be >= 0, not {write_timeout!r}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, not {poll_interval!r}")
        self._s = check_schema_name(schema)
        self.schema = schema
        self.channel = f"steerable_ops_{schema}"
        self.poll_interval = float(poll_interval)
        self._write_timeout = float(write_timeout)
        self._max_batch = max_batch
        self._conns = Connections(
            dsn_or_pool,
            min_size=min_size,
            max_size=max_size,
            retry_for=self._write_timeout,
            connect_kwargs=connect_kwargs,
        )
        try:
            self._conns.run(lambda c: migrate(c, self._s), what="schema check")
        except BaseException:
            self._conns.close()
            raise
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self._failed: BaseException | None = None
        self._given_up: BaseException | None = None
        self._gave_up = 0
        self._static_written: set[str] = set()  # the writer thread's only
        self._leased: set[str] = set()  # new runs whose lease row exists (writer thread only)
        self._held: dict[str, tuple[Owner, int]] = {}
        """Runs this store object writes for: run id -> (owner, epoch)."""
        self._held_lock = threading.Lock()
        self._ttl = 5.0
        self._watchers: list[PgWatcher] = []
        self._event_window = EventWindow()
        self._thread = threading.Thread(
            target=self._write_loop, name="steerable-postgres", daemon=True
        )
        self._thread.start()

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

        `message_id` is stored with it, unique per run (`message_seq` finds it): a message
        id the run's inbox holds already is not stored twice.

        Raises:
            SteerableError: `store_unavailable` if the write was given up (nothing stored).
            TypeError, ValueError: `check_record` refuses the message; nothing is stored.
        """
        check_record(message)
        self._check_open()
        blob = encode(message, kind="host_message")
        if self._given_up is None:
            # One autocommit statement on the sender's thread, committed on return: a host
            # message waits for its commit anyway, and senders then commit side by side
            # instead of queueing behind the writer's batches (W9pg). Order is kept: a
            # checkpoint that reflects the message is queued only after it is delivered.
            with self._held_lock:
                held = self._held.get(run_id)
            sql, params = message_statement(self._s, run_id, message.seq, blob, message_id, held)
            try:
                landed = self._conns.run(
                    lambda conn: conn.execute(sql.encode(), params).fetchone(),
                    what="message",
                    bare=True,
                )
            except SteerableError:
                self._check_open()
                raise
            if held is not None and landed is not None and not landed[0]:
                self._fenced([run_id])
                raise message_fenced(run_id, held[1])
            return
        done: Future[None] = Future()  # a failing store: the writer probes it (_PROBE)
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
        """Queue a checkpoint; encoded and committed on the writer thread, then `on_stored`
        (or `on_failed(error)` if it is given up or its previous revision was not stored)."""
        self._check_open()
        op = ("checkpoint", run_id, revision, snapshot, entries_from, list(entries))
        self._queue.put((op, on_stored, on_failed))

    def statistics(self) -> dict[str, int]:
        """Failures so far: `write_retries` (operations retried after a transient failure)
        and `writes_given_up` (batches given up)."""
        return {"write_retries": self._conns.retries, "writes_given_up": self._gave_up}

    def flush(self, timeout: float | None = None, *, events: bool = True) -> bool:
        """Wait until every queued write is committed (or given up); `events=False` leaves
        the stored events that wait for their window (a read that does not read them)."""
        if self._closed or not self._thread.is_alive():
            return True
        done: Future[None] = Future()
        self._queue.put((("flush", events), done, None))
        try:
            done.result(timeout)
        except TimeoutError:
            return False
        except SteerableError:
            return True
        return True

    def close(self) -> None:
        """Flush, stop the writer and wake threads, close the pool (if the store made it).
        Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._conns.closing.set()  # failing writes get one last short try, not write_timeout
        self._queue.put(_STOP)
        self._thread.join(30.0)
        for watcher in list(self._watchers):
            watcher.stop()
        self._conns.close()

    def watch(self, on_change: Callable[[], None]) -> PgWatcher:
        """Start the wake thread of a runtime: `on_change()` on every NOTIFY of this store's
        channel, every `poll_interval` seconds, and after every reconnect (a rescan)."""
        watcher = PgWatcher(self._conns, self.channel, on_change, self.poll_interval)
        self._watchers.append(watcher)
        return watcher

    def _write_loop(self) -> None:
        while True:
            # Stored events wait EVENT_DELAY at most, then go in one statement: a statement
            # and a commit per step would cost more than the step (docs/performance.md, W9pg).
            due = self._events_due()
            try:
                item = self._queue.get(
                    timeout=None if due is None else max(0.0, due - time.monotonic())
                )
            except queue.Empty:
                item = EVENTS_WAKE  # the waiting events are due
            stop = item is _STOP
            batch = [] if stop or item is EVENTS_WAKE else [item]
            while not stop and len(batch) < self._max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                elif more is not EVENTS_WAKE:
                    batch.append(more)
            # A flush (every read, close) wants every waiting event written before it returns.
            force = stop or any(op[0] == "flush" and op[1] for op, _, _ in batch)
            batch.extend(self._take_events(force))
            if batch:
                self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[Any, Any, Any]]) -> None:
        refused: dict[int, SteerableError] = {}
        prepared: dict[int, Any] = {}
        for index, (op, _, _) in enumerate(batch):
            try:
                prepared[index] = self._prepare(op)
            except (TypeError, ValueError) as exc:
                _log.error("postgres_write_refused", op=op[0], error=str(exc))
                refused[index] = SteerableError(
                    AgentError.of(
                        ErrorCode.INTERNAL_ERROR,
                        f"the codec refused a {op[0]} write that passed every entry check: {exc}",
                        write=op[0],
                    )
                )
        budget = self._write_timeout
        if self._given_up is not None or self._closed:
            budget = min(budget, _PROBE)  # a failing store answers promptly
        error: SteerableError | None = None
        fenced: set[str] = set()
        try:
            writes = self._statements(batch, prepared)
            statements = writes.close()
            results = (
                self._conns.pipelined(statements, what="write", budget=budget) if statements else []
            )
            fence, added, late = writes.outcome(results)
        except SteerableError as exc:
            self._given_up = exc
            self._gave_up += 1
            error = exc
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter, and logged
            _log.error("postgres_commit_failed", exc_info=True)
            self._failed = exc
            error = SteerableError(
                AgentError.of(ErrorCode.INTERNAL_ERROR, f"storing failed: {exc!r}")
            )
        else:
            self._given_up = None
            refused.update(late)
            self._static_written.update(added)
            self._leased.update(r for r, ok in fence.items() if ok and writes.held[r][1] == 1)
            fenced = {run_id for run_id, ok in fence.items() if not ok}
            self._after_commit(batch, fenced)
        # The runs told here are handled by an idle worker, never on this thread: a handler
        # may flush, i.e. wait for this very thread.
        with handoff_to_workers():
            for index, (op, done, failed) in enumerate(batch):
                why = error if error is not None else refused.get(index)
                if why is None and op[0] == "inbox" and op[1] in fenced:
                    why = message_fenced(op[1], writes.held[op[1]][1])
                if why is None:
                    if op[0] not in FENCED_OPS or op[1] not in fenced:
                        notify_stored(done)  # a refused (fenced) write is never said stored
                else:
                    notify_failed(done, failed, why)
        if fenced and error is None:
            self._fenced(fenced)

    def _after_commit(self, batch: list[tuple[Any, Any, Any]], fenced: set[str]) -> None:
        with self._held_lock:
            for run_id in fenced:
                self._held.pop(run_id, None)
                self._leased.discard(run_id)
            for op, _, _ in batch:
                if op[0] == "checkpoint" and RunState(op[3]["state"]).is_terminal:
                    self._held.pop(op[1], None)
                    self._static_written.discard(op[1])
                    self._leased.discard(op[1])

    def _prepare(self, op: tuple[Any, ...]) -> Any:
        """Encode a write before its transaction (a retry encodes nothing again)."""
        if op[0] == "events":
            return event_rows(op[1], op[2], op[3])
        if op[0] != "checkpoint":
            return None
        snapshot, entries = op[3], op[5]
        static, dynamic = split_snapshot(snapshot)
        static_blob = encode_body("snapshot", static)
        return (
            static_blob,
            encode_body("snapshot", dynamic),
            [encode(entry, kind="entry") for entry in entries],
        )

    def _statements(self, batch: list[tuple[Any, Any, Any]], prepared: dict[int, Any]) -> Batch:
        """One batch's statements (postgres_batch.py), built once: a retry sends them again."""
        agents: dict[str, str] = {}
        locks: set[str] = set()  # runs with a checkpoint or a journal write in the batch
        for op, _, _ in batch:
            if op[0] in FENCED_OPS or op[0] == "inbox":
                agent = op[3]["agent"] if op[0] == "checkpoint" else ""
                agents[op[1]] = agents.get(op[1]) or agent
                if op[0] != "events":
                    locks.add(op[1])
        with self._held_lock:
            held = {r: self._held[r] for r in agents if r in self._held}
        writes = Batch(self._s, held, self._ttl, self._static_written, self._leased)
        writes.lock_leases(agents, locks)
        for index, (op, _, _) in enumerate(batch):
            if index not in prepared:
                continue
            kind = op[0]
            if kind == "checkpoint":
                writes.checkpoint(index, op, prepared[index])
            elif kind == "journal":
                writes.journal(op[1], op[2], op[3])
            elif kind == "inbox":
                writes.inbox(op[1], op[2], op[3], op[4])
            elif kind == "events":
                writes.events(op[1], prepared[index], op[4])
            elif kind == "release":
                writes.release(op[1], op[2], op[3])
        return writes

    def __repr__(self) -> str:
        return f"PostgresStore({_redacted(self._conns.dsn)!r}, schema={self.schema!r})"
