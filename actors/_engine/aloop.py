"""One asyncio event loop thread per runtime for `async def` tools and agents (docs/pykka.md T10).

A coroutine tool on a worker thread would hold that thread for its whole await; on one shared
loop, 100 tools awaiting 50 ms of I/O finish together in ~50 ms on a single thread. Callers never
block: work goes onto the loop with `call_soon_threadsafe`, and the outcome comes back through a
callback that runs on the loop thread (it typically tells a supervisor).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .clock import SystemClock
from .log import get_logger

__all__ = ["AsyncHandle", "AsyncRunner"]

_log = get_logger("steerable.aloop")

# Real time, on purpose: shutdown bounds how long it waits for a real thread.
_clock = SystemClock()

T = TypeVar("T")

DoneCallback = Callable[[Any, BaseException | None], None]


class AsyncHandle:
    """The caller's grip on one submitted coroutine: lets it be cancelled from any thread."""

    __slots__ = ("_cancel_requested", "_done", "_loop", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task: asyncio.Task[Any] | None = None  # set on the loop thread
        self._cancel_requested = False
        self._done = False

    @property
    def done(self) -> bool:
        """Whether `on_done` has been called."""
        return self._done

    def cancel(self) -> None:
        """Cancel the coroutine; `on_done` then gets an `asyncio.CancelledError`.

        Thread-safe and non-blocking. A no-op once done. A coroutine that catches the
        cancellation may still finish with a result.
        """
        if self._done:
            return
        # R18: the runner's loop may already be closed (shutdown cancelled everything).
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._cancel_on_loop)

    def _cancel_on_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        else:
            self._cancel_requested = True

    def __repr__(self) -> str:
        return f"<AsyncHandle done={self._done}>"


class AsyncRunner:
    """Runs coroutines as tasks on one lazily started daemon event loop thread.

    Args:
        name: The loop thread's name. Default "steerable-asyncio".
    """

    def __init__(self, *, name: str = "steerable-asyncio") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # touched only on the loop thread
        # Submitted, not yet made tasks (lock held): one loop wake takes every submit made
        # since the last, instead of a self-pipe write, and a GIL hand-off, per coroutine.
        self._pending: list[tuple[AsyncHandle, Callable[[], Coroutine[Any, Any, Any]], Any]] = []
        self._closed = False
        self._running = 0
        self._done = 0

    def submit(
        self,
        factory: Callable[[], Coroutine[Any, Any, T]],
        on_done: Callable[[T | None, BaseException | None], None],
    ) -> AsyncHandle:
        """Run `factory()` as a task on the loop thread (started on first use). Never blocks.

        `on_done(result, None)` or `on_done(None, exc)` is called exactly once, on the loop
        thread: `exc` is whatever the coroutine (or `factory()` itself) raised, an
        `asyncio.CancelledError` if it was cancelled (by `AsyncHandle.cancel()` or shutdown).
        Whatever `on_done` raises is logged and dropped. `factory` is called on the loop thread.

        Raises:
            RuntimeError: The runner is shut down.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("AsyncRunner is shut down")
            loop = self._loop if self._loop is not None else self._start_loop()
            handle = AsyncHandle(loop)
            self._running += 1
            self._pending.append((handle, factory, on_done))
            # Under the lock, so every submit is taken before shutdown's own callback runs.
            if len(self._pending) == 1:
                loop.call_soon_threadsafe(self._take_pending)
        return handle

    def owns_thread(self, thread: threading.Thread) -> bool:
        """Whether `thread` is this runner's event-loop thread."""
        return thread is self._thread

    def shutdown(self, timeout: float = 5.0) -> list[str]:
        """Cancel the remaining tasks, stop the loop and join its thread, within `timeout` s.

        Cancelled tasks' `on_done` callbacks run before the loop stops. Idempotent. A
        coroutine that ignores cancellation past the deadline is left on a daemon thread (logged).

        Returns:
            The loop thread's name if it is still alive, else an empty list.
        """
        deadline = _clock.now() + max(0.0, timeout)
        with self._lock:
            first = not self._closed
            self._closed = True
            loop, thread = self._loop, self._thread
            if first and loop is not None:
                loop.call_soon_threadsafe(self._begin_shutdown, timeout)
        if thread is None or thread is threading.current_thread():
            return []  # never started, or called from on_done: cannot join the loop from itself
        thread.join(max(0.0, deadline - _clock.now()))
        if thread.is_alive():
            _log.warning("asyncio_loop_not_stopped", thread=thread.name, timeout=timeout)
            return [thread.name]
        return []

    def statistics(self) -> dict[str, int]:
        """`tasks_running`: submitted, `on_done` not yet called; `tasks_done`: called."""
        with self._lock:
            return {"tasks_running": self._running, "tasks_done": self._done}

    def __repr__(self) -> str:
        return f"<AsyncRunner {self._name} running={self._running} closed={self._closed}>"

    # -- internals ----------------------------------------------------------------------------

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        """Create the loop and its daemon thread (lock held)."""
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_log_loop_error)
        thread = threading.Thread(target=self._run_loop, args=(loop,), name=self._name, daemon=True)
        try:
            thread.start()
        except BaseException:
            loop.close()
            raise
        self._loop, self._thread = loop, thread
        return loop

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def _take_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for handle, factory, on_done in batch:
            self._create_task(handle, factory, on_done)

    def _create_task(
        self, handle: AsyncHandle, factory: Callable[[], Coroutine[Any, Any, Any]], on_done: Any
    ) -> None:
        if handle._cancel_requested:
            self._deliver(handle, on_done, None, asyncio.CancelledError())
            return
        task = asyncio.get_running_loop().create_task(_call(factory))
        handle._task = task
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, handle, on_done))

    def _task_done(self, task: asyncio.Task[Any], handle: AsyncHandle, on_done: Any) -> None:
        self._tasks.discard(task)
        try:
            result = task.result()
        except _Contained as exc:
            self._deliver(handle, on_done, None, exc.original)
        except BaseException as exc:  # noqa: BLE001 - CancelledError included, by contract
            self._deliver(handle, on_done, None, exc)
        else:
            self._deliver(handle, on_done, result, None)

    def _deliver(
        self, handle: AsyncHandle, on_done: DoneCallback, result: Any, exc: BaseException | None
    ) -> None:
        handle._done = True
        handle._task = None
        with self._lock:
            self._running -= 1
            self._done += 1
        try:
            on_done(result, exc)
        except BaseException as error:  # noqa: BLE001
            # A SystemExit from a loop callback would end run_forever; nothing may kill the loop.
            with contextlib.suppress(Exception):
                _log.error("on_done_raised", error=repr(error), exc_info=error)

    def _begin_shutdown(self, timeout: float) -> None:
        for task in self._tasks:
            task.cancel()
        loop = asyncio.get_running_loop()
        if not self._tasks:
            loop.stop()
            return
        # Let the cancelled tasks unwind (their on_done runs), then stop however it went.
        drain = loop.create_task(asyncio.wait(set(self._tasks), timeout=timeout))
        drain.add_done_callback(lambda _: loop.stop())


async def _call(factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:
        return await factory()
    except (KeyboardInterrupt, SystemExit) as exc:
        # asyncio re-raises these out of run_forever, which would kill the loop thread: turn
        # them into an ordinary failure of this one task.
        raise _Contained(exc) from exc


class _Contained(Exception):  # an internal carrier, unwrapped before on_done
    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


def _log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    del loop
    with contextlib.suppress(Exception):
        _log.error(
            "asyncio_loop_error",
            message=context.get("message"),
            exc_info=context.get("exception"),
        )
