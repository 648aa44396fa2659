"""Stored events in the store contract: the record a run hands its store, and its retention.

A run's event log appends raw records (no model is built on the supervisor's thread); the run
hands the storable ones to its store in batches (`CheckpointStore.append_events`). A store
keeps the last `event_retention` of each run's stream and builds `RunEvent`s only when they
are read (docs/durability.md, "Stored events").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from operator import lt
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
from pydantic_core import to_jsonable_python

from steerable.actors._engine.log import get_logger
from steerable.actors._engine.packing import packb
from steerable.protocol import AgentError, EventKind, Phase, RunEvent
from steerable.protocol.codec import redact

__all__ = [
    "DEFAULT_EVENT_RETENTION",
    "EVENTS_WAKE",
    "EVENT_DELAY",
    "EventHistory",
    "EventRecord",
    "EventWindow",
    "MemoryEvents",
    "WindowedEvents",
    "event_body",
    "event_of",
    "storable",
]

EventRecord = tuple[int, str, "str | None", float, dict[str, Any], str, "str | None"]
"""One event as an event log holds it: (seq, kind, phase, at, data, run_id, parent_run_id),
the kind and phase as their string values (an `EventKind`/`Phase` member is one too)."""


class EventHistory(Protocol):
    """A closed run stream's last events, handed to its store once (`append_history`).

    The records never change: a store may keep the history itself instead of a copy.
    """

    @property
    def first(self) -> int:
        """The seq of its first event."""
        ...

    @property
    def last(self) -> int:
        """The seq of its last event."""
        ...

    def __len__(self) -> int:
        """How many events it holds (`last - first + 1`: every one is storable)."""
        ...

    def records(self) -> list[EventRecord]:
        """Its events, oldest first, their data as a store returns it (JSON-like: lists)."""
        ...


_KINDS: dict[str, EventKind] = {k.value: k for k in EventKind}
_PHASES: dict[str, Phase] = {p.value: p for p in Phase}

_log = get_logger("steerable.store")

DEFAULT_EVENT_RETENTION = 10_000
"""Events kept per run stream by default: as many as a live run's in-memory history."""


def storable(record: EventRecord) -> bool:
    """Whether an event is kept with the run: never a model delta or a live-only custom event."""
    kind = record[1]
    if kind == EventKind.MODEL_DELTA:
        return False
    return not (kind == EventKind.CUSTOM and record[4].get("live", True))


def event_body(trace_id: str, record: EventRecord) -> dict[str, Any]:
    """The JSON-mode body of a `RunEvent` for `record` (what a durable store encodes)."""
    seq, kind, phase, at, data, run_id, parent = record
    return {
        "run_id": run_id,
        "trace_id": trace_id,
        "seq": seq,
        "kind": str(kind),
        "phase": None if phase is None else str(phase),
        "at": at,
        "data": data,
        "parent_run_id": parent,
    }


def event_of(trace_id: str, record: EventRecord) -> RunEvent:
    """The public event of a record an event log produced (already valid: not validated)."""
    seq, kind, phase, at, data, run_id, parent = record
    return RunEvent.model_construct(
        run_id=run_id,
        trace_id=trace_id,
        seq=seq,
        kind=_KINDS[kind],
        phase=None if phase is None else _PHASES[phase],
        at=at,
        data=data,
        parent_run_id=parent,
    )


class MemoryEvents:
    """One stream's stored events in memory, bounded by the store's retention.

    Each batch is kept as one msgpack blob (the values a durable store would return: tuples
    read back as lists), not as record tuples: a long-lived process that keeps thousands of
    runs' events holds a few bytes objects per run, which the garbage collector never walks,
    instead of a tracked tuple and nested dicts per event (docs/performance.md, "Wave 4:
    events"). Decoded only when read. A closed stream's last hand-over is kept as the history
    its log holds (`keep`): no copy, and nothing the collector walks (the log packed its
    tracked data first). Not thread-safe by itself: `MemoryStore` calls it under its lock.
    """

    __slots__ = ("_count", "_last", "_segments", "_skip", "trace_id")

    def __init__(self, trace_id: str, retention: int) -> None:
        del retention  # applied at each add (a store's retention may change between adds)
        self.trace_id = trace_id
        # (events, blob) per batch, oldest first, or (events, history) for a closed stream
        # kept as its log holds it; the first `_skip` events of the first segment are past the
        # retention and never read.
        self._segments: deque[tuple[int, bytes | EventHistory]] = deque()
        self._count = 0  # events in the segments, skipped ones included
        self._skip = 0
        self._last = -1  # the highest stored seq

    def add(self, records: Iterable[EventRecord], retention: int) -> None:
        """Append `records` (in seq order); a seq stored again replaces the stored tail."""
        rows = list(records)
        if not rows:
            return
        seqs = [row[0] for row in rows]
        # Compared in C (`map(lt, ...)`), not by a generator step per event: a run's whole
        # history arrives here at once when its outcome is published.
        ascending = seqs[0] > self._last and all(map(lt, seqs, islice(seqs, 1, None)))
        if not ascending:
            rows = self._merged(rows)
            self._segments.clear()
            self._count = self._skip = 0
        blob, rows = _packed(self.trace_id, rows)
        if rows:
            self._segments.append((len(rows), blob))
            self._count += len(rows)
            self._last = rows[-1][0]
        self._trim(max(1, retention))

    def keep(self, history: EventHistory, retention: int) -> None:
        """Keep a closed stream's `history` itself: nothing is copied or packed.

        The last hand-over of a run that ended (its `RunCell.settle`), on the thread that
        publishes its outcome: packing every event of a long run there cost ~0.6 µs an event,
        ~6% of a W1 iteration (docs/performance.md, "Wave 4: session 18"). Its log packed
        the data the collector would walk before handing it over (`EventLog.store_pending`).
        A history that does not follow the stored tail is merged as `add` merges.
        """
        count = len(history)
        if not count:
            return
        if history.first <= self._last:
            self.add(history.records(), retention)
            return
        self._segments.append((count, history))
        self._count += count
        self._last = history.last
        self._trim(max(1, retention))

    def _merged(self, rows: list[EventRecord]) -> list[EventRecord]:
        # A seq written again (a fenced-out writer never gets here): the stored tail from it
        # on is replaced, as a single list of records would have it.
        kept = self._rows()
        for record in rows:
            while kept and kept[-1][0] >= record[0]:
                kept.pop()
            kept.append(record)
        return kept

    def _trim(self, retention: int) -> None:
        segments = self._segments
        self._skip = max(self._skip, self._count - retention)
        while segments and self._skip >= segments[0][0]:
            count, _ = segments.popleft()
            self._skip -= count
            self._count -= count

    def _rows(self) -> list[EventRecord]:
        out: list[EventRecord] = []
        for _, segment in self._segments:
            out.extend(tuple(row) for row in _segment_rows(segment))
        return out[self._skip :]

    def read(self, start: int, limit: int | None) -> list[RunEvent]:
        """Events with seq >= `start`, oldest first, at most `limit`."""
        out: list[RunEvent] = []
        skip = self._skip
        trace_id = self.trace_id
        for _, segment in self._segments:
            rows = _segment_rows(segment)
            for row in rows[skip:]:
                if row[0] < start:
                    continue
                if limit is not None and len(out) >= limit:
                    return out
                out.append(event_of(trace_id, tuple(row)))
            skip = 0
        return out

    def next_seq(self) -> int:
        """One more than the highest stored seq (0: none)."""
        return self._last + 1 if self._segments else 0


def _segment_rows(segment: bytes | EventHistory) -> list[Any]:
    """A segment's rows: a blob's decoded (lists), a kept history's records (tuples)."""
    if type(segment) is bytes:
        rows: list[Any] = msgpack.unpackb(segment)
        return rows
    assert not isinstance(segment, bytes)
    return segment.records()


def _packed(trace_id: str, rows: list[EventRecord]) -> tuple[bytes, list[EventRecord]]:
    """One blob of `rows`, and the rows it holds: a record msgpack cannot carry as it is
    (a custom event's non-JSON-like data) is converted as the codec converts it, or left out
    and logged as `SqliteStore` leaves it out."""
    try:
        return packb(rows), rows
    except (ValueError, TypeError, OverflowError, RecursionError):
        pass
    kept = []
    for record in rows:
        try:
            msgpack.packb(record, use_bin_type=True, default=_jsonable)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            _log.error("event_not_stored", run_id=record[5], seq=record[0], error=str(exc))
            continue
        kept.append(record)
    return msgpack.packb(kept, use_bin_type=True, default=_jsonable), kept


def _jsonable(value: Any) -> Any:
    # What the codec does with a value msgpack cannot pack itself (docs/checkpoint-format.md).
    return to_jsonable_python(redact(value), inf_nan_mode="constants")


EVENT_DELAY = 0.02
"""Seconds stored events wait for a store's writer at most: the events of that window are
encoded and written together, with whatever else the writer commits then."""

EVENTS_WAKE = object()
"""Queued for the writer when events start waiting (once per window, not once per batch)."""


class EventWindow:
    """The stored events waiting for a store's writer thread (one per store object)."""

    __slots__ = ("_lock", "_pending", "_since")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[Any, Any, Any]] = []
        self._since = 0.0

    def add(self, item: tuple[Any, Any, Any]) -> bool:
        """Keep a writer item; True for the first of a window (tell the writer it waits)."""
        with self._lock:
            first = not self._pending
            if first:
                self._since = time.monotonic()
            self._pending.append(item)
        return first

    def due(self) -> float | None:
        """When the oldest waiting item is due (monotonic); None if none waits."""
        with self._lock:
            return self._since + EVENT_DELAY if self._pending else None

    def take(self, force: bool) -> list[tuple[Any, Any, Any]]:
        """The waiting items once due (or `force`), oldest first; the writer's thread."""
        with self._lock:
            pending = self._pending
            if not pending or (not force and time.monotonic() < self._since + EVENT_DELAY):
                return []
            self._pending = []
        return pending


class WindowedEvents:
    """`append_events` for a store whose writer thread commits a window of events together
    (`SqliteStore`, `PostgresStore`): each batch waits at most `EVENT_DELAY`, and a flush (a
    read, close) makes the writer take them at once."""

    _event_window: EventWindow
    event_retention: int

    if TYPE_CHECKING:  # provided by the store (a stub here would shadow it)
        _queue: Any

        def _check_open(self) -> None: ...

    def append_events(
        self,
        run_id: str,
        trace_id: str,
        records: Sequence[EventRecord],
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        """Hand a batch of the stream of top-level run `run_id` to the writer: encoded and
        committed (fenced) within `EVENT_DELAY`; a seq stored again replaces it."""
        if not records:
            return
        self._check_open()
        op = ("events", run_id, trace_id, tuple(records), self.event_retention)
        if self._event_window.add((op, None, on_failed)):
            self._queue.put(EVENTS_WAKE)  # the writer learns when they are due

    def _events_due(self) -> float | None:
        return self._event_window.due()

    def _take_events(self, force: bool) -> list[tuple[Any, Any, Any]]:
        return self._event_window.take(force)
