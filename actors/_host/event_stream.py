"""Readers of a run's event log: `EventStream` (sync and async iteration) and SSE frames.

A stream is a cursor over an `EventLog` (events.py): it waits on the log's condition when
iterated with `for`, and awaits the log's futures with `async for`, so no event loop is ever
blocked (docs/pykka.md T10).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

from steerable.protocol import EventKind, RunEvent

__all__ = ["SSE_KEEPALIVE", "EventStream", "sse_frame", "sse_frames"]

# (seq, kind value, phase value, at, data, run_id, parent_run_id), as the log holds an event
_Raw = tuple[int, str, str | None, float, dict[str, Any], str, str | None]
_RUN_ENDED = EventKind.RUN_ENDED.value


class _Log(Protocol):
    """What a stream reads of an `EventLog` (events.py imports this module, not back)."""

    def to_event(self, raw: _Raw) -> RunEvent: ...

    def wait_read(self, start: int, timeout: float | None) -> tuple[list[_Raw], bool]: ...

    def _read(
        self, start: int
    ) -> tuple[list[_Raw], bool, concurrent.futures.Future[None] | None, bool]: ...


class EventStream:
    """Iterates a run's events, sync (`for`) or async (`async for`), until the run ends.

    The stream is a cursor: it remembers the next seq to read, so it can be iterated again
    after a `TimeoutError` (or a `break`) and goes on where it stood. Async iteration
    survives a cancelled `__anext__` (for example `asyncio.wait_for(stream.__anext__(), 15)`
    for an SSE keep-alive): the event is not lost, the next call returns it.

    Args:
        log: The event log to read.
        start: The first seq to yield (for a reconnecting client: the last seq it saw + 1).
        timeout: The longest wait for one event, in seconds; past it `TimeoutError` is raised
            from that one step (`next` or `__anext__`), and the stream stays usable. None
            waits as long as the run lasts.
        only: Restrict the stream to one run of a tree; it then ends with that run's
            `run_ended` event.
    """

    __slots__ = ("_buffer", "_done", "_log", "_only", "_pos", "_timeout")

    def __init__(
        self, log: _Log, start: int = 0, timeout: float | None = None, only: str | None = None
    ) -> None:
        self._log = log
        self._pos = start
        self._timeout = timeout
        self._only = only
        self._done = False
        self._buffer: deque[_Raw] = deque()

    @property
    def position(self) -> int:
        """The seq of the next event this stream will yield (or wait for)."""
        return self._buffer[0][0] if self._buffer else self._pos

    def _next_raw(self) -> _Raw | None:
        """The next buffered event that passes the filter, or None when the buffer is empty."""
        buffer = self._buffer
        while buffer:
            raw = buffer.popleft()
            if self._keep(raw):
                return raw
        return None

    def _keep(self, raw: _Raw) -> bool:
        only = self._only
        if only is None:
            return True
        if raw[5] != only:
            return False
        if raw[1] == _RUN_ENDED:
            self._done = True
        return True

    def _fill(self, batch: list[_Raw]) -> None:
        self._buffer.extend(batch)
        self._pos = batch[-1][0] + 1

    def __iter__(self) -> Iterator[RunEvent]:
        log = self._log
        while True:
            raw = self._next_raw()
            if raw is not None:
                yield log.to_event(raw)
                continue
            if self._done:
                return
            batch, closed = log.wait_read(self._pos, self._timeout)
            if batch:
                self._fill(batch)
            elif closed:
                self._done = True
                return
            else:
                raise TimeoutError(f"no event within {self._timeout}s")

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> RunEvent:
        log = self._log
        while True:
            raw = self._next_raw()
            if raw is not None:
                return log.to_event(raw)
            if self._done:
                raise StopAsyncIteration
            batch, closed, fut, _ = log._read(self._pos)
            if batch:
                self._fill(batch)
                continue
            if closed:
                self._done = True
                raise StopAsyncIteration
            if fut is None:  # pragma: no cover - _read returns a future when nothing is new
                continue
            # Cancelling the awaiting task cancels only this wait: the cursor is unchanged.
            waiting = asyncio.wrap_future(fut)
            if self._timeout is None:
                await waiting
            else:
                try:
                    await asyncio.wait_for(waiting, self._timeout)
                except TimeoutError:
                    raise TimeoutError(f"no event within {self._timeout}s") from None

    def sse(self, *, keepalive: float | None = 15.0) -> AsyncIterator[str]:
        """The stream as Server-Sent Events frames (`id`, `event`, `data`), for a web response.

        Every `keepalive` seconds without an event, an SSE comment line is yielded instead, so
        proxies keep the connection open; the stream ends when the run ends. A client that
        reconnects sends `Last-Event-ID`: start a new stream at that seq + 1.
        """
        return sse_frames(self, keepalive)


def sse_frame(event: RunEvent) -> str:
    """One event as a Server-Sent Events frame: `id` is its seq, `event` its kind, `data` its
    JSON (one line)."""
    return f"id: {event.seq}\nevent: {event.kind.value}\ndata: {event.model_dump_json()}\n\n"


SSE_KEEPALIVE = ": keepalive\n\n"
"""The comment frame `EventStream.sse` yields while a run is quiet."""


async def sse_frames(
    stream: AsyncIterator[RunEvent], keepalive: float | None
) -> AsyncIterator[str]:
    while True:
        try:
            if keepalive is None:
                event = await stream.__anext__()
            else:
                event = await asyncio.wait_for(stream.__anext__(), keepalive)
        except StopAsyncIteration:
            return
        except TimeoutError:
            yield SSE_KEEPALIVE
            continue
        yield sse_frame(event)
