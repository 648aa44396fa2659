"""`SqliteStore`'s stored events: the writer's batch op, and the reads (docs/durability.md).

A run hands its storable events to the store in batches (`append_events`): the batch is queued
to the writer thread like a journal entry, so it is encoded there and committed in the same
transaction as the checkpoint and journal writes queued with it, fenced by the run's lease
epoch. The `events` table keeps the last `event_retention` events of each run's stream.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from steerable.actors._engine.log import get_logger
from steerable.protocol import RunEvent, RunState
from steerable.protocol._codec import encode_bodies

from .events import EventRecord, WindowedEvents, event_body
from .sqlite_rows import bound_blob, decoded
from .store import corrupt_row, not_found

if TYPE_CHECKING:
    from .sqlite_queue import WriteQueue

__all__ = ["SqliteEvents", "apply_event_batches", "apply_events"]

_log = get_logger("steerable.sqlite")


def apply_events(
    conn: sqlite3.Connection,
    run_id: str,
    trace_id: str,
    records: Sequence[EventRecord],
    retention: int,
) -> None:
    """Insert one batch of a stream's events (in the writer's transaction), then trim it.

    An event the codec refuses is left out and logged: the rest of its batch is stored.
    """
    apply_event_batches(conn, run_id, trace_id, [records], retention)


def apply_event_batches(
    conn: sqlite3.Connection,
    run_id: str,
    trace_id: str,
    batches: Sequence[Sequence[EventRecord]],
    retention: int,
) -> None:
    """Insert the batches of one stream a commit holds with one statement, then trim once.

    The trim keeps `retention` seqs up to the highest of the batches' last stored seqs (what
    the last of one-by-one trims would keep; W1: tens of batches per commit, one statement).
    An event the codec refuses is left out and logged: the rest of its batch is stored.
    """
    records = batches[0] if len(batches) == 1 else [r for batch in batches for r in batch]
    # One packer for them all (the same bytes as `encode_body` per event).
    blobs = iter(encode_bodies("event", [event_body(trace_id, record) for record in records]))
    rows = []
    crc32 = zlib.crc32
    newest: int | None = None
    for batch in batches:
        last = None
        for record in batch:
            blob = next(blobs)
            if isinstance(blob, ValueError):
                _log.error("event_not_stored", run_id=run_id, seq=record[0], error=str(blob))
                continue
            rows.append((run_id, record[0], bound_blob(blob), crc32(blob)))
            last = record[0]
        if last is not None and (newest is None or last > newest):
            newest = last
    if newest is None:
        return
    conn.executemany("INSERT OR REPLACE INTO events VALUES (?,?,?,?)", rows)
    oldest = newest - max(1, retention) + 1
    if oldest > 0:
        conn.execute("DELETE FROM events WHERE run_id=? AND seq<?", (run_id, oldest))


class SqliteEvents(WindowedEvents):
    """Stored events for `SqliteStore` (which provides the connections and the writer)."""

    _queue: WriteQueue
    stores_events = True
    event_retention: int

    def _reader(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def flush(self, timeout: float | None = None) -> bool:
        raise NotImplementedError

    def events(self, run_id: str, start: int = 0, limit: int | None = None) -> list[RunEvent]:
        """The stored events of the run's stream with seq >= `start`, oldest first.

        Raises:
            SteerableError: `not_found` for a run the store does not know; `checkpoint_corrupt`
                for a row whose checksum fails or that does not decode.
        """
        self.flush()
        conn = self._reader()
        rows = conn.execute(
            "SELECT seq, event, crc FROM events WHERE run_id=? AND seq>=? ORDER BY seq LIMIT ?",
            (run_id, start, -1 if limit is None else limit),
        ).fetchall()
        if (
            not rows
            and conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is None
        ):
            raise not_found(run_id)
        return [
            decoded(blob, crc, run_id, None, f"event {seq}", "event") for seq, blob, crc in rows
        ]

    def run_state(self, run_id: str) -> RunState:
        """The run's state as last stored (one indexed read: what a follower polls).

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` for a state steerable lacks.
        """
        self.flush()
        row = self._reader().execute("SELECT state FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise not_found(run_id)
        try:
            return RunState(row[0])
        except ValueError:
            raise corrupt_row(run_id, None, f"unknown state {str(row[0])[:40]!r}") from None

    def next_event_seq(self, run_id: str) -> int:
        """One more than the highest stored seq of the run's stream (0: none)."""
        self.flush()
        row = (
            self._reader()
            .execute("SELECT MAX(seq) FROM events WHERE run_id=?", (run_id,))
            .fetchone()
        )
        return 0 if row is None or row[0] is None else int(row[0]) + 1
