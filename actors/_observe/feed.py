"""The runtime-wide event feed: every run's events, for any number of subscribers, on one thread.

A run's supervisor appends its events to the run's `EventLog`; when the feed has a subscriber,
the log also pushes the raw record here (one short lock, no model built on the supervisor's
thread). One feed thread builds each `RunEvent` once and hands it to every subscriber in order,
so a bridge (OpenTelemetry, a host's metrics) needs one consumer for all runs, and a slow
subscriber delays only the feed, never a run. With no subscriber nothing is pushed and no
thread exists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from steerable.actors._engine.log import get_logger
from steerable.protocol import EventKind, Phase, RunEvent

__all__ = ["Feed", "FeedStream", "Subscriber", "build_event"]

_log = get_logger("steerable.feed")

Subscriber = Callable[[RunEvent], object]
"""A feed subscriber: called with every event of every run, on the feed thread, in order."""

_MAX_PENDING = 100_000  # events queued for the feed thread before new ones are dropped


KINDS: dict[str, EventKind] = {kind.value: kind for kind in EventKind}
"""Event kinds by value: raw event records hold the value (see `EventLog.append`)."""
PHASES: dict[str | None, Phase | None] = {None: None, **{phase.value: phase for phase in Phase}}
"""Phases by value (and None), as raw event records hold them."""


_new = object.__new__
_set = object.__setattr__
_EVENT_FIELDS = frozenset(RunEvent.model_fields)


def build_event(trace_id: str, raw: tuple[Any, ...]) -> RunEvent:
    """The `RunEvent` of one raw record of a run's event log, without a validation pass.

    Every field is a value the runtime built itself (kind and phase are looked up from their
    own enums, the payload came from the machine's builders), so validating would only copy
    `data`, once per reader, on the reader's thread: for an async reader, the event loop
    (docs/host.md "Keeping the loop free"). What `model_construct` leaves in a model is set
    directly: it is a Python loop over the fields, slower than the validation it skips.
    """
    seq, kind, phase, at, data, run_id, parent = raw
    event: RunEvent = _new(RunEvent)
    _set(
        event,
        "__dict__",
        {
            "run_id": run_id,
            "trace_id": trace_id,
            "seq": seq,
            "kind": KINDS[kind],
            "phase": PHASES[phase],
            "at": at,
            "data": data,
            "parent_run_id": parent,
        },
    )
    _set(event, "__pydantic_fields_set__", set(_EVENT_FIELDS))
    _set(event, "__pydantic_extra__", None)
    _set(event, "__pydantic_private__", None)
    return event


class Feed:
    """Fans every run's events out to subscribers, on one thread started at the first one.

    Args:
        name: The feed thread's name.
        max_pending: Events queued for the feed thread at most; past it new events are
            dropped and counted (`dropped`), and a warning is logged once per overflow.
    """

    def __init__(self, name: str = "steerable-feed", max_pending: int = _MAX_PENDING) -> None:
        self._name = name
        self._max = max_pending
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[tuple[str, Any, bool]] = deque()
        self._subscribers: tuple[Subscriber, ...] = ()
        self._internal: tuple[Subscriber, ...] = ()
        self._on_close: list[Callable[[], None]] = []
        self._thread: threading.Thread | None = None
        self._sleeping = False
        self._closed = False
        self._overflowing = False
        self._pushed = 0
        self._done = 0
        self.active = False
        """Whether anything listens."""
        self.public = False
        """Whether a host's subscriber listens (then every event is pushed, else only those of
        runs the runtime's own bridges observe)."""
        self.dropped = 0
        """Events dropped because the feed thread fell `max_pending` behind."""

    # ------------------------------------------------------------------ producers

    def push(self, trace_id: str, raw: tuple[Any, ...], observed: bool = True) -> None:
        """Queue one raw event record (an `EventLog` calls this). Never blocks for long.

        `observed`: the runtime's own bridges want it (not a trace sampled out, say).
        """
        with self._lock:
            if self._closed:
                return
            if len(self._queue) >= self._max:
                self.dropped += 1
                warn = not self._overflowing
                self._overflowing = True
            else:
                warn = False
                self._queue.append((trace_id, raw, observed))
                self._pushed += 1
                if self._sleeping:
                    self._cond.notify()
        if warn:
            _log.warning("feed_overflow", max_pending=self._max)

    def call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the feed thread, after every event pushed before it."""
        with self._lock:
            if self._closed:
                return
            self._queue.append(("", fn, True))
            self._pushed += 1
            if self._sleeping:
                self._cond.notify()

    # ------------------------------------------------------------------ consumers

    def subscribe(self, callback: Subscriber, *, internal: bool = False) -> Callable[[], None]:
        """Call `callback(event)` for every event from now on; returns an unsubscribe.

        Callbacks run on the feed thread, one at a time, in the order events were appended
        (a run's own events in seq order). One that raises is logged and keeps its place.
        An `internal` one (the runtime's bridges) gets only the events of observed runs.

        Raises:
            RuntimeError: The feed is closed (the runtime shut down).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the runtime is shut down")
            if internal:
                self._internal = (*self._internal, callback)
            else:
                self._subscribers = (*self._subscribers, callback)
                self.public = True
            self.active = True
            start = self._thread is None
            if start:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        if start:
            assert self._thread is not None
            self._thread.start()

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)
                self._internal = tuple(s for s in self._internal if s is not callback)
                self.public = bool(self._subscribers)
                self.active = self.public or bool(self._internal)

        return unsubscribe

    def stream(self, timeout: float | None = None, max_pending: int = _MAX_PENDING) -> FeedStream:
        """A new reader of every run's events from now on, for `for` and `async for`."""
        return FeedStream(self, timeout, max_pending)

    def on_close(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` once the feed is closed and drained; returns a cancel."""
        with self._lock:
            self._on_close.append(callback)

        def cancel() -> None:
            with self._lock:
                if callback in self._on_close:
                    self._on_close.remove(callback)

        return cancel

    def owns_thread(self, thread: threading.Thread) -> bool:
        """Whether `thread` is the feed thread (a subscriber runs on it)."""
        return thread is self._thread

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far reached the subscribers; True if it did."""
        with self._cond:
            target = self._pushed
            if self._thread is None:
                return True
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float = 5.0) -> list[str]:
        """Deliver what is queued, stop the thread; returns its name if it did not stop."""
        with self._cond:
            if self._closed:
                return []
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
            callbacks, self._on_close = self._on_close, []
        left: list[str] = []
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                left.append(thread.name)
        for callback in callbacks:
            callback()
        return left

    def statistics(self) -> dict[str, int]:
        """Queue depth, subscribers, dropped events and everything ever queued."""
        with self._lock:
            return {
                "feed_queued": len(self._queue),
                "feed_subscribers": len(self._subscribers) + len(self._internal),
                "feed_dropped": self.dropped,
                "feed_events_total": self._pushed,
            }

    def _loop(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._closed:
                    self._sleeping = True
                    cond.wait()
                    self._sleeping = False
                if not self._queue:
                    cond.notify_all()
                    return
                batch = list(self._queue)
                self._queue.clear()
                self._overflowing = False
                subscribers, internal = self._subscribers, self._internal
            for trace_id, item, observed in batch:
                if not trace_id:
                    self._deliver_call(item)
                    continue
                event = build_event(trace_id, item)
                for callback in (*internal, *subscribers) if observed else subscribers:
                    try:
                        callback(event)
                    except Exception:  # noqa: BLE001 - one bad subscriber must not stop the feed
                        _log.exception("feed_subscriber_error", run_id=event.run_id)
            with cond:
                self._done += len(batch)
                cond.notify_all()

    @staticmethod
    def _deliver_call(fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the feed goes on
            _log.exception("feed_call_error")


class FeedStream:
    """Every run's events from the moment it was opened; `for` or `async for`.

    Iteration ends when the stream is closed (`close()`, or leaving its `with` block) or the
    runtime shuts down. Events wait in the stream until read, up to `max_pending`: past that
    the oldest are dropped and counted in `dropped`.

    Args:
        feed: The runtime's feed.
        timeout: For sync iteration, the longest wait for one event before `TimeoutError`.
        max_pending: Events kept unread at most.
    """

    def __init__(self, feed: Feed, timeout: float | None = None, max_pending: int = 100_000):
        self._timeout = timeout
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._buffer: deque[RunEvent] = deque(maxlen=max_pending)
        self._waiters: list[concurrent.futures.Future[None]] = []
        self._closed = False
        self.dropped = 0
        """Events dropped because the reader fell `max_pending` behind."""
        self._unsubscribe = feed.subscribe(self._put)
        self._forget = feed.on_close(self.close)

    def _put(self, event: RunEvent) -> None:
        with self._cond:
            if self._closed:
                return
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
            self._buffer.append(event)
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        """Stop reading: iteration ends once what is buffered was read."""
        self._unsubscribe()
        self._forget()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def __enter__(self) -> FeedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[RunEvent]:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._buffer or self._closed, self._timeout)
                if self._buffer:
                    event = self._buffer.popleft()
                elif self._closed:
                    return
                else:
                    raise TimeoutError(f"no event within {self._timeout}s")
            yield event

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[RunEvent]:
        while True:
            with self._cond:
                fut: concurrent.futures.Future[None] | None = None
                if self._buffer:
                    event: RunEvent | None = self._buffer.popleft()
                elif self._closed:
                    return
                else:
                    event = None
                    fut = concurrent.futures.Future()
                    self._waiters.append(fut)
            if event is not None:
                yield event
            elif fut is not None:
                await asyncio.wrap_future(fut)
