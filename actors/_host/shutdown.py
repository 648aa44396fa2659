"""`Runtime`'s shutdown: stop every run and every thread the runtime started.

The base of `Runtime` (split from runtime.py along its seam): live runs are cancelled or
parked, then the dispatcher, lease keeper, timer, pools, event loop, executors, observers
and the store are stopped in that order, each within what is left of the timeout. It stops
only what the runtime started (docs/pykka.md T9).
"""

from __future__ import annotations

import contextlib
import threading

import pykka

from steerable.actors._engine.clock import Clock
from steerable.actors._engine.log import get_logger
from steerable.actors._stores.store import CheckpointStore
from steerable.protocol import AgentError, ErrorCode, SteerableError

from .directory import RunDirectory
from .handle import RunHandle
from .observing import Observability
from .offload import HostIO
from .ownership import RunOwnership
from .services import Services

__all__ = ["RuntimeShutdown"]

_log = get_logger("steerable.runtime")


class RuntimeShutdown:
    """`shutdown()` for `Runtime` (which builds the parts it stops)."""

    clock: Clock
    store: CheckpointStore
    services: Services
    host_io: HostIO
    directory: RunDirectory
    ownership: RunOwnership
    _observing: Observability
    _lock: threading.Lock
    _closed: bool
    _shut_down: threading.Event
    _left: list[str]

    def shutdown(self, timeout: float = 5.0, *, cancel_runs: bool | None = None) -> list[str]:
        """Stop every run and every thread this runtime started.

        Args:
            timeout: Seconds to wait in all (live runs to end, workers to finish).
            cancel_runs: True cancels live runs (they end CANCELLED). False parks them: they
                stop where they stand, resumable from their last checkpoint by this or another
                process (`rt.resume`), and their handles' `result()` raises `SteerableError`
                (`run_ended`). Default: park when the store is durable (a routine deploy must
                not cancel the runs waiting for a person), cancel with an in-memory store
                (nothing could resume them).

        Returns:
            The names of threads still alive because their tool never returned (abandoned
            workers, daemon threads); everything else is gone. A second call (from any thread)
            waits until the first has finished and returns the same names.

        Raises:
            RuntimeError: Called from one of this runtime's own threads (inside a tool, a
                hook, a sync `decide` or `accept`): it cannot wait for the thread it runs on.
                Nothing is stopped; call it from the host's thread (or use `ashutdown`).
            TypeError: `timeout` is not a number. Nothing is stopped.
        """
        if self._on_own_thread():
            raise RuntimeError(
                "Runtime.shutdown() called from one of the runtime's own threads (a tool, a "
                "hook or a decide): it cannot wait for itself; nothing was stopped. Call it "
                "from the host's thread (e.g. after result() returns)."
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be seconds as a number, not {timeout!r}")
        with self._lock:
            first = not self._closed
            self._closed = True
        if not first:
            self._shut_down.wait()
            return list(self._left)
        try:
            self._left = self._shutdown(timeout, cancel_runs)
        finally:
            self._shut_down.set()
        return list(self._left)

    def _on_own_thread(self) -> bool:
        thread = threading.current_thread()
        services = self.services
        return (
            services.dispatcher.owns_thread(thread)
            or services.timer.owns_thread(thread)
            or services.pool.owns_thread(thread)
            or services.hook_pool.owns_thread(thread)
            or services.aloop.owns_thread(thread)
            or self._observing.feed.owns_thread(thread)
        )

    def _shutdown(self, timeout: float, cancel_runs: bool | None) -> list[str]:
        if cancel_runs is None:
            cancel_runs = not self.store.durable
        deadline = self.clock.now() + timeout
        # Operations stored from now on wait for the next owner of their run.
        self.ownership.stop_watching(timeout=max(0.1, deadline - self.clock.now()))
        self.host_io.shutdown()
        live = self.directory.entries()
        if cancel_runs:
            for entry in live:
                RunHandle(self.directory, entry.cell).cancel("runtime shutdown")
            for entry in live:
                try:
                    entry.cell.future.result(max(0.0, deadline - self.clock.now()))
                except TimeoutError:
                    _log.warning("run_not_settled_at_shutdown", run_id=entry.cell.run_id)
        for entry in self.directory.close():
            if not entry.cell.future.done():
                entry.cell.future.set_exception(_shut_down())
                entry.cell.events.close()
            ref = entry.ref
            if ref is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.stop(block=False)
        services = self.services
        # Hooks still pending when a run ended run after its outcome: let them finish first.
        services.hooks_draining.wait(deadline - self.clock.now())
        services.dispatcher.stop(timeout=max(0.1, deadline - self.clock.now()))
        self.ownership.stop(timeout=max(0.1, deadline - self.clock.now()))
        services.timer.stop(timeout=max(0.1, deadline - self.clock.now()))
        left = services.pool.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.hook_pool.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.aloop.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += services.executors.shutdown(timeout=max(0.1, deadline - self.clock.now()))
        left += self._observing.close(self.clock.wall(), max(0.1, deadline - self.clock.now()))
        self.store.close()
        if left:
            _log.warning("threads_abandoned_at_shutdown", threads=left)
        return left


def _shut_down() -> SteerableError:
    return SteerableError(AgentError.of(ErrorCode.RUN_ENDED, "the runtime is shut down"))
