"""`RayExecutor`: tool calls as Ray tasks (the `steerable[ray]` extra; docs/isolation.md).

Tasks, not actors: only a task can be force-cancelled, which kills the worker process that runs
it (`ray.cancel(ref, force=True)`). A task's result comes back through its `ObjectRef`'s future,
whose callback hands it to `on_done` (the tools layer tells the run's supervisor, as for any
tool result). Ray's tasks get no cooperative cancel signal: a cancelled call is killed when the
run gives up on it (after `cancel_grace`, or at once on a timeout).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .cancel import CancelScope
from .executor import OutcomeKind, RemoteOutcome, RemoteTask
from .log import get_logger

__all__ = ["RayExecutor"]

_log = get_logger("steerable.ray")

OnDone = Callable[[RemoteOutcome], None]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "tools with executor='ray' need Ray: install the extra with "
            "pip install 'steerable[ray]'"
        ) from exc
    return ray


def run_task(entry: str, payload: bytes, remaining: float | None) -> bytes:
    """The body of every Ray task: run the entry point where Ray placed the task."""
    from .procworker import resolve_entry

    deadline = None if remaining is None else time.monotonic() + remaining
    return resolve_entry(entry)(payload, CancelScope(deadline))


class _RayCall:
    """One submitted task: `kill()` force-cancels it."""

    __slots__ = ("_executor", "_lock", "_on_done", "_over", "ref")

    def __init__(self, executor: RayExecutor, ref: Any, on_done: OnDone) -> None:
        self._executor = executor
        self.ref = ref
        self._on_done = on_done
        self._over = False
        self._lock = threading.Lock()

    def signal(self, reason: str) -> None:
        """Ray tasks get no cooperative signal; the kill follows (see the module docstring)."""

    def kill(self) -> bool:
        """Force-cancel the task (Ray kills its worker process); never blocks."""
        with self._lock:
            already = self._over
            self._over = True
        if not already:
            self._executor._forget(self)
            with contextlib.suppress(Exception):
                self._executor.ray.cancel(self.ref, force=True)
        return True

    def finish(self, outcome: RemoteOutcome) -> None:
        with self._lock:
            if self._over:
                return
            self._over = True
        self._executor._forget(self)
        try:
            self._on_done(outcome)
        except BaseException as exc:  # noqa: BLE001 - a broken callback must not break Ray's thread
            with contextlib.suppress(Exception):
                _log.error("on_done_raised", error=repr(exc), exc_info=exc)


class RayExecutor:
    """Runs tools with `executor="ray"` as Ray tasks; implements `Executor`.

    Args:
        address: The cluster to join (`ray.init(address=...)`): None starts or joins a local
            one, "auto" joins a running cluster. Ignored if Ray is already initialised in this
            process (then the host's Ray is used, and left running at shutdown).
        init_options: Further `ray.init` keyword arguments (e.g. `num_cpus`).

    Raises:
        ImportError: Ray is not installed (`pip install 'steerable[ray]'`).
    """

    def __init__(
        self, *, address: str | None = None, init_options: Mapping[str, Any] | None = None
    ) -> None:
        self.ray = _import_ray()
        self._address = address
        self._init_options = dict(init_options or {})
        self._owns_ray = False
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._calls: set[_RayCall] = set()
        self._remote: Any = None
        self._submitted = 0

    def start(self) -> None:
        """Initialise Ray (unless the host already did) and register the task. Idempotent."""
        with self._lock:
            if self._started:
                return
            ray = self.ray
            if not ray.is_initialized():
                options: dict[str, Any] = {
                    # A library prints nothing on stdout: no worker output forwarded to it.
                    "log_to_driver": False,
                    "include_dashboard": False,
                    "logging_level": logging.WARNING,
                    **self._init_options,
                }
                ray.init(address=self._address, **options)
                self._owns_ray = True
            # max_retries=0: a retry is the run's decision (its retry policy), never Ray's.
            self._remote = ray.remote(max_retries=0)(run_task)
            self._started = True

    def submit(self, task: RemoteTask, on_done: OnDone) -> _RayCall:
        """Submit `task` as a Ray task; `on_done` runs on Ray's callback thread."""
        self.start()
        options: dict[str, Any] = {}
        if "num_cpus" in task.options:
            options["num_cpus"] = task.options["num_cpus"]
        if "resources" in task.options:
            options["resources"] = dict(task.options["resources"])
        with self._lock:
            closed = self._closed
        if closed:
            refused = _RayCall(self, None, on_done)
            refused.finish(RemoteOutcome(OutcomeKind.REFUSED, message="the executor is shut down"))
            return refused
        remote = self._remote.options(**options) if options else self._remote
        ref = remote.remote(task.entry, task.payload, task.remaining)
        call = _RayCall(self, ref, on_done)
        with self._lock:
            self._calls.add(call)
            self._submitted += 1
        ref.future().add_done_callback(lambda future: call.finish(self._outcome(future)))
        return call

    def _outcome(self, future: Any) -> RemoteOutcome:
        exceptions = self.ray.exceptions
        try:
            payload = future.result()
        except exceptions.TaskCancelledError:
            return RemoteOutcome(OutcomeKind.CANCELLED, message="cancelled by Ray")
        except (exceptions.WorkerCrashedError, exceptions.NodeDiedError) as exc:
            return RemoteOutcome(
                OutcomeKind.CRASHED, message=f"its Ray worker died: {exc}", details={"ray": True}
            )
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises is a typed failure
            return RemoteOutcome(OutcomeKind.FAILED, message=f"{type(exc).__name__}: {exc}")
        return RemoteOutcome(OutcomeKind.DONE, payload=bytes(payload))

    def _forget(self, call: _RayCall) -> None:
        with self._lock:
            self._calls.discard(call)

    def shutdown(self, timeout: float = 5.0) -> list[str]:
        """Force-cancel the tasks still running (reported `refused`); stop Ray if we started it."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            calls = list(self._calls)
        for call in calls:
            with contextlib.suppress(Exception):
                self.ray.cancel(call.ref, force=True)
            call.finish(RemoteOutcome(OutcomeKind.REFUSED, message="the runtime shut down"))
        if self._owns_ray:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
        return []

    def statistics(self) -> dict[str, int]:
        """Counters: tasks submitted, tasks running."""
        with self._lock:
            return {"ray_tasks": self._submitted, "ray_tasks_running": len(self._calls)}
