"""`RunDirectory`: the runtime's own table of runs (never pykka's global registry, T9).

Each entry holds what it takes to run a run's supervisor: its cell, agent, tools, hooks and
config. An entry is ACTIVE (a live supervisor) or PASSIVATED (no actor, no thread: the run
waits for a person and its state is in the store). Host messages always go through here:
stored first, then told to the live supervisor or used to wake a passivated run
(docs/pykka.md T1, T6, T8).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._engine.log import get_logger
from steerable.actors._machine.machine import RunMachine
from steerable.actors._stores.store import CheckpointStore
from steerable.actors._tools.tool import Tool
from steerable.protocol import (
    AgentError,
    CapabilitySnapshot,
    Compatibility,
    ErrorCode,
    ForkOrigin,
    HookName,
    HostMessage,
    RunConfig,
    RunEvent,
    RunMetrics,
    SteerableError,
    StoredRun,
    SubagentResult,
)

from .cell import RunCell
from .jobs import Accept
from .supervisor import Begin, HostMsg, RunSupervisor

if TYPE_CHECKING:
    from .runtime import Services

__all__ = ["RunDirectory", "RunEntry"]

_log = get_logger("steerable.directory")
_STORED_WAIT = 30.0  # seconds a message waits for its run's first stored revision

Hook = Callable[[RunEvent], object]


@dataclass(slots=True)
class RunEntry:
    """Everything needed to (re)start one run's supervisor."""

    cell: RunCell
    config: RunConfig
    agent: Any
    agent_name: str
    accept: Accept | None
    tools: dict[str, Tool[Any, Any]]
    hooks: dict[HookName, list[Hook]]
    capabilities: CapabilitySnapshot
    compatibility: Compatibility | None
    ref: pykka.ActorRef[RunSupervisor] | None = None
    deadline: float | None = None
    """The run's absolute (monotonic) deadline, kept while passivated."""
    arguments: dict[str, dict[str, Any]] | None = None
    """Validated arguments of the parked plan's calls, kept in memory while passivated (the
    store has secrets only as references)."""


def ended_error(run_id: str, why: str = "ended") -> SteerableError:
    """The error for a message to a run that is not live."""
    return SteerableError(AgentError.of(ErrorCode.RUN_ENDED, f"run {run_id} {why}", run_id=run_id))


class RunDirectory:
    """Live runs by id, active or passivated. Thread-safe.

    Args:
        services: The runtime's shared machinery.
        passivate: Whether waiting runs give up their supervisor (default True).
    """

    def __init__(self, services: Services, *, passivate: bool = True) -> None:
        self.services = services
        self.passivate = passivate
        self._lock = threading.Lock()
        self._runs: dict[str, RunEntry] = {}
        self.started = 0
        self.ended = 0
        self.wakes = 0
        self.closed = False

    @property
    def store(self) -> CheckpointStore:
        """The runtime's store."""
        return self.services.store

    def get(self, run_id: str) -> RunEntry | None:
        """The entry of a live run, or None."""
        with self._lock:
            return self._runs.get(run_id)

    def entries(self) -> list[RunEntry]:
        """Every live entry."""
        with self._lock:
            return list(self._runs.values())

    def counts(self) -> tuple[int, int]:
        """(active, passivated) runs."""
        with self._lock:
            active = sum(1 for e in self._runs.values() if e.ref is not None)
            return active, len(self._runs) - active

    # ------------------------------------------------------------------ starting

    def launch(
        self,
        entry: RunEntry,
        machine: Callable[[RunSupervisor], RunMachine],
        begin: Begin,
    ) -> None:
        """Register `entry` and start its supervisor with `begin`.

        Raises:
            SteerableError: `run_ended` once the runtime is shut down; `resource_exhausted` if
                no actor could be started.
        """
        with self._lock:
            if self.closed:
                raise ended_error(entry.cell.run_id, "cannot start: the runtime is shut down")
            if entry.cell.run_id in self._runs:
                raise SteerableError(
                    AgentError.of(
                        ErrorCode.INTERNAL_ERROR, f"run {entry.cell.run_id} is already live"
                    )
                )
            self._runs[entry.cell.run_id] = entry
            self.started += 1
        self._start_supervisor(entry, machine, begin)

    def _start_supervisor(
        self, entry: RunEntry, machine: Callable[[RunSupervisor], RunMachine], begin: Begin
    ) -> None:
        try:
            ref = RunSupervisor.start(
                services=self.services,
                cell=entry.cell,
                machine_factory=machine,
                agent=entry.agent,
                accept=entry.accept,
                tools=entry.tools,
                hooks=entry.hooks,
            )
        except RuntimeError as exc:  # T1: starting an actor is fallible
            with self._lock:
                self._runs.pop(entry.cell.run_id, None)
            raise SteerableError(
                AgentError.of(ErrorCode.RESOURCE_EXHAUSTED, f"could not start a supervisor: {exc}")
            ) from exc
        entry.ref = ref
        ref.tell(begin)

    def restored_machine(
        self,
        entry: RunEntry,
        stored: StoredRun,
        *,
        fork: ForkOrigin | None = None,
        run_id: str | None = None,
        config: RunConfig | None = None,
        arguments: dict[str, dict[str, Any]] | None = None,
    ) -> Callable[[RunSupervisor], RunMachine]:
        """A machine factory that restores `stored` (for resume, wake and fork)."""
        snap = stored.snapshot
        clock = self.services.clock
        children = self._child_metrics(stored) if fork is None else {}

        def factory(sup: RunSupervisor) -> RunMachine:
            machine = RunMachine(
                sup,
                run_id=run_id or snap.run_id,
                trace_id=entry.cell.trace_id,
                task=snap.task,
                agent=entry.agent_name,
                config=config or snap.config,
                tools=entry.tools,
                capabilities=entry.capabilities,
                compatibility=entry.compatibility or snap.compatibility,
                session_id=snap.session_id,
                task_id=snap.task_id,
                parent_run_id=snap.parent_run_id,
                depth=snap.depth,
                created_at=clock.wall() if fork is not None else snap.created_at,
                subagents=self.services.agents,
            )
            machine.restore(stored, fork=fork, arguments=arguments, children=children)
            if entry.deadline is not None and fork is None:
                machine._deadline_left = max(0.0, entry.deadline - clock.now())
            return machine

        return factory

    def _child_metrics(self, stored: StoredRun) -> dict[str, RunMetrics]:
        """What each child whose result is journaled used: the parent's last checkpoint
        predates that result, so the usage must be added again on restore."""
        out: dict[str, RunMetrics] = {}
        for call_id, result in stored.journal.items():
            if isinstance(result, SubagentResult) and result.child_run_id:
                try:
                    out[call_id] = self.store.load(result.child_run_id).snapshot.metrics
                except SteerableError:
                    _log.warning("child_metrics_missing", child_run_id=result.child_run_id)
        return out

    # ------------------------------------------------------------------ messages

    def post(self, cell: RunCell, build: Callable[[int], HostMessage]) -> HostMessage:
        """Accept a host message: assign its seq, store it, deliver or wake (in seq order)."""
        entry = self.get(cell.run_id)
        if entry is None:
            raise ended_error(cell.run_id, "is not live")
        store = self.store
        if cell.store_error is not None:
            raise SteerableError(cell.store_error)
        if store.durable and not cell.stored.is_set() and not cell.stored.wait(_STORED_WAIT):
            # A message for a run the store does not know yet would be lost with it in a
            # crash: accepting means storing both (the first revision is milliseconds away).
            raise SteerableError(
                AgentError.of(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"run {cell.run_id} has no stored revision after {_STORED_WAIT}s; not accepted",
                    run_id=cell.run_id,
                )
            )
        if cell.store_error is not None:  # its first revision was given up while we waited
            raise SteerableError(cell.store_error)

        def deliver(message: HostMessage) -> None:
            store.append_message(cell.run_id, message)  # stored before send() returns
            ref = entry.ref
            if ref is None:
                self._wake(entry)  # the stored message is among those the wake applies
                return
            try:
                ref.tell(HostMsg(message))
            except pykka.ActorDeadError:
                raise ended_error(cell.run_id) from None

        return cell.accept(build, deliver)

    def tell_timer(self, run_id: str, message: object) -> None:
        """Deliver a timer message, waking a passivated run for it."""
        entry = self.get(run_id)
        if entry is None:
            return
        with entry.cell.lock:
            if entry.ref is None:
                self._wake(entry)
            ref = entry.ref
        if ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):  # ended meanwhile: nothing to do
                ref.tell(message)

    # ------------------------------------------------------------------ passivation

    def park(self, sup: RunSupervisor) -> None:
        """Passivate a parked run: its supervisor stops; its next message wakes it.

        Runs on the supervisor's (dispatcher) thread, after a handler. Under the cell's lock
        no host message can be told to the actor, so an empty inbox here stays empty.
        """
        if not self.passivate:
            return
        cell = sup.cell
        entry = self.get(cell.run_id)
        if entry is None or entry.ref is None or entry.ref.actor_urn != sup.actor_urn:
            return
        with cell.lock:
            if not sup.actor_inbox.empty() or self.closed:
                return
            entry.ref = None
            entry.deadline = sup.machine.deadline
            entry.arguments = {c.call_id: c.arguments for c in sup.machine.plan if c.result is None}
        # Its timers are cancelled as it stops; its checkpoint may still be in the store's
        # writer queue, which `load` flushes before reading (the dispatcher never waits on it).
        sup.actor_ref.stop(block=False)
        if entry.deadline is not None:
            # A parked run still has a deadline: the timer wakes it (R14).
            from steerable.actors._machine.effects import TimerKind

            from .supervisor import TimerFired

            run_id = cell.run_id
            message = TimerFired(TimerKind.RUN_DEADLINE, "run", 0)
            self.services.timer.schedule_at(
                entry.deadline, lambda: self.tell_timer(run_id, message)
            )

    def _wake(self, entry: RunEntry) -> None:
        """Restart a passivated run's supervisor from its checkpoint (caller holds cell.lock)."""
        stored = self.store.load(entry.cell.run_id)
        self.wakes += 1
        kept, entry.arguments = entry.arguments, None
        self._start_supervisor(
            entry,
            self.restored_machine(entry, stored, arguments=kept),
            Begin(resume=True, messages=tuple(stored.messages), wake=True),
        )

    # ------------------------------------------------------------------ ending

    def ended_run(self, run_id: str) -> None:
        """A run reached its terminal state and published its outcome."""
        with self._lock:
            if self._runs.pop(run_id, None) is not None:
                self.ended += 1

    def close(self) -> list[RunEntry]:
        """Refuse new runs; return the live entries."""
        with self._lock:
            self.closed = True
            return list(self._runs.values())
