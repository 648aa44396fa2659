"""What the runtime needs from a place that runs calls outside its own threads (docs/isolation.md).

An executor runs a `RemoteTask`: an entry point named `"module:function"` and the bytes it
gets. The engine knows nothing of tools or runs: the tools layer encodes a call into a task and
decodes the bytes that come back. Two executors exist: `ProcessPool` (warm worker processes that
can be killed) and `RayExecutor` (Ray tasks, the `steerable[ray]` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

__all__ = ["Executor", "OutcomeKind", "RemoteHandle", "RemoteOutcome", "RemoteTask"]


@dataclass(frozen=True, slots=True)
class RemoteTask:
    """One call for an executor: the entry point, its payload, and per-call options.

    Attributes:
        entry: `"module:function"`, importable where the call runs; called as
            `function(payload, scope)` and returning the result's bytes.
        payload: What the entry decodes.
        remaining: Seconds until the call's deadline, or None; the worker's `CancelScope` has
            the matching deadline on its own clock.
        options: Executor-specific options (process: `memory_limit`, `cpu_seconds`; Ray:
            `num_cpus`, `resources`).
        label: A name for logs and errors (the tool's name).
    """

    entry: str
    payload: bytes
    remaining: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""


class OutcomeKind(StrEnum):
    """How a remote call ended."""

    DONE = "done"
    """The entry returned; `payload` holds its bytes."""
    FAILED = "failed"
    """The entry could not run (not importable, raised); `message` says why."""
    CRASHED = "crashed"
    """The worker died during the call (signal, exit, limit); `details` has the status."""
    CANCELLED = "cancelled"
    """Signalled before it started: it never ran."""
    REFUSED = "refused"
    """The executor is shut down, or it lost the call at shutdown."""


@dataclass(frozen=True, slots=True)
class RemoteOutcome:
    """The end of one remote call, as the executor reports it to `on_done`."""

    kind: OutcomeKind
    payload: bytes | None = None
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


class RemoteHandle(Protocol):
    """A submitted call: signal it cooperatively, or kill it."""

    def signal(self, reason: str) -> None:
        """Set the call's cancel scope where it runs (the tool may stop on its own)."""
        ...

    def kill(self) -> bool:
        """Stop the call by force; never blocks.

        Returns:
            True if nothing of the call runs on (killed, never started, or already over):
            `on_done` is then not called for it. False if the call may still be running.
        """
        ...


class Executor(Protocol):
    """A place that runs remote tasks; thread-safe, and `submit` never blocks for long."""

    def start(self) -> None:
        """Get ready (warm workers, connect); idempotent."""
        ...

    def submit(self, task: RemoteTask, on_done: Callable[[RemoteOutcome], None]) -> RemoteHandle:
        """Run `task`; `on_done(outcome)` is called once (on an executor thread), unless
        `kill()` returned True first."""
        ...

    def shutdown(self, timeout: float = 5.0) -> list[str]:
        """Stop every call and worker; returns the names of workers still alive after it."""
        ...

    def statistics(self) -> dict[str, int]:
        """Counters for `Runtime.statistics()`."""
        ...
