"""`SqliteStore`'s writes in SQL: each queued write applied in the writer's transaction.

A base of `SqliteWriter` (split from sqlite_writer.py along its seam): that module drains the
queue and owns the transaction, its retries and its failures; this one turns a batch of
writes into statements, checks each run's lease epoch in the same transaction (`_fence_ok`),
and stores a revision only on top of its predecessor (docs/durability.md, "Ownership").
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.log import get_logger
from steerable.protocol import AgentError, ErrorCode, SteerableError
from steerable.protocol._codec import encode_body

from .lease import Owner, message_fenced
from .sqlite_events import apply_event_batches, apply_events
from .sqlite_files import unavailable
from .sqlite_rows import bound_blob, checksum
from .sqlite_wal import WalCheckpointer
from .store import STATIC_KEYS, TERMINAL_STATES

if TYPE_CHECKING:
    from .sqlite_queue import WriteQueue

__all__ = ["SqliteApply"]

_log = get_logger("steerable.sqlite")

_FENCED_OPS = frozenset({"checkpoint", "journal", "events"})
_INBOX_INSERT = "INSERT OR REPLACE INTO inbox (run_id, seq, message, crc, message_id) "
"""Writes checked against the run's lease epoch (a run's own writes; inbox messages come from
any process)."""


_REVISION_INSERT = (
    "INSERT OR REPLACE INTO revisions (run_id, revision, snapshot, crc, epoch) VALUES (?,?,?,?,?)"
)
_RUNS_UPDATE = "UPDATE runs SET state=?, revision=?, updated_at=? WHERE run_id=?"


class _Deferred:
    """A batch's rows written at its end, one statement per table (W1: a batch holds a run's
    two checkpoints of an iteration, and each statement costs its Python call and its step).

    Only rows nothing else in the batch depends on wait here: a statement of the batch that
    reads or deletes what they would write runs after `write` (`_apply_checkpoint`)."""

    __slots__ = ("entries", "entry_runs", "revisions", "runs")

    def __init__(self) -> None:
        self.revisions: list[tuple[Any, ...]] = []
        self.entries: list[tuple[str, int, bytes, int]] = []
        self.entry_runs: set[str] = set()
        self.runs: dict[str, tuple[Any, ...]] = {}
        """run id -> its last revision's (state, revision, updated_at, run id), for a run
        whose `runs` row is known to hold the revision before this batch's first."""

    def write(self, conn: sqlite3.Connection) -> None:
        if self.revisions:
            conn.executemany(_REVISION_INSERT, self.revisions)
            self.revisions = []
        if self.entries:
            conn.executemany("INSERT INTO entries VALUES (?,?,?,?)", self.entries)
            self.entries = []
            self.entry_runs = set()
        if self.runs:
            conn.executemany(_RUNS_UPDATE, list(self.runs.values()))
            self.runs = {}


class SqliteApply:
    """The SQL of the writer's batches (`SqliteWriter` runs them in its transaction)."""

    path: Path
    _take_events: Callable[[bool], list[tuple[Any, Any, Any]]]
    """The stored events due (or all, forced) for the next commit (`SqliteEvents`)."""
    _events_due: Callable[[], float | None]
    """When the oldest waiting event is due (monotonic), None if none waits."""
    _queue: WriteQueue
    _writer_conn: sqlite3.Connection
    _max_batch: int
    _write_timeout: float
    _closing: threading.Event
    _failed: BaseException | None
    _given_up: BaseException | None
    _retries: int
    _gave_up: int
    _static_written: set[str]
    _static_added: list[str]
    _held: dict[str, tuple[Owner, int]]
    _held_lock: threading.Lock
    _ttl: float
    _fenced_now: set[str]
    _write_lock: threading.Lock
    _commit_lock: threading.Lock
    _busy_ms: int
    _puts_seen: int
    _put_at: float
    _conn_closed: bool
    _entries_len: dict[str, tuple[int, int]]
    _journal_empty: dict[str, int]
    _runs_rev: dict[str, tuple[int, int]]
    _wal: WalCheckpointer

    if TYPE_CHECKING:  # provided by SqliteOwnership and CheckpointStore (no stub shadows them)

        @staticmethod
        def _now() -> float: ...

        def _fenced(self, run_ids: Collection[str]) -> None: ...

    def _apply_batch(
        self,
        conn: sqlite3.Connection,
        prepared: list[tuple[Any, ...] | None],
        fence: dict[str, bool],
        refused: dict[int, SteerableError],
    ) -> None:
        """Apply a batch's writes in order, with fewer statements than one by one.

        A journal row is written at the end of the transaction, unless a checkpoint of its
        run that clears the journal (an empty plan) is stored after it in the same batch: the
        transcript of that checkpoint holds the result, and the row would be deleted in the
        same transaction (W1: a result and the boundary after it often share one batch).
        Checkpoints' revision and entry rows, and the `runs` row of a run whose stored
        revision is known (`_Deferred`), are written at the end too, one statement per table;
        so are stored events, one statement per run (the batches its supervisor handed over
        in the window, in order).
        """
        pending: dict[str, list[tuple[str, str, bytes, int]]] = {}
        events: dict[tuple[str, str, int], list[Any]] = {}  # (run, trace, retention) -> batches
        deferred = _Deferred()
        for index, op in enumerate(prepared):
            if op is None:
                continue
            kind = op[0]
            if kind == "journal":
                _, run_id, call_id, blob = op
                if self._fence_ok(conn, run_id, "", fence):
                    pending.setdefault(run_id, []).append((run_id, call_id, blob, checksum(blob)))
                continue
            if kind == "events":
                _, run_id, trace_id, records, retention = op
                if self._fence_ok(conn, run_id, "", fence):
                    events.setdefault((run_id, trace_id, retention), []).append(records)
                continue
            why = self._apply(conn, op, fence, deferred)
            if why is not None:
                refused[index] = why
            elif kind == "checkpoint" and op[1] in pending and fence[op[1]] and not op[3]["plan"]:
                del pending[op[1]]
        deferred.write(conn)
        for run_id, rows in pending.items():
            conn.executemany("INSERT OR REPLACE INTO journal VALUES (?,?,?,?)", rows)
            self._journal_empty.pop(run_id, None)
        for (run_id, trace_id, retention), batches in events.items():
            apply_event_batches(conn, run_id, trace_id, batches, retention)

    def _apply_one(
        self, conn: sqlite3.Connection, op: tuple[Any, ...], fence: dict[str, bool]
    ) -> SteerableError | None:
        """Apply one write inside its own savepoint (after `_apply` met a ValueError no
        encoding foresaw): such a write is rolled back alone and reported to its waiter; the
        rest of the batch commits."""
        conn.execute("SAVEPOINT op")
        try:
            why = self._apply(conn, op, fence)
        except ValueError as exc:
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            if op[0] == "checkpoint":
                self._static_written.discard(op[1])
                self._entries_len.pop(op[1], None)
                self._journal_empty.pop(op[1], None)
                self._runs_rev.pop(op[1], None)
            return self._codec_refused(op[0], exc)
        conn.execute("RELEASE op")
        return why

    def _fence_ok(
        self, conn: sqlite3.Connection, run_id: str, agent: str, fence: dict[str, bool]
    ) -> bool:
        """Whether this store object may write for `run_id` (in the write's transaction)."""
        ok = fence.get(run_id)
        if ok is not None:
            return ok
        with self._held_lock:
            held = self._held.get(run_id)
        if held is None:
            ok = True  # not a run this store object owns (a store without a runtime's leases)
        else:
            owner, epoch = held
            row = conn.execute(
                "SELECT owner, epoch FROM leases WHERE run_id=?", (run_id,)
            ).fetchone()
            if row is None:
                ok = epoch == 1  # a new run: its first write makes its lease
                if ok:
                    conn.execute(
                        "INSERT INTO leases VALUES (?,?,?,?,?,?,?)",
                        (
                            run_id,
                            owner.instance_id,
                            owner.host,
                            owner.pid,
                            1,
                            self._now() + self._ttl,
                            agent,
                        ),
                    )
            else:
                ok = (row[0], row[1]) == (owner.instance_id, epoch)
            if not ok:
                with self._held_lock:
                    if self._held.get(run_id) == held:
                        del self._held[run_id]
        fence[run_id] = ok
        return ok

    def _apply(
        self,
        conn: sqlite3.Connection,
        op: tuple[Any, ...],
        fence: dict[str, bool],
        deferred: _Deferred | None = None,
    ) -> SteerableError | None:
        kind = op[0]
        if kind == "checkpoint":
            if not self._fence_ok(conn, op[1], op[3]["agent"], fence):
                return None
            return self._apply_checkpoint(conn, *op[1:], deferred=deferred)
        if kind == "journal":
            _, run_id, call_id, blob = op
            if self._fence_ok(conn, run_id, "", fence):
                conn.execute(
                    "INSERT OR REPLACE INTO journal VALUES (?,?,?,?)",
                    (run_id, call_id, blob, checksum(blob)),
                )
                self._journal_empty.pop(run_id, None)
        elif kind == "inbox":
            _, run_id, seq, blob, message_id = op
            with self._held_lock:
                held = self._held.get(run_id)
            if not self._fence_ok(conn, run_id, "", fence):
                return message_fenced(run_id, 0 if held is None else held[1])
            conn.execute(
                _INBOX_INSERT + "VALUES (?,?,?,?,?)",
                (run_id, seq, blob, checksum(blob), message_id),
            )
        elif kind == "events":
            _, run_id, trace_id, records, retention = op
            if self._fence_ok(conn, run_id, "", fence):
                apply_events(conn, run_id, trace_id, records, retention)
        elif kind == "release":
            _, run_id, owner, epoch = op
            conn.execute(
                "UPDATE leases SET expires_at=0 WHERE run_id=? AND owner=? AND epoch=?",
                (run_id, owner, epoch),
            )
        return None

    def _apply_checkpoint(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        rows: list[tuple[str, int, bytes, int]],
        dynamic: bytes,
        static: bytes | None,
        *,
        deferred: _Deferred | None = None,
    ) -> SteerableError | None:
        """Write one revision, only on top of the previous one: after a write of this run
        was given up, its later revisions are refused (the store keeps its last good one)
        rather than stored with a hole in their transcript. Returns the refusal, if any.

        With `deferred` (a batch's), the rows nothing else in the batch reads wait for its
        end (`_Deferred`).
        """
        with self._held_lock:
            held = self._held.get(run_id)
        epoch = 0 if held is None else held[1]
        if not self._store_run_row(conn, run_id, revision, snapshot, static, held, deferred):
            self._runs_rev.pop(run_id, None)
            return unavailable(
                f"revision {revision} of run {run_id} not stored: an earlier revision of the "
                "run was not stored (its write was given up)",
                run_id=run_id,
                revision=revision,
            )
        if held is not None:
            self._runs_rev[run_id] = (epoch, revision)
        revision_row = (run_id, revision, bound_blob(dynamic), checksum(dynamic), epoch)
        if deferred is not None:
            deferred.revisions.append(revision_row)
        else:
            conn.execute(_REVISION_INSERT, revision_row)
        if rows:
            # A resumed run rewrites from its length: entries past it go. Known to be none
            # when this store object wrote the run's last entries under the same lease (its
            # fence holds, so nobody else wrote since): the DELETE is skipped then.
            if held is None or self._entries_len.get(run_id) != (epoch, entries_from):
                if deferred is not None and run_id in deferred.entry_runs:
                    deferred.write(conn)  # rows of this run it holds come before the DELETE
                conn.execute(
                    "DELETE FROM entries WHERE run_id=? AND idx>=?", (run_id, entries_from)
                )
            if deferred is not None:
                deferred.entries.extend(rows)
                deferred.entry_runs.add(run_id)
            else:
                conn.executemany("INSERT INTO entries VALUES (?,?,?,?)", rows)
            if held is not None:
                self._entries_len[run_id] = (epoch, entries_from + len(rows))
        if not snapshot["plan"] and (held is None or self._journal_empty.get(run_id) != epoch):
            # The plan's results are in the transcript now. Known to be no rows when this
            # store object cleared them under the same lease and wrote none since.
            conn.execute("DELETE FROM journal WHERE run_id=?", (run_id,))
            if held is not None:
                self._journal_empty[run_id] = epoch
        if snapshot["state"] in TERMINAL_STATES:
            self._static_written.discard(run_id)
            self._entries_len.pop(run_id, None)
            self._journal_empty.pop(run_id, None)
            self._runs_rev.pop(run_id, None)
            # Nobody needs a finished run's lease: released with its last write.
            conn.execute("UPDATE leases SET expires_at=0 WHERE run_id=?", (run_id,))
            with self._held_lock:
                self._held.pop(run_id, None)
        return None

    def _store_run_row(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        static: bytes | None,
        held: tuple[Owner, int] | None,
        deferred: _Deferred | None,
    ) -> bool:
        """Move the run's `runs` row to `revision` if it holds the previous one (or none).

        Deferred to the batch's end when this writer knows the row holds the previous
        revision: it wrote it under the same lease epoch, and the fence holds (nobody else
        wrote since); else the statement checks, and runs after what the batch deferred for
        the run."""
        if (
            deferred is not None
            and held is not None
            and run_id in self._static_written
            and self._runs_rev.get(run_id) == (held[1], revision - 1)
        ):
            deferred.runs[run_id] = (snapshot["state"], revision, snapshot["updated_at"], run_id)
            return True
        if deferred is not None and run_id in deferred.runs:
            deferred.write(conn)  # the statement below reads the row's revision
        if run_id in self._static_written:
            cursor = conn.execute(
                _RUNS_UPDATE + " AND revision>=?",
                (snapshot["state"], revision, snapshot["updated_at"], run_id, revision - 1),
            )
            return cursor.rowcount == 1
        # Once per run and process: config, capabilities and the task never change while
        # a run lives, so revisions store only what does (W4: bytes <= 3x the transcript).
        if static is None:
            static = encode_body("snapshot", {key: snapshot[key] for key in STATIC_KEYS})
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
                static,
                checksum(static),
            ),
        )
        if cursor.rowcount != 1:
            return False
        self._static_written.add(run_id)
        self._static_added.append(run_id)
        return True

    def _codec_refused(self, kind: str, exc: ValueError) -> SteerableError:
        _log.error("sqlite_write_refused", path=str(self.path), op=kind, error=str(exc))
        return SteerableError(
            AgentError.of(
                ErrorCode.INTERNAL_ERROR,
                f"the codec refused a {kind} write that passed every entry check: {exc}",
                write=kind,
            )
        )
