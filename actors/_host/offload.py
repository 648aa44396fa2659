"""Host operations off the event loop: the async face's worker threads.

`start`, `send`, `approve` and the rest return quickly, but with a durable store they wait for
a commit (milliseconds), which an asyncio host must never spend on its loop. The async forms
(`await rt.astart(...)`, `await handle.asend(...)`) run the same sync operation on one of a few
"steerable-host-N" threads and await its `concurrent.futures.Future` through
`asyncio.wrap_future`, which blocks nothing (docs/pykka.md T10). The threads start on first
use and are joined by `Runtime.shutdown()`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = ["HostIO", "async_form", "in_thread"]

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")


class HostIO:
    """A small, lazily started thread pool for the blocking part of host operations.

    Args:
        max_threads: Threads at most (host operations are short; a few suffice). Default 4.
        name: Prefix of the threads' names.
    """

    def __init__(self, max_threads: int = 4, name: str = "steerable-host") -> None:
        self._max_threads = max_threads
        self._name = name
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    async def run(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """Run `fn(*args, **kwargs)` on a host thread and await its result on this loop."""
        return await asyncio.wrap_future(self._submit(fn, *args, **kwargs))

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn()` on a host thread; its future (for a caller that awaits it itself)."""
        return self._submit(fn)

    def _submit(
        self, fn: Callable[..., T], /, *args: object, **kwargs: object
    ) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                # Shut down: run inline (it raises the operation's own "shut down" error).
                future: concurrent.futures.Future[T] = concurrent.futures.Future()
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                    future.set_exception(exc)
                return future
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._max_threads, thread_name_prefix=self._name
                )
            return self._executor.submit(fn, *args, **kwargs)

    def shutdown(self) -> None:
        """Wait for the operations in flight, then join the threads."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


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
