"""Event streams read from the store: a run that lives elsewhere, or nowhere, or a resumed
run's history before this process (docs/durability.md, "Stored events").

`StoredEventStream` replays a run's stored events from a seq, then follows the store: it waits
on the runtime's `ChangeSignal` (told by the wake thread each time the store's change counter
moves) and reads again, until the run's `run_ended`. `PrefixedStream` puts stored events in
front of a live run's `EventStream` (a resumed run's events before this process).
Both iterate with `for` and `async for`, as `handle.events()` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator

from steerable.protocol import EventKind, RunEvent

from .event_stream import EventStream, sse_frames

__all__ = ["ChangeSignal", "PrefixedStream", "StoredEventStream"]

_POLL = 0.05
"""Seconds between two reads when no change signal wakes the stream (a store without a
change counter, or a runtime shutting down)."""

_GRACE = 2.0
"""Seconds a follower waits for the run_ended of a run the store holds as terminal."""

_SLEEP = 1.0
"""Seconds a follower sleeps between two looks at most, woken or not (a missed signal)."""


class ChangeSignal:
    """A generation counter that wakes waiters when the store changed (any thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._futures: list[concurrent.futures.Future[None]] = []

    def generation(self) -> int:
        """The current generation (read before looking at the store)."""
        return self._generation

    def notify(self) -> None:
        """The store changed: wake every waiter."""
        with self._cond:
            self._generation += 1
            futures, self._futures = self._futures, []
            self._cond.notify_all()
        for future in futures:
            if not future.done():
                future.set_result(None)

    def wait(self, generation: int, timeout: float) -> bool:
        """Wait up to `timeout` for a generation after `generation`; True if one came."""
        with self._cond:
            return self._cond.wait_for(lambda: self._generation != generation, timeout)

    def future(self, generation: int) -> concurrent.futures.Future[None]:
        """A future done at the first generation after `generation` (for async waiters)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._cond:
            if self._generation != generation:
                future.set_result(None)
            else:
                self._futures.append(future)
        return future


Submit = Callable[[Callable[[], bool]], "concurrent.futures.Future[bool]"]
"""Runs a blocking read off the event loop (the runtime's host threads)."""


class StoredEventStream:
    """A run's stored events from seq `start`, then new ones as they are stored, until the
    run's `run_ended` (or, for a run the store holds as terminal, its last stored event).

    Args:
        read: `read(seq)` returns stored events of the stream from `seq` (a batch).
        terminal: Whether the run is terminal in the store.
        signal: Woken when the store changed (None: read again every 50 ms).
        submit: Runs a read off the event loop, for `async for`.
        start: The first seq to yield.
        timeout: The longest wait for one event (`TimeoutError` past it; the stream stays
            usable). None waits as long as the run lasts.
        run_id: The run whose `run_ended` ends the stream.
        only: Yield only this run's events (a subagent's, from its root's stream).
    """

    def __init__(
        self,
        read: Callable[[int], list[RunEvent]],
        terminal: Callable[[], bool],
        signal: ChangeSignal | None,
        submit: Submit,
        start: int,
        timeout: float | None,
        run_id: str,
        only: str | None = None,
    ) -> None:
        self._read = read
        self._terminal = terminal
        self._signal = signal
        self._submit = submit
        self._pos = start
        self._timeout = timeout
        self._run_id = run_id
        self._only = only
        self._buffer: deque[RunEvent] = deque()
        self._done = False
        self._lock = threading.Lock()
        self._reading: concurrent.futures.Future[bool] | None = None
        self._terminal_at: float | None = None

    @property
    def position(self) -> int:
        """The seq of the next event this stream will yield (or wait for)."""
        with self._lock:
            return self._buffer[0].seq if self._buffer else self._pos

    def _next(self) -> RunEvent | None:
        with self._lock:
            while self._buffer:
                event = self._buffer.popleft()
                if self._only is not None and event.run_id != self._only:
                    continue
                if event.kind is EventKind.RUN_ENDED and event.run_id == self._run_id:
                    self._done = True
                return event
            return None

    def _read_once(self) -> bool:
        """Read what is new into the buffer; True if anything came (or the stream is over)."""
        batch = self._read(self._pos)
        if not batch and self._terminal():
            # A run's run_ended is stored just after its terminal checkpoint: give it a moment
            # (it ends the stream); a run whose run_ended never came (a crash in between, an
            # older database) ends the stream after `_GRACE`.
            now = time.monotonic()
            if self._terminal_at is None:
                self._terminal_at = now
            elif now - self._terminal_at >= _GRACE:
                with self._lock:
                    self._done = True
                return True
        with self._lock:
            self._buffer.extend(batch)
            if batch:
                self._pos = batch[-1].seq + 1
        return bool(batch)

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _wait_for(self, deadline: float | None) -> float | None:
        """Seconds to wait for a change now (None: the deadline passed)."""
        wait = _POLL if self._signal is None or self._terminal_at is not None else _SLEEP
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            wait = min(wait, left)
        return wait

    def __iter__(self) -> Iterator[RunEvent]:
        deadline = self._deadline()
        while True:
            event = self._next()
            if event is not None:
                yield event
                deadline = self._deadline()
                continue
            if self._done:
                return
            signal = self._signal
            generation = signal.generation() if signal is not None else 0
            if self._read_once():
                continue
            wait = self._wait_for(deadline)
            if wait is None:
                raise TimeoutError(f"no event within {self._timeout}s")
            if signal is not None:
                signal.wait(generation, wait)
            else:
                threading.Event().wait(wait)

    def __aiter__(self) -> StoredEventStream:
        return self

    def sse(self, *, keepalive: float | None = 15.0) -> AsyncIterator[str]:
        """The stream as Server-Sent Events frames, as `EventStream.sse`."""
        return sse_frames(self, keepalive)

    async def __anext__(self) -> RunEvent:
        deadline = self._deadline()
        while True:
            event = self._next()
            if event is not None:
                return event
            if self._done:
                raise StopAsyncIteration
            signal = self._signal
            generation = signal.generation() if signal is not None else 0
            reading = self._reading
            if reading is None:
                reading = self._reading = self._submit(self._read_once)
            # Shielded: a cancelled await leaves the read running; it fills the buffer, and
            # the next call awaits the same read instead of starting another.
            got = await asyncio.shield(asyncio.wrap_future(reading))
            self._reading = None
            if got:
                continue
            wait = self._wait_for(deadline)
            if wait is None:
                raise TimeoutError(f"no event within {self._timeout}s")
            if signal is None:
                await asyncio.sleep(wait)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wrap_future(signal.future(generation)), wait)


class PrefixedStream:
    """Stored events before a live run's history (a resumed run), then its live stream."""

    def __init__(self, prefix: list[RunEvent], live: EventStream) -> None:
        self._prefix = deque(prefix)
        self._live = live

    @property
    def position(self) -> int:
        """The seq of the next event this stream will yield (or wait for)."""
        return self._prefix[0].seq if self._prefix else self._live.position

    def __iter__(self) -> Iterator[RunEvent]:
        while self._prefix:
            yield self._prefix.popleft()
        yield from self._live

    def __aiter__(self) -> PrefixedStream:
        return self

    def sse(self, *, keepalive: float | None = 15.0) -> AsyncIterator[str]:
        """The stream as Server-Sent Events frames, as `EventStream.sse`."""
        return sse_frames(self, keepalive)

    async def __anext__(self) -> RunEvent:
        if self._prefix:
            return self._prefix.popleft()
        return await self._live.__anext__()
