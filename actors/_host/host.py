"""`RunHost`: what a runtime's supervisors call back on (the `SupervisorHost` port).

It holds the runtime's `Services`, its `RunFactory` and its `RunDirectory`, and answers the
supervisors: a run ended, a run parks, a subagent's child run starts or is cancelled, a
message goes to another run. The `Runtime` facade owns one and adds the public API; nothing
here imports the facade.
"""

from __future__ import annotations

from typing import Any

from steerable.actors._engine.aloop import AsyncRunner
from steerable.actors._engine.clock import Clock
from steerable.actors._engine.mux import Dispatcher
from steerable.actors._engine.pool import WorkerPool
from steerable.actors._engine.timer import TimerService
from steerable.actors._machine.effects import ChildJob
from steerable.actors._stores.store import CheckpointStore
from steerable.actors._tools.tool import Tool

from .cell import RunCell
from .directory import RunDirectory
from .executors import Executors
from .factory import Agent, RunFactory
from .handle import RunHandle
from .runtrees import start_child
from .services import Parkable, Services

__all__ = ["RunHost"]


class RunHost:
    """The runtime's side of every supervisor: services, factory and directory in one place.

    Args:
        clock: The runtime's clock.
        dispatcher: Runs the supervisors.
        timer: Fires every run's timers.
        pool: Runs tools and `decide`.
        hook_pool: Runs hooks.
        aloop: Runs `async def` tools and agents.
        store: Where checkpoints go.
        hook_timeout: Seconds a run waits for its hooks.
        tools: The runtime's tools by name (shared with the `Runtime`).
        agents: The runtime's subagents by name (shared with the `Runtime`).
        passivate: Whether waiting runs give up their supervisor.
        executors: The runtime's executors (process pool, Ray), for remote tool calls.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        dispatcher: Dispatcher,
        timer: TimerService,
        pool: WorkerPool,
        hook_pool: WorkerPool,
        aloop: AsyncRunner,
        store: CheckpointStore,
        hook_timeout: float,
        tools: dict[str, Tool[Any, Any]],
        agents: dict[str, Agent],
        passivate: bool,
        executors: Executors,
    ) -> None:
        self.services = Services(
            clock=clock,
            dispatcher=dispatcher,
            timer=timer,
            pool=pool,
            hook_pool=hook_pool,
            aloop=aloop,
            store=store,
            hook_timeout=hook_timeout,
            agents=frozenset(agents),
            host=self,
            executors=executors,
        )
        self.factory = RunFactory(self.services, tools, agents)
        self.directory = RunDirectory(self.services, self.factory, passivate=passivate)

    def run_ended(self, run_id: str) -> None:
        """The run published its outcome: it leaves the directory."""
        self.directory.ended_run(run_id)

    def park(self, sup: Parkable) -> None:
        """Passivate a waiting run (the directory decides whether it can)."""
        self.directory.park(sup)

    def start_child(self, parent: RunCell, job: ChildJob) -> None:
        """Start, resume or find the child run of one of `parent`'s subagent calls."""
        start_child(self.directory, self.factory, parent, job)

    def cancel_child(self, run_id: str, reason: str) -> None:
        """Cancel a live child run as a host would: it records CANCELLED in order."""
        entry = self.directory.get(run_id)
        if entry is not None:
            RunHandle(self.directory, entry.cell).cancel(reason)

    def deliver(self, run_id: str, message: object) -> None:
        """Tell `message` to a live run, waking it if passivated (dropped if not live)."""
        self.directory.deliver(run_id, message)
