"""Stored events in the store contract: the record a run hands its store, and its retention.

A run's event log appends raw records (no model is built on the supervisor's thread); the run
hands the storable ones to its store in batches (`CheckpointStore.append_events`). A store
keeps the last `event_retention` of each run's stream and builds `RunEvent`s only when they
are read (docs/durability.md, "Stored events").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from steerable.protocol import EventKind, Phase, RunEvent

__all__ = [
    "DEFAULT_EVENT_RETENTION",
    "EventRecord",
    "MemoryEvents",
    "event_body",
    "event_of",
    "storable",
]

EventRecord = tuple[int, str, "str | None", float, dict[str, Any], str, "str | None"]
"""One event as an event log holds it: (seq, kind, phase, at, data, run_id, parent_run_id),
the kind and phase as their string values (an `EventKind`/`Phase` member is one too)."""

_KINDS: dict[str, EventKind] = {k.value: k for k in EventKind}
_PHASES: dict[str, Phase] = {p.value: p for p in Phase}

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

    Not thread-safe by itself: `MemoryStore` calls it under its lock.
    """

    __slots__ = ("records", "trace_id")

    def __init__(self, trace_id: str, retention: int) -> None:
        self.trace_id = trace_id
        self.records: deque[EventRecord] = deque(maxlen=max(1, retention))

    def add(self, records: Iterable[EventRecord], retention: int) -> None:
        """Append `records` (in seq order); a seq stored again replaces the stored tail."""
        kept = self.records
        if kept.maxlen != max(1, retention):
            kept = self.records = deque(kept, maxlen=max(1, retention))
        for record in records:
            while kept and kept[-1][0] >= record[0]:
                kept.pop()  # a seq written again (a fenced-out writer never gets here)
            kept.append(record)

    def read(self, start: int, limit: int | None) -> list[RunEvent]:
        """Events with seq >= `start`, oldest first, at most `limit`."""
        out: list[RunEvent] = []
        for record in self.records:
            if record[0] < start:
                continue
            if limit is not None and len(out) >= limit:
                break
            out.append(event_of(self.trace_id, record))
        return out

    def next_seq(self) -> int:
        """One more than the highest stored seq (0: none)."""
        return self.records[-1][0] + 1 if self.records else 0
