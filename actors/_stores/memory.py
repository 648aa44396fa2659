"""`MemoryStore`: the in-memory default store (split from store.py along its seam).

Records are immutable, so it keeps them as objects rather than bytes, except each revision's
per-revision body, kept as msgpack bytes (`_Revision`): the collector does not walk bytes, and
a finished run a host still holds would otherwise keep ~3 tracked dicts per revision for every
full collection to walk (docs/performance.md, "GC-tracked objects"). Ownership is its
`LeaseTable`, stored events its per-stream `MemoryEvents` (docs/durability.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

import msgpack

from steerable.actors._engine.packing import packb
from steerable.protocol import (
    AgentError,
    HostMessage,
    RunEvent,
    RunState,
    SteerableError,
    StoredRun,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)
from steerable.protocol._codec import (
    _MASK,
    _MEMBERS,
    MAX_MESSAGE_BYTES,
    _pack,
    _serializer_of,
    decode,
)
from steerable.protocol._stored import LazyEntries

from .events import EventHistory, EventRecord, MemoryEvents
from .lease import Lease, LeaseTable, Owner
from .store import (
    STATIC_KEYS,
    TERMINAL_STATES,
    CheckpointStore,
    RevisionInfo,
    RunSummary,
    _validated,
    check_record,
    corrupt_row,
    dynamic_part,
    not_found,
)

__all__ = ["MemoryStore"]


_Revision = tuple[int, str, int, float, bytes | dict[str, Any]]
"""One stored revision: `(revision, state, transcript_len, updated_at, body)`, what listing reads
and the per-revision body as msgpack bytes (the dict itself if msgpack cannot pack it). A plain
tuple of atomic values, so the collector untracks it at its first pass (it never untracks a
tuple subclass such as a NamedTuple)."""
_REVISION: Final = 0
_STATE: Final = 1
_TRANSCRIPT_LEN: Final = 2
_UPDATED_AT: Final = 3
_BODY: Final = 4


def _revision(revision: int, dynamic: dict[str, Any]) -> _Revision:
    body: bytes | dict[str, Any]
    try:
        # No `default`: anything msgpack does not carry as itself (a secret, a model, an int
        # past 64 bits) keeps the dict, so that a load returns what was written.
        body = packb(dynamic)
    except (TypeError, ValueError, OverflowError):
        body = dynamic
    get = dynamic.get  # a body load would refuse is stored as it is: load validates it
    return (
        get("revision", revision),
        str(get("state", "")),
        get("transcript_len", 0),
        get("updated_at", 0.0),
        body,
    )


def _dynamic(stored: _Revision) -> dict[str, Any]:
    body = stored[_BODY]
    if type(body) is bytes:
        unpacked: dict[str, Any] = msgpack.unpackb(body, raw=False, strict_map_key=False)
        return unpacked
    assert isinstance(body, dict)
    return body


_ENTRY_TYPES = frozenset(_MEMBERS["entry"])
_PACK_AT_END = 256
"""An ended run's transcript is kept encoded up to this many entries (~6 µs each, ~1.5 ms of
CPU at most on the supervisor's thread that writes the last checkpoint); a longer one keeps its
records as objects, so that no run's end stalls that thread for tens of milliseconds."""


def _packed_entry(entry: Any) -> Any:
    """An entry as a durable store encodes it, or the entry itself if that would change it.

    A record holding a secret stays an object (the codec would store a reference in its
    place, and a load would not return the secret), as does one the codec refuses.
    """
    if type(entry) not in _ENTRY_TYPES:
        return entry  # bytes already, or a record the "entry" kind does not carry
    try:
        data = _pack("entry", _serializer_of(type(entry)).to_python(entry, mode="json"))
    except (ValueError, TypeError, OverflowError, RecursionError):
        return entry
    if _MASK in data or len(data) > MAX_MESSAGE_BYTES:
        return entry
    return data


class _MemRun:
    __slots__ = ("entries", "journal", "message_ids", "messages", "revisions", "static")

    def __init__(self) -> None:
        self.static: dict[str, Any] = {}
        self.revisions: list[_Revision] = []
        self.entries: list[Any] = []  # TranscriptEntry, or its bytes once the run ended
        self.messages: list[HostMessage] = []
        self.journal: dict[str, ToolResult | SubagentResult] = {}
        self.message_ids: dict[str, int] = {}


class MemoryStore(CheckpointStore):
    """Keeps checkpoints in memory: the default, for runs that need not survive the process.

    Records are immutable, so it keeps them as objects rather than bytes: a checkpoint costs
    a few microseconds (W4), and a passivated run wakes without decoding. Loading validates
    the snapshot as a durable store's load does. An ended run's stored events are its event
    log as the run left it (`append_history`): nothing is copied or packed as the outcome is
    published, for about twice the memory a packed copy takes (~210 bytes an event, not ~100).
    """

    durable = False
    fences = True
    stores_events = True
    keeps_history = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, _MemRun] = {}
        self._events: dict[str, MemoryEvents] = {}
        self._leases = LeaseTable()
        self._ttl = 5.0  # a new run's first lease; renewals use the runtime's ttl

    def _run(self, run_id: str) -> _MemRun:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _MemRun()
        return run

    def append_message(
        self, run_id: str, message: HostMessage, *, message_id: str | None = None
    ) -> None:
        check_record(message)
        with self._lock:
            run = self._run(run_id)
            run.messages.append(message)
            if message_id is not None:
                run.message_ids.setdefault(message_id, message.seq)

    def message_seq(self, run_id: str, message_id: str) -> int | None:
        with self._lock:
            run = self._runs.get(run_id)
            return None if run is None else run.message_ids.get(message_id)

    def journal(
        self,
        run_id: str,
        result: ToolResult | SubagentResult,
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        del on_failed  # kept in memory: it cannot fail later
        check_record(result)
        with self._lock:
            if not self._leases.check(run_id, self._ttl):
                fenced = True
            else:
                fenced = False
                self._run(run_id).journal[result.call_id] = result
        if fenced:
            self._fenced([run_id])

    def append_events(
        self,
        run_id: str,
        trace_id: str,
        records: Sequence[EventRecord],
        *,
        on_failed: Callable[[AgentError], None] | None = None,
    ) -> None:
        del on_failed  # kept in memory: it cannot fail later
        if records:
            self._to_stream(run_id, trace_id, lambda stream, keep: stream.add(records, keep))

    def append_history(self, run_id: str, trace_id: str, history: EventHistory) -> None:
        """Keep a closed stream's last events as the history its run's log holds (no copy)."""
        self._to_stream(run_id, trace_id, lambda stream, keep: stream.keep(history, keep))

    def _to_stream(
        self, run_id: str, trace_id: str, write: Callable[[MemoryEvents, int], None]
    ) -> None:
        """`write(stream, retention)` to the run's stream under the lock, fenced like `journal`."""
        with self._lock:
            fenced = not self._leases.check(run_id, self._ttl)
            if not fenced:
                stream = self._events.get(run_id)
                if stream is None:
                    stream = self._events[run_id] = MemoryEvents(trace_id, self.event_retention)
                write(stream, self.event_retention)
        if fenced:
            self._fenced([run_id])

    def events(self, run_id: str, start: int = 0, limit: int | None = None) -> list[RunEvent]:
        with self._lock:
            stream = self._events.get(run_id)
            if stream is None:
                if run_id in self._runs:
                    return []
                raise not_found(run_id)
            return stream.read(start, limit)

    def next_event_seq(self, run_id: str) -> int:
        with self._lock:
            stream = self._events.get(run_id)
            return 0 if stream is None else stream.next_seq()

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
        del on_failed  # stored before this returns, or it raises
        # What a durable store writes per revision (W4), packed outside the lock.
        dynamic = _revision(revision, dynamic_part(snapshot))
        with self._lock:
            if not self._leases.check(run_id, self._ttl, snapshot["agent"]):
                fenced = True
            else:
                fenced = False
                self._store_checkpoint(run_id, revision, snapshot, dynamic, entries_from, entries)
        if fenced:
            self._fenced([run_id])
            return
        if on_stored is not None:
            on_stored()

    def compact(self, run_id: str) -> None:
        """Keep an ended run's transcript encoded, as a durable store keeps it.

        A finished run's entries are pydantic models (three or more objects each the collector
        tracks: the model, its `__dict__`, its `__pydantic_fields_set__`, and nested models),
        kept while anyone may load the run and walked by every full collection; bytes are not
        walked (docs/performance.md, "GC-tracked objects"). A load hands them out as
        `LazyEntries`, decoded as they are read, as the durable stores do. Encoded outside the
        lock; an entry rewritten meanwhile keeps its new value. Only up to `_PACK_AT_END`
        entries, and only for a run whose last revision is terminal. Called by the run's
        supervisor once its outcome is published: encoding ~6 µs an entry, on a thread that
        has just woken from the run's last tool, took 60-100 µs off every W3 cancellation's
        path to `result()` when it was done as the terminal revision was written.
        """
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.revisions or run.revisions[-1][_STATE] not in TERMINAL_STATES:
                return
            entries = run.entries
            if len(entries) > _PACK_AT_END:
                return
            todo = [(i, e) for i, e in enumerate(entries) if type(e) is not bytes]
        packed = [(i, e, _packed_entry(e)) for i, e in todo]
        with self._lock:
            for i, entry, data in packed:
                if data is not entry and i < len(entries) and entries[i] is entry:
                    entries[i] = data

    def _store_checkpoint(
        self,
        run_id: str,
        revision: int,
        snapshot: dict[str, Any],
        dynamic: _Revision,
        entries_from: int,
        entries: Sequence[TranscriptEntry],
    ) -> None:
        # Called under the lock.
        run = self._run(run_id)
        if not run.static or revision == 0:
            run.static = {k: snapshot[k] for k in STATIC_KEYS}
        if entries:
            del run.entries[entries_from:]  # a resumed run rewrites from its length
            run.entries.extend(entries)
        del run.revisions[revision:]
        run.revisions.append(dynamic)
        if not snapshot["plan"]:
            run.journal.clear()  # the plan's results are in the transcript now
        if snapshot["state"] in TERMINAL_STATES:
            self._leases.ended(run_id)

    # ------------------------------------------------------------------ ownership

    def register_new(self, run_id: str, owner: Owner, ttl: float) -> None:
        with self._lock:
            self._ttl = ttl
            self._leases.register_new(run_id, owner)

    def claim(self, run_id: str, owner: Owner, ttl: float, *, force: bool = False) -> Lease:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.revisions:
                raise not_found(run_id)
            return self._leases.claim(run_id, owner, ttl, force=force, agent=run.static["agent"])

    def renew(self, owner: Owner, run_ids: Collection[str], ttl: float) -> set[str]:
        with self._lock:
            self._ttl = ttl
            return self._leases.renew(owner, run_ids, ttl)

    def release_lease(self, run_id: str, owner: Owner) -> None:
        with self._lock:
            self._leases.release(run_id, owner)

    def claim_orphans(
        self, owner: Owner, ttl: float, agents: Collection[str], limit: int = 16
    ) -> tuple[list[Lease], list[tuple[str, str]]]:
        taken: list[Lease] = []
        left: list[tuple[str, str]] = []
        with self._lock:
            for run_id, run in sorted(self._runs.items()):
                if not run.revisions or run.static.get("parent_run_id") is not None:
                    continue
                if RunState(run.revisions[-1][_STATE]).is_terminal:
                    continue
                if not self._leases.expired(run_id):
                    continue
                agent = run.static["agent"]
                if agent not in agents:
                    left.append((run_id, agent))
                elif len(taken) < limit:
                    taken.append(self._leases.claim(run_id, owner, ttl, force=False, agent=agent))
        return taken, left

    def lease(self, run_id: str) -> Lease | None:
        with self._lock:
            return self._leases.leases.get(run_id)

    def load(self, run_id: str, revision: int | None = None) -> StoredRun:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not run.revisions:
                raise not_found(run_id)
            index = len(run.revisions) - 1 if revision is None else revision
            if not 0 <= index < len(run.revisions):
                raise not_found(run_id, revision)
            stored = run.revisions[index]
            latest = index == len(run.revisions) - 1
            entries = list(run.entries)
            journal = dict(run.journal) if latest else {}
            messages = list(run.messages)
        body = {**run.static, **_dynamic(stored)}
        snapshot = _validated(body, run_id=run_id, revision=index)
        transcript: Sequence[Any] = entries[: snapshot.transcript_len]
        if any(type(e) is bytes for e in transcript):

            def entry(i: int, blob: bytes) -> TranscriptEntry:
                try:
                    record: TranscriptEntry = decode(blob, kind="entry")
                except SteerableError as exc:
                    raise corrupt_row(run_id, index, f"entry {i}: {exc.error.message}") from None
                return record

            # LazyEntries keeps what is not bytes as it is (a record left as an object).
            transcript = LazyEntries(transcript, entry)
        return StoredRun(
            snapshot=snapshot,
            transcript=transcript,
            journal=journal,
            messages=[m for m in messages if m.seq > snapshot.last_seq] if latest else [],
        )

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        with self._lock:
            run = self._runs.get(run_id)
            bodies = list(run.revisions) if run is not None else []
        if not bodies:
            raise not_found(run_id)
        return [
            RevisionInfo(
                run_id=run_id,
                revision=body[_REVISION],
                state=RunState(body[_STATE]),
                transcript_len=body[_TRANSCRIPT_LEN],
                updated_at=body[_UPDATED_AT],
            )
            for body in bodies
        ]

    def runs(self) -> list[RunSummary]:
        with self._lock:
            latest = [
                (rid, r.static, r.revisions[-1]) for rid, r in self._runs.items() if r.revisions
            ]
        out = [
            RunSummary(
                run_id=run_id,
                state=RunState(body[_STATE]),
                revision=body[_REVISION],
                task=static["task"],
                agent=static["agent"],
                parent_run_id=static["parent_run_id"],
                updated_at=body[_UPDATED_AT],
            )
            for run_id, static, body in latest
        ]
        return sorted(out, key=lambda s: s.run_id)
