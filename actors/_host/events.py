"""A run's event stream: appended by its supervisor, read by any number of host iterators.

The supervisor appends raw values (cheap: no model is built on its thread); readers build
`RunEvent`s on their own thread. The history is one flat deque of six slots per event (the
kind's and phase's values, not the enum members, the time, the run ids and the `data` dict):
an append makes no object the collector tracks beyond the data dict, and a flat dict is never
tracked, so a long history costs the collector nothing (a per-event tuple holding a dict or
an enum would stay tracked, and be walked by every full collection). A closed log still held
when the next log closes is compacted: the data dicts the collector still tracks (those
holding a list or a dict, e.g. a plan's steps) are packed into one msgpack array, decoded
again for a late reader, so a finished run whose handle is held keeps nothing of its history
for full collections to walk (docs/performance.md, "GC-tracked objects"). A log whose handle
is dropped when its run ends, as most are, is freed before that and never packed, unless its
store keeps it: a run's last hand-over to the store (`store_pending(final=True)`) lets the
store keep the log's own history (`MemoryStore`, `CheckpointStore.append_history`).

Sync readers wait on a condition; async readers await a `concurrent.futures.Future` through
`asyncio.wrap_future`, so no event loop is ever blocked (docs/pykka.md T10); the readers
themselves (`EventStream`, SSE frames) are in event_stream.py. History is kept up to a bound,
so a reader that starts late still sees the run from its beginning unless the run is very long.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from gc import is_tracked as gc_is_tracked
from itertools import compress, islice
from typing import TYPE_CHECKING, Any

import msgpack

from steerable.actors._engine.packing import packb
from steerable.actors._machine.preview import NO_ARGUMENTS
from steerable.actors._observe.feed import Feed, build_event
from steerable.protocol import EventKind, Phase, RunEvent

from .event_stream import EventStream

if TYPE_CHECKING:
    from steerable.actors._stores.store import CheckpointStore

__all__ = ["EventLog"]

# (seq, kind value, phase value, at, data, run_id, parent_run_id): what readers and the feed get
_Raw = tuple[int, str, str | None, float, dict[str, Any], str, str | None]
_SLOTS = 6
"""History slots per event: kind value, phase value, at, run_id, parent_run_id, data."""
_RUN_ENDED = EventKind.RUN_ENDED.value
_MODEL_DELTA = EventKind.MODEL_DELTA.value
_CUSTOM = EventKind.CUSTOM.value
_MODEL_DELTA_KIND = EventKind.MODEL_DELTA
_CUSTOM_KIND = EventKind.CUSTOM


def _pack_history(cols: deque[Any], tail: int = 0) -> bytes | None:
    """Pack the data dicts the collector tracks (a closed log's) into one msgpack array.

    Each one's slot gets its index in the array (an int, which the collector does not track);
    returns the array's bytes, or None when no dict is tracked. One `packb` for the history,
    not one per dict: making a packer costs more than packing a small dict (issue 14's budget).
    The last `tail` events' dicts are packed one by one instead (bytes in their slots): a
    reader that follows the run live reads them without decoding the whole array.
    """
    slots = list(cols)
    # The data slots' indexes whose dict is tracked, found without a Python step per event
    # (a long run's history is compacted in one go).
    datas = islice(slots, _SLOTS - 1, None, _SLOTS)
    where = list(compress(range(_SLOTS - 1, len(slots), _SLOTS), map(gc_is_tracked, datas)))
    if not where:  # a dict of atomic values is not tracked: it stays as it is
        return None
    cut = bisect_left(where, len(slots) - tail * _SLOTS)
    where, alone = where[:cut], where[cut:]
    blob: bytes | None = None
    if where:
        try:
            # No `default`: what msgpack does not carry as itself keeps its dict, so a reader
            # gets what was appended (as JSON encodes it, lists for tuples).
            blob = packb(list(map(slots.__getitem__, where)))
        except (TypeError, ValueError, OverflowError):
            alone = where + alone  # one dict msgpack cannot carry: pack the others one by one
            where = []
    for index, i in enumerate(where):
        slots[i] = index
    for i in alone:
        try:
            slots[i] = packb(slots[i])
        except (TypeError, ValueError, OverflowError):
            continue
    cols.clear()
    cols.extend(slots)
    return blob


_LIVE_TAIL = 64
"""Events at the end of a log handed to its store whose data is packed one by one."""


_closed_logs: deque[weakref.ref[EventLog]] = deque()
"""Logs closed since the last close, compacted by the next close if still alive."""


def _compact_closed() -> None:
    """Compact the logs closed before this call that someone still holds."""
    for _ in range(len(_closed_logs)):  # what other closes append meanwhile is theirs to do
        try:
            ref = _closed_logs.popleft()
        except IndexError:  # another close took it
            return
        log = ref()
        if log is not None:
            log.compact()


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, object_hook=_shared_empty)


def _shared_empty(mapping: dict[str, Any]) -> Any:
    # An empty mapping comes back as the machine's shared, unchangeable one (a call without
    # arguments holds it, tests/test_event_payloads.py): equal to `{}` and a dict as before.
    return mapping if mapping else NO_ARGUMENTS


class EventLog:
    """The append-only, bounded event history of one run (or a run tree).

    Args:
        trace_id: The trace every event carries.
        max_history: Events kept for late readers; older ones are dropped first.
        feed: The runtime-wide feed every event is also offered to (see `Feed`).
        observed: The runtime's bridges want this log's events (a trace not sampled out).
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_cols",
        "_compacted",
        "_cond",
        "_dropped",
        "_feed",
        "_kept",
        "_lock",
        "_next",
        "_observed",
        "_packed",
        "_sleepers",
        "_store",
        "_store_lock",
        "_stored_as",
        "_unstorable",
        "_unstored",
        "_waiters",
        "trace_id",
    )

    def __init__(
        self,
        trace_id: str,
        max_history: int = 10_000,
        feed: Feed | None = None,
        observed: bool = True,
    ) -> None:
        self.trace_id = trace_id
        self._feed = feed
        self._observed = observed
        # Writers take the bare lock and notify only when a reader sleeps: appending is on
        # the supervisor's hot path (about ten events per loop iteration). The condition is
        # made by the first reader that sleeps (most runs have none; start() pays less).
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None
        self._sleepers = 0
        self._cols: deque[Any] = deque(maxlen=max(1, max_history) * _SLOTS)
        self._next = 0
        self._dropped = 0
        self._closed = False
        self._compacted = False
        self._packed: bytes | None = None  # a compacted log's tracked data dicts (_pack_history)
        self._waiters: list[concurrent.futures.Future[None]] = []
        self._store: CheckpointStore | None = None
        self._stored_as = ""
        self._unstored = 0  # the first seq not yet handed to the store
        self._unstorable = False  # a model delta or a custom event was appended (`storable`)
        self._kept = False  # its store keeps this log's own history, compacted (`append_history`)
        self._store_lock = threading.Lock()

    def store_to(self, store: CheckpointStore, run_id: str, first_seq: int = 0) -> None:
        """Keep this log's events in `store`, as the stream of top-level run `run_id`.

        `first_seq`: where a resumed run's stream continues (after its last stored event);
        called before anything is appended.
        """
        with self._lock:
            if first_seq > self._next and not self._cols:
                self._next = first_seq
            self._unstored = self._next
            self._store = store
            self._stored_as = run_id

    @property
    def first_seq(self) -> int:
        """The seq of the oldest event still in memory (the next one's if none is)."""
        with self._lock:
            return self._next - len(self._cols) // _SLOTS

    @property
    def stored_as(self) -> str:
        """The top-level run whose stored stream this log writes ("" if it is not stored)."""
        return self._stored_as

    @property
    def storing(self) -> bool:
        """Whether the log hands its events to a store."""
        return self._store is not None

    def store_pending(self, *, final: bool = False) -> None:
        """Hand the storable events appended since the last call to the store, in one batch.

        Called at the end of each supervisor step and before a run's outcome is published;
        cheap when nothing is new (one attribute comparison). `final`: the log closes next
        (its run tree is terminal), so a store that keeps histories (`keeps_history`) gets
        this log's own, compacted (`CheckpointStore.append_history`), instead of a copy.
        """
        store = self._store
        if store is None or self._unstored == self._next:
            return
        with self._store_lock:  # batches reach the store in seq order
            with self._lock:
                if final and store.keeps_history and not self._unstorable:
                    first = max(self._unstored, self._next - len(self._cols) // _SLOTS)
                    history = _History(self, first, self._next - 1)
                    self._unstored = self._next
                    if not self._compacted:
                        # Packed now, inside the run's own time: done later, after the
                        # outcome, it would be charged to whatever the host does next.
                        self._packed = _pack_history(self._cols, _LIVE_TAIL)
                        self._compacted = True
                    self._kept = True
                else:
                    history = None
                    batch = [
                        record
                        for record in self._records(self._unstored)
                        if (kind := record[1]) != _MODEL_DELTA
                        and (kind != _CUSTOM or not record[4].get("live", True))
                    ]  # what `storable` keeps, without a call per event
                    self._unstored = self._next
            if history is not None:
                if len(history):
                    store.append_history(self._stored_as, self.trace_id, history)
            elif batch:
                store.append_events(self._stored_as, self.trace_id, batch)

    def _records(self, start: int) -> list[_Raw]:
        """The events in memory from seq `start` (caller holds the lock)."""
        cols = self._cols
        first = self._next - len(cols) // _SLOTS
        begin = max(start, first)
        if begin >= self._next:
            return []
        want = (self._next - begin) * _SLOTS
        tail: Iterator[Any]
        if want * 2 <= len(cols):
            # From the right end: a step's or a reader's new events cost what they are, not
            # the length of the history before them.
            newest = list(islice(reversed(cols), want))
            newest.reverse()
            tail = iter(newest)
        else:
            tail = islice(cols, len(cols) - want, None)
        rows = enumerate(zip(*([tail] * _SLOTS), strict=True), begin)
        if not self._compacted:  # the data slots are the dicts appended
            return [
                (seq, kind, phase, at, data, run_id, parent)
                for seq, (kind, phase, at, run_id, parent, data) in rows
            ]
        packed: list[Any] | None = None
        records: list[_Raw] = []
        for seq, (kind, phase, at, run_id, parent, slot) in rows:
            data = slot
            if type(slot) is int:
                if packed is None:
                    assert self._packed is not None  # an int slot indexes the packed array
                    packed = _unpack(self._packed)
                data = packed[slot]
            elif type(slot) is bytes:
                data = _unpack(slot)
            records.append((seq, kind, phase, at, data, run_id, parent))
        return records

    def append(
        self,
        run_id: str,
        kind: EventKind,
        phase: Phase | None,
        at: float,
        data: dict[str, Any],
        parent_run_id: str | None = None,
    ) -> int:
        """Append one event; returns its seq. Never blocks for long (one short lock)."""
        value = kind._value_
        raw_phase = None if phase is None else phase._value_
        with self._lock:
            seq = self._next
            self._next = seq + 1
            cols = self._cols
            if kind is _MODEL_DELTA_KIND or kind is _CUSTOM_KIND:
                self._unstorable = True  # the run's end hands over a filtered copy
            if len(cols) == cols.maxlen:
                self._dropped += 1
            # A temporary tuple: made and freed at once, it leaves the collector's count as it was.
            cols.extend((value, raw_phase, at, run_id, parent_run_id, data))
            feed = self._feed
            if feed is not None and (feed.public or (self._observed and feed.active)):
                # Under this log's lock: the feed sees a run tree's events in seq order.
                raw = (seq, value, raw_phase, at, data, run_id, parent_run_id)
                feed.push(self.trace_id, raw, self._observed)
            if self._sleepers:
                assert self._cond is not None  # made by the sleeping reader
                self._cond.notify_all()
            waiters = self._waiters
            if not waiters:
                return seq
            self._waiters = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        return seq

    def append_step(
        self,
        run_id: str,
        at: float,
        parent_run_id: str | None,
        events: list[tuple[EventKind, Phase | None, dict[str, Any]]],
    ) -> None:
        """Append one supervisor step's events of `run_id`, all at `at`, in order.

        The same as one `append` per event, under one lock acquisition and with one wake of
        the readers (a W1 iteration is two steps of about five events each).
        """
        feed = self._feed
        with self._lock:
            seq = self._next
            cols = self._cols
            maxlen = cols.maxlen
            offered = feed is not None and (feed.public or (self._observed and feed.active))
            for kind, phase, data in events:
                if len(cols) == maxlen:
                    self._dropped += 1
                value = kind._value_
                raw_phase = None if phase is None else phase._value_
                cols.extend((value, raw_phase, at, run_id, parent_run_id, data))
                if offered:
                    assert feed is not None
                    raw = (seq, value, raw_phase, at, data, run_id, parent_run_id)
                    feed.push(self.trace_id, raw, self._observed)
                seq += 1
            self._next = seq
            if self._sleepers:
                assert self._cond is not None  # made by the sleeping reader
                self._cond.notify_all()
            waiters = self._waiters
            if not waiters:
                return
            self._waiters = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        """No more events will come (the run, or the whole tree, is terminal)."""
        with self._lock:
            first = not self._closed
            self._closed = True
            waiters, self._waiters = self._waiters, []
            if self._cond is not None:
                self._cond.notify_all()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if first:
            # Compacting is deferred by one close: a run whose handle is dropped at once (most
            # are) is freed before it, so its history is never packed for nothing.
            _compact_closed()
            if not self._kept:  # a log its store keeps was compacted as it was handed over
                _closed_logs.append(weakref.ref(self))

    def compact(self) -> None:
        """Pack a closed log's collector-tracked data (see the module docstring); once.

        Done for every closed log by the next log's close, if it is still held then.
        """
        with self._lock:
            if self._closed and not self._compacted:
                self._packed = _pack_history(self._cols)
                self._compacted = True

    @property
    def observed(self) -> bool:
        """Whether the runtime's bridges want these events."""
        return self._observed

    @property
    def closed(self) -> bool:
        """Whether the log is closed."""
        return self._closed

    def __len__(self) -> int:
        return self._next

    def _read(
        self, start: int
    ) -> tuple[list[_Raw], bool, concurrent.futures.Future[None] | None, bool]:
        """Events from seq `start`, whether closed, and a future to await when none are new."""
        with self._lock:
            return self._take(start, want_future=True)

    def _take(
        self, start: int, *, want_future: bool
    ) -> tuple[list[_Raw], bool, concurrent.futures.Future[None] | None, bool]:
        skipped = start < self._next - len(self._cols) // _SLOTS
        batch = self._records(start)
        fut: concurrent.futures.Future[None] | None = None
        if not batch and not self._closed and want_future:
            fut = concurrent.futures.Future()
            self._waiters.append(fut)
        return batch, self._closed, fut, skipped

    def wait_read(self, start: int, timeout: float | None) -> tuple[list[_Raw], bool]:
        """Block until events from seq `start` exist or the log closes (or `timeout`)."""
        with self._lock:
            while True:
                batch, closed, _, _ = self._take(start, want_future=False)
                if batch or closed:
                    return batch, closed
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition(self._lock)
                self._sleepers += 1
                try:
                    woke = cond.wait(timeout)
                finally:
                    self._sleepers -= 1
                if not woke:
                    return [], False

    def stream(
        self, start: int = 0, timeout: float | None = None, only: str | None = None
    ) -> EventStream:
        """A new reader from seq `start`, for `for` and `async for`.

        `only` restricts it to one run of a tree (a subagent's own events); that reader ends
        with the run's `run_ended` event.
        """
        return EventStream(self, start, timeout, only)

    def to_event(self, raw: _Raw) -> RunEvent:
        """Build the public event of one raw record (no validation pass: `build_event`)."""
        return build_event(self.trace_id, raw)


def _as_stored(data: dict[str, Any]) -> dict[str, Any]:
    """An event's data as a store returns it: a dict the collector tracks (it may hold
    tuples) through msgpack, as compaction packs it; atomic values are their own form."""
    if not gc_is_tracked(data):
        return data
    try:
        stored: dict[str, Any] = _unpack(packb(data))
    except (TypeError, ValueError, OverflowError):
        return data
    return stored


class _History:
    """Events `first`..`last` of a log, as its store keeps them after the last hand-over
    (`EventHistory`): read from the log itself, which the run's end closed."""

    __slots__ = ("_log", "first", "last")

    def __init__(self, log: EventLog, first: int, last: int) -> None:
        self._log = log
        self.first = first
        self.last = last

    def __len__(self) -> int:
        return max(0, self.last - self.first + 1)

    def records(self) -> list[_Raw]:
        # A log its store keeps was compacted as it was handed over: its tracked data read
        # back packed, as a store returns them (lists for tuples).
        log = self._log
        with log._lock:
            rows = log._records(self.first)
            compacted = log._compacted
        if rows and rows[-1][0] > self.last:  # appended after the hand-over: not the store's
            rows = [row for row in rows if row[0] <= self.last]
        if not compacted:  # a store that keeps no history read it (`append_history`'s default)
            rows = [(*row[:4], _as_stored(row[4]), *row[5:]) for row in rows]
        return rows

    def __repr__(self) -> str:
        return f"<_History {self.first}..{self.last} of {self._log.trace_id}>"
