"""A run's event stream: appended by its supervisor, read by any number of host iterators.

The supervisor appends raw tuples (cheap: no model is built on its thread); readers build
`RunEvent`s on their own thread. Sync readers wait on a condition; async readers await a
`concurrent.futures.Future` through `asyncio.wrap_future`, so no event loop is ever blocked
(docs/pykka.md T10). History is kept up to a bound, so a reader that starts late still sees the
run from its beginning unless the run is very long.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

from steerable.actors._observe.feed import Feed
from steerable.protocol import EventKind, Phase, RunEvent

__all__ = ["EventLog", "EventStream"]

_Raw = tuple[int, EventKind, Phase | None, float, dict[str, Any], str, str | None]


class EventLog:
    """The append-only, bounded event history of one run (or a run tree).

    Args:
        trace_id: The trace every event carries.
        max_history: Events kept for late readers; older ones are dropped first.
        feed: The runtime-wide feed every event is also offered to (see `Feed`).
        observed: The runtime's bridges want this log's events (a trace not sampled out).
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_dropped",
        "_events",
        "_feed",
        "_lock",
        "_next",
        "_observed",
        "_sleepers",
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
        # the supervisor's hot path (about ten events per loop iteration).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0
        self._events: deque[_Raw] = deque(maxlen=max_history)
        self._next = 0
        self._dropped = 0
        self._closed = False
        self._waiters: list[concurrent.futures.Future[None]] = []

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
        with self._lock:
            seq = self._next
            self._next = seq + 1
            events = self._events
            if len(events) == events.maxlen:
                self._dropped += 1
            raw = (seq, kind, phase, at, data, run_id, parent_run_id)
            events.append(raw)
            feed = self._feed
            if feed is not None and (feed.public or (self._observed and feed.active)):
                # Under this log's lock: the feed sees a run tree's events in seq order.
                feed.push(self.trace_id, raw, self._observed)
            if self._sleepers:
                self._cond.notify_all()
            waiters = self._waiters
            if not waiters:
                return seq
            self._waiters = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        return seq

    def close(self) -> None:
        """No more events will come (the run, or the whole tree, is terminal)."""
        with self._cond:
            self._closed = True
            waiters, self._waiters = self._waiters, []
            self._cond.notify_all()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

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
        with self._cond:
            return self._take(start, want_future=True)

    def _take(
        self, start: int, *, want_future: bool
    ) -> tuple[list[_Raw], bool, concurrent.futures.Future[None] | None, bool]:
        first = self._events[0][0] if self._events else self._next
        skipped = start < first
        begin = max(start, first) - first
        batch = [self._events[i] for i in range(begin, len(self._events))]
        fut: concurrent.futures.Future[None] | None = None
        if not batch and not self._closed and want_future:
            fut = concurrent.futures.Future()
            self._waiters.append(fut)
        return batch, self._closed, fut, skipped

    def wait_read(self, start: int, timeout: float | None) -> tuple[list[_Raw], bool]:
        """Block until events from seq `start` exist or the log closes (or `timeout`)."""
        with self._cond:
            while True:
                batch, closed, _, _ = self._take(start, want_future=False)
                if batch or closed:
                    return batch, closed
                self._sleepers += 1
                try:
                    woke = self._cond.wait(timeout)
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
        """Build the public event of one raw record."""
        seq, kind, phase, at, data, run_id, parent = raw
        return RunEvent(
            run_id=run_id,
            trace_id=self.trace_id,
            seq=seq,
            kind=kind,
            phase=phase,
            at=at,
            data=data,
            parent_run_id=parent,
        )


class EventStream:
    """Iterates a run's events, sync (`for`) or async (`async for`), until the run ends.

    Args:
        log: The event log to read.
        start: The first seq to yield.
        timeout: For sync iteration, the longest wait for one event before `TimeoutError`.
    """

    def __init__(
        self, log: EventLog, start: int = 0, timeout: float | None = None, only: str | None = None
    ) -> None:
        self._log = log
        self._pos = start
        self._timeout = timeout
        self._only = only
        self._done = False

    def _keep(self, raw: _Raw) -> bool:
        only = self._only
        if only is None:
            return True
        if raw[5] != only:
            return False
        if raw[1] is EventKind.RUN_ENDED:
            self._done = True
        return True

    def __iter__(self) -> Iterator[RunEvent]:
        log = self._log
        while True:
            batch, closed = log.wait_read(self._pos, self._timeout)
            if not batch and not closed:
                raise TimeoutError(f"no event within {self._timeout}s")
            for raw in batch:
                self._pos = raw[0] + 1
                if self._keep(raw):
                    yield log.to_event(raw)
                if self._done:
                    return
            if closed and not batch:
                return

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[RunEvent]:
        log = self._log
        while True:
            batch, closed, fut, _ = log._read(self._pos)
            for raw in batch:
                self._pos = raw[0] + 1
                if self._keep(raw):
                    yield log.to_event(raw)
                if self._done:
                    return
            if batch:
                continue
            if closed:
                return
            if fut is not None:
                await asyncio.wrap_future(fut)
