"""`PostgresStore`'s stored events (docs/durability.md, "Stored events").

A run hands its storable events to the store in batches (`append_events`); they wait for the
writer at most `EVENT_DELAY` (20 ms, as in SQLite), then the writer encodes each as a codec
envelope of kind `event` (a `RunEvent` body) and commits that window's events in one
statement, in the same transaction as whatever else it writes then, fenced by each run's lease
epoch (postgres_batch.py). Reading events, a flush and `close` write the waiting ones first.
The `events` table keeps the last `event_retention` events of each run's stream.
"""

from __future__ import annotations

import queue
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.log import get_logger
from steerable.protocol import RunEvent, RunState
from steerable.protocol._codec import encode_body

from .events import WindowedEvents
from .sqlite_rows import decoded
from .store import corrupt_row, not_found

if TYPE_CHECKING:
    import psycopg

    from .postgres_conn import Connections

__all__ = ["DEFAULT_EVENT_RETENTION", "PostgresEvents", "event_rows"]

_log = get_logger("steerable.postgres")

DEFAULT_EVENT_RETENTION = 10_000
"""Events kept per run stream by default (as many as a live run's in-memory history)."""


def _value(member: Any) -> Any:
    return getattr(member, "value", member)


def event_rows(
    run_id: str, trace_id: str, records: Sequence[tuple[Any, ...]]
) -> list[tuple[str, int, bytes, int]]:
    """The rows of one batch, each record `(seq, kind, phase, at, data, run_id, parent_run_id)`
    encoded as a `RunEvent` body; one the codec refuses is left out and logged."""
    rows = []
    for seq, kind, phase, at, data, source, parent in records:
        body = {
            "run_id": source,
            "trace_id": trace_id,
            "seq": seq,
            "kind": _value(kind),
            "phase": None if phase is None else _value(phase),
            "at": at,
            "data": data,
            "parent_run_id": parent,
        }
        try:
            blob = encode_body("event", body)
        except ValueError as exc:
            _log.error("event_not_stored", run_id=run_id, seq=seq, error=str(exc))
            continue
        rows.append((run_id, int(seq), blob, zlib.crc32(blob)))
    return rows


class PostgresEvents(WindowedEvents):
    """Stored events for `PostgresStore` (which provides the connections and the writer)."""

    _queue: queue.SimpleQueue[Any]
    _conns: Connections
    _s: str
    stores_events = True
    event_retention: int = DEFAULT_EVENT_RETENTION

    def _check_open(self) -> None:
        raise NotImplementedError

    def flush(self, timeout: float | None = None) -> bool:
        raise NotImplementedError

    def events(self, run_id: str, start: int = 0, limit: int | None = None) -> list[RunEvent]:
        """The stored events of the run's stream with seq >= `start`, oldest first.

        Raises:
            SteerableError: `not_found` for a run the store knows neither by a checkpoint nor
                by an event; `checkpoint_corrupt` for a row that fails its checksum or does
                not decode.
        """
        self.flush()
        s = self._s

        def read(conn: psycopg.Connection[Any]) -> tuple[list[Any], bool]:
            rows = conn.execute(
                f"SELECT seq, event, crc FROM {s}.events WHERE run_id=%s AND seq>=%s "
                "ORDER BY seq LIMIT %s",
                (run_id, start, limit),
            ).fetchall()
            known = bool(rows) or (
                conn.execute(f"SELECT 1 FROM {s}.runs WHERE run_id=%s", (run_id,)).fetchone()
                is not None
            )
            return rows, known

        rows, known = self._conns.run(read, what="read", read_only=True)
        if not known:
            raise not_found(run_id)
        return [
            decoded(bytes(blob), crc, run_id, None, f"event {seq}", "event")
            for seq, blob, crc in rows
        ]

    def run_state(self, run_id: str) -> RunState:
        """The run's state as last stored (one indexed read: what a follower polls).

        Raises:
            SteerableError: `not_found`; `checkpoint_corrupt` for a state steerable lacks.
        """
        self.flush()
        s = self._s
        row = self._conns.run(
            lambda c: c.execute(
                f"SELECT state FROM {s}.runs WHERE run_id=%s", (run_id,)
            ).fetchone(),
            what="read",
        )
        if row is None:
            raise not_found(run_id)
        try:
            return RunState(row[0])
        except ValueError:
            raise corrupt_row(run_id, None, f"unknown state {str(row[0])[:40]!r}") from None

    def next_event_seq(self, run_id: str) -> int:
        """One more than the highest stored seq of the run's stream (0: none)."""
        self.flush()
        s = self._s
        row = self._conns.run(
            lambda c: c.execute(
                f"SELECT MAX(seq) FROM {s}.events WHERE run_id=%s", (run_id,)
            ).fetchone(),
            what="read",
        )
        return 0 if row is None or row[0] is None else int(row[0]) + 1
