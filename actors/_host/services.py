"""`Services`: the shared machinery of one runtime, and the port its supervisors call back on.

A leaf module (it imports no other host module but the cell), so that supervisors, the
directory and the factory can all hold the runtime's machinery without importing the
`Runtime` facade or one another (tests/test_layers.py pins that the host side has no cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from steerable.actors._engine.aloop import AsyncRunner
from steerable.actors._engine.clock import Clock
from steerable.actors._engine.mux import Dispatcher
from steerable.actors._engine.pool import WorkerPool
from steerable.actors._engine.timer import TimerService
from steerable.actors._machine.effects import ChildJob
from steerable.actors._stores.store import CheckpointStore

from .jobs import HookDrain
from .offload import HostIO

if TYPE_CHECKING:
    from steerable.protocol import TranscriptEntry

    from .cell import RunCell
    from .executors import Executors

__all__ = ["Parkable", "Services", "SupervisorHost"]


class Parkable(Protocol):
    """What a supervisor shows the directory when its run could passivate."""

    @property
    def cell(self) -> RunCell:
        """The run's cell."""
        ...

    @property
    def actor_urn(self) -> str:
        """The supervisor's actor identity (a woken run has a new one)."""
        ...

    def inbox_empty(self) -> bool:
        """Whether no message waits in the supervisor's inbox."""
        ...

    def parked_state(self) -> tuple[float | None, dict[str, dict[str, Any]]]:
        """The run's deadline and the validated arguments of its unfinished calls."""
        ...

    def parked_transcript(self) -> list[TranscriptEntry]:
        """The run's transcript as stored at its parked revision."""
        ...

    def stop_parked(self) -> None:
        """Stop the supervisor (without waiting): its run now lives in the store."""
        ...


class SupervisorHost(Protocol):
    """What a run's supervisor asks of the runtime that hosts it. Never blocks."""

    def run_ended(self, run_id: str) -> None:
        """The run published its outcome: it is no longer live."""
        ...

    def park(self, sup: Parkable) -> None:
        """The run waits for a person: passivate it if nothing else is pending."""
        ...

    def start_child(self, parent: RunCell, job: ChildJob) -> None:
        """Start (or resume, or find) the child run of a subagent call of `parent`."""
        ...

    def cancel_child(self, run_id: str, reason: str) -> None:
        """Cancel a child run through its own inbox."""
        ...

    def deliver(self, run_id: str, message: object) -> None:
        """Tell a runtime message to a live run, waking it if passivated."""
        ...

    def lease_lost(self, run_id: str) -> None:
        """Fence a run of this runtime out (its lease is lost): it stops at once."""
        ...

    def poke_leases(self) -> None:
        """Renew leases now (a run waits for a renewal to start a tool)."""
        ...


@dataclass(slots=True)
class Services:
    """The shared machinery every supervisor of one runtime uses."""

    clock: Clock
    dispatcher: Dispatcher
    timer: TimerService
    pool: WorkerPool
    hook_pool: WorkerPool
    aloop: AsyncRunner
    store: CheckpointStore
    hook_timeout: float
    agents: frozenset[str]
    """Names of the agents runs may start as subagents."""
    host: SupervisorHost
    executors: Executors
    """Where remote tool calls run: the process pool, named executors (docs/isolation.md)."""
    host_io: HostIO = field(default_factory=HostIO)
    """The threads of the async face (`await rt.astart(...)`, `await handle.asend(...)`)."""
    hooks_draining: HookDrain = field(default_factory=HookDrain)
    """Runs whose outcome is published while their pending hooks still run."""
