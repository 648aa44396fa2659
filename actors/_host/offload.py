"""Host operations off the event loop: the async face's worker threads.

`start`, `send`, `approve` and the rest return quickly, but with a durable store they wait for
a commit (milliseconds), which an asyncio host must never spend on its loop. The async forms
(`await rt.astart(...)`, `await handle.asend(...)`) run the same sync operation on one of a few
"steerable-host-N" threads and await its `concurrent.futures.Future` through
`asyncio.wrap_future`, which blocks nothing (docs/pykka.md T10). The threads start on first
use and are joined by `Runtime.shutdown()`.

What the loop itself does per operation is kept to a queue put and one wake-up, because under
the GIL every time the loop thread lets go of it (a syscall, a contended lock, a thread start)
it may wait a whole switch interval, or several, to get it back while the runtime's threads
compute (docs/host.md, "Keeping the loop free"). So `async with Runtime(...)` starts the host
threads up front (the loop never waits for a thread start while it serves), and an outcome
that is already there is returned without a trip through the loop's self-pipe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = ["HostIO", "async_form", "await_future", "in_thread"]

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")

_Job = tuple[
    "concurrent.futures.Future[Any]", Callable[..., Any], tuple[object, ...], dict[str, Any]
]


class HostIO:
    """A small, lazily started thread pool for the blocking part of host operations.

    Args:
        max_threads: Threads at most (host operations are short; a few suffice). Default 4.
        name: Prefix of the threads' names.
    """

    def __init__(self, max_threads: int = 4, name: str = "steerable-host") -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, not {max_threads}")
        self._max_threads = max_threads
        self._name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a job
        self._closed = False
        self._full = False  # every thread started: submit is a bare queue put

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """Run `fn(*args, **kwargs)` on a host thread and await its result on this loop."""
        return await await_future(self._submit(fn, *args, **kwargs))

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn()` on a host thread; its future (for a caller that awaits it itself)."""
        return self._submit(fn)

    def start(self) -> None:
        """Start every host thread now rather than on first use (for a host's startup).

        `async with Runtime(...)` calls it, so the event loop never waits for a thread to
        start while it serves.
        """
        with self._lock:
            while not self._closed and len(self._threads) < self._max_threads:
                self._start_thread()

    def _submit(
        self, fn: Callable[..., T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        job: _Job = (future, fn, args, kwargs)
        if self._full and not self._closed:
            # Every thread is started (`async with Runtime(...)` starts them up front): a bare
            # queue put, no lock. The loop never waits for a lock a host thread holds: once
            # it blocks, it gives up the GIL and may wait a whole switch interval for it
            # (docs/host.md, "Keeping the loop free"). A put that races `shutdown()` lands
            # behind its end-of-work markers; `shutdown()` runs what it finds there.
            self._jobs.put(job)
            return future
        with self._lock:
            closed = self._closed
            if not closed:
                if self._idle < self._jobs.qsize() + 1 and len(self._threads) < self._max_threads:
                    self._start_thread()
                # Queued under the lock: shutdown's end-of-work markers go in behind it.
                self._jobs.put(job)
        if closed:
            _run_closed(job)
        return future

    def shutdown(self) -> None:
        """Wait for the operations in flight, then join the threads."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            for _ in threads:
                self._jobs.put(None)
        current = threading.current_thread()
        for thread in threads:
            if thread is not current:  # a host operation that shuts the runtime down
                thread.join()
        # A lock-free put that raced the markers above: run it here (its operation raises
        # its own "shut down" error), so no awaiting task waits forever.
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                _run(job)

    def statistics(self) -> dict[str, int]:
        """`threads`: started so far; `queued`: operations waiting for a thread."""
        with self._lock:
            return {"threads": len(self._threads), "queued": self._jobs.qsize()}

    # -- internals ----------------------------------------------------------------------------

    def _start_thread(self) -> None:
        """Start one more host thread (lock held: shutdown joins every thread it lists)."""
        thread = threading.Thread(
            target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
        )
        thread.start()  # the new thread waits for the lock before it takes a job
        self._threads.append(thread)
        self._full = len(self._threads) >= self._max_threads

    def _work(self) -> None:
        jobs = self._jobs
        lock = self._lock
        while True:
            with lock:
                self._idle += 1
            job = jobs.get()
            with lock:
                self._idle -= 1
                if job is None:
                    return
            _run(job)


def _run_closed(job: _Job) -> None:
    """Run a job inline after shutdown (it raises the operation's own "shut down" error)."""
    future, fn, args, kwargs = job
    try:
        future.set_result(fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
        future.set_exception(exc)


def _run(job: _Job) -> None:
    future, fn, args, kwargs = job
    if not future.set_running_or_notify_cancel():
        return  # its awaiting task was cancelled before it started
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
        future.set_exception(exc)
    else:
        future.set_result(result)


def await_future(future: concurrent.futures.Future[T]) -> Awaitable[T]:
    """Await a `concurrent.futures.Future` on the running loop.

    A future that is already done is returned at once: wrapping it would have the loop write
    to its own self-pipe and wake up again for nothing. Cancelling the awaiting task cancels
    the future (as `asyncio.wrap_future` does).
    """
    if future.done():
        return _done(future)
    return asyncio.wrap_future(future)


async def _done(future: concurrent.futures.Future[T]) -> T:
    return future.result()


async def in_thread(fn: Callable[[], T], name: str) -> T:
    """Run `fn` on a new thread of its own (for an operation that joins the host threads)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def target() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            future.set_exception(exc)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        return await asyncio.wrap_future(future)
    finally:
        if future.done():
            thread.join()


def async_form(
    method: Callable[Concatenate[S, P], T], io: Callable[[S], HostIO]
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """The awaitable form of a blocking host method: same arguments, run on `io(self)`."""

    async def awaitable(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await io(self).run(method, self, *args, **kwargs)

    awaitable.__name__ = f"a{method.__name__}"
    awaitable.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.a{method.__name__}"
    awaitable.__doc__ = (
        f"`{method.__name__}`, awaitable: the same arguments and result; the blocking part "
        "(a durable store's commit) runs off the event loop."
    )
    return awaitable
