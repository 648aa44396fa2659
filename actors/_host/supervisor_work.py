"""The supervisor's work: model calls, tool calls, child runs and timers in flight.

The base of `RunSupervisor` (split from supervisor.py along its seam): the machine's
effects port for starting, holding (write-ahead: a call with side effects waits for its
checkpoint), cancelling and abandoning work, and for its timers (docs/pykka.md T2, T3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.mux import tell_now
from steerable.actors._machine.effects import CallJob, ChildJob, TimerKind
from steerable.actors._machine.machine import MODEL_KEY, RunMachine
from steerable.actors._tools.tool import Tool, ToolContext
from steerable.protocol import AgentError, ErrorCode, EventKind, RunView, SideEffect

from .jobs import Accept, DecideJob, ToolDone, ToolJob
from .live import LiveEvent, ModelCallContext
from .messages import TimerFired

if TYPE_CHECKING:
    from .cell import RunCell
    from .services import Services

__all__ = ["SupervisorWork"]


@dataclass(slots=True)
class _Work:
    job: DecideJob | ToolJob
    scope: CancelScope
    attempt: int
    handle: Any = None  # AsyncHandle for async work, RemoteHandle for remote work
    remote: bool = False  # runs on an executor (a worker process, a Ray task): killable


class SupervisorWork:
    """Work in flight for one run; `RunSupervisor` holds the state (see its `__init__`)."""

    services: Services
    cell: RunCell
    agent: Any
    accept: Accept | None
    tools: Mapping[str, Tool[Any, Any]]
    machine: RunMachine
    _async_decide: bool
    _work: dict[str, _Work]
    _children: dict[str, str]
    _stored: int
    _held: list[tuple[int, CallJob]]
    _durable: bool
    _held_decide: tuple[int, tuple[int, RunView, float]] | None
    _timers: dict[tuple[TimerKind, str], Any]

    if TYPE_CHECKING:  # provided by pykka's Actor (no stub shadows it at run time)

        @property
        def actor_ref(self) -> pykka.ActorRef[Any]: ...

    def decide(self, model_call: int, view: RunView, deadline: float) -> None:
        """Run the agent's decide on a worker (or the event loop for `async def decide`).

        With a durable store, the model call after a safe boundary starts only once the
        checkpoint before that boundary is stored: a run never gets more than one boundary
        ahead of its store (a store that retries a write holds its runs back; one that gives
        it up ends them in ERROR `store_unavailable`).
        """
        needed = self.cell.revision - 1
        if self._durable and self._stored < needed:
            self._held_decide = (needed, (model_call, view, deadline))
            return
        self._start_decide(model_call, view, deadline)

    def _start_decide(self, model_call: int, view: RunView, deadline: float) -> None:
        scope = self.cell.scope.child(deadline)
        view = dataclasses.replace(view, call=ModelCallContext(model_call, scope, self.actor_ref))
        job = DecideJob(
            self.agent, view, self.accept, self.actor_ref, model_call, self.services.clock
        )
        work = _Work(job, scope, model_call)
        self._work[MODEL_KEY] = work
        if self._async_decide:
            started = self.services.clock.now()
            handle = work.handle = self.services.aloop.submit(
                job.coroutine, lambda value, exc: job.report(started, value, exc)
            )
            # A cancel or an interrupt reaches the coroutine at once: its HTTP request is
            # closed (the provider stops billing) instead of running on until abandoned.
            scope.on_cancel(lambda _reason: handle.cancel())
        elif not self.services.pool.submit(job):
            job.report(self.services.clock.now(), None, RuntimeError("the runtime is shut down"))

    def dispatch(self, job: CallJob) -> None:
        """Run one tool call attempt on a worker, or on the event loop for `async def` tools.

        Write-ahead (R4, R21): a call with side effects starts only once the checkpoint that
        holds its idempotency key is stored, so a crash can never leave a write whose key no
        checkpoint knows. Side-effect-free calls start at once.
        """
        tool = self.tools[job.tool]
        if tool.spec.side_effect is not SideEffect.NONE and self._stored < self.cell.revision:
            self._held.append((self.cell.revision, job))
            return
        self._start_call(tool, job)

    def _release_held(self, key: str, error: AgentError | None) -> bool:
        """Drop a call still waiting for its checkpoint; report `error` for it if given."""
        for index, (_, job) in enumerate(self._held):
            if job.call_id == key:
                del self._held[index]
                if error is not None:
                    self.actor_ref.tell(ToolDone(job.call_id, job.attempt, None, error))
                return True
        return False

    def _tool_emitter(self, call_id: str) -> Callable[[str, dict[str, Any], bool], None]:
        """`ToolContext.emit` of one call: a `LiveEvent` told to this supervisor."""
        ref = self.actor_ref

        def emit(name: str, data: dict[str, Any], live: bool) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                tell_now(ref, LiveEvent(EventKind.CUSTOM, {**data, "live": live}, call_id=call_id))

        return emit

    def _start_call(self, tool: Tool[Any, Any], job: CallJob) -> None:
        services = self.services
        cell = self.cell
        if time.monotonic() >= cell.lease_deadline:
            # Past the lease's sure deadline (a frozen process, a starved renewer): no tool
            # starts until a renewal says the run is still ours (docs/durability.md).
            self._held.append((-1, job))
            cell.lease_wait = True
            services.host.poke_leases()
            return
        scope = self.cell.scope.child(job.deadline)
        ctx = ToolContext(
            run_id=self.cell.run_id,
            trace_id=self.cell.trace_id,
            call_id=job.call_id,
            tool=job.tool,
            idempotency_key=job.idempotency_key,
            attempt=job.attempt,
            deadline=job.deadline,
            scope=scope,
            now=services.clock.now,
            emit=self._tool_emitter(job.call_id),
        )
        tool_job = ToolJob(tool, job.arguments, ctx, self.actor_ref)
        work = _Work(tool_job, scope, job.attempt)
        self._work[job.call_id] = work
        if tool.executor is not None:
            work.remote = True
            work.handle = tool_job.submit_remote(services.executors.get(tool.executor))
        elif tool.is_async:
            work.handle = services.aloop.submit(tool_job.coroutine, tool_job.report)
        elif services.pool.is_saturated_by_abandoned():
            abandoned = services.pool.statistics()["workers_abandoned"]
            self.actor_ref.tell(
                ToolDone(
                    job.call_id,
                    job.attempt,
                    None,
                    AgentError.of(
                        ErrorCode.RESOURCE_EXHAUSTED,
                        f"too many abandoned tool threads ({abandoned}); refusing new calls",
                        abandoned=abandoned,
                        tool=job.tool,
                        call_id=job.call_id,
                    ),
                )
            )
        elif not services.pool.submit(tool_job):
            tool_job.report(None, RuntimeError("the runtime is shut down"))

    def start_child(self, job: ChildJob) -> None:
        """Start (or resume) the child run of a subagent call (R3: its own run id)."""
        self._children[job.call_id] = job.run_id
        self.services.host.start_child(self.cell, job)

    def cancel_work(self, key: str, reason: str) -> None:
        """Signal a call's (or the model call's) cancel scope; async work is cancelled too.

        A child run is cancelled through its own inbox, so it records CANCELLED in order.
        """
        child = self._children.get(key)
        if child is not None:
            self.services.host.cancel_child(child, reason)
            return
        work = self._work.get(key)
        if work is not None:
            work.scope.cancel(reason)
        elif key == MODEL_KEY and self._held_decide is not None:
            # Started, then cancelled at once, as an unheld call would be: the agent still
            # sees the messages its view delivers (each delivered message is seen once).
            args = self._held_decide[1]
            self._held_decide = None
            self._start_decide(*args)
            self._work[MODEL_KEY].scope.cancel(reason)
        elif self._held:
            self._release_held(
                key,
                AgentError.of(
                    ErrorCode.CANCELLED,
                    f"{key} was cancelled ({reason}) before it started",
                    call_id=key,
                    reason=reason,
                ),
            )

    def abandon_work(self, key: str) -> bool:
        """Stop waiting for work that did not stop; its worker is never reused (T3).

        Remote work (a process-isolated tool, a Ray task) is killed instead: True then, as
        nothing of the call runs on (docs/isolation.md). False: a thread was left running.
        """
        child = self._children.pop(key, None)
        if child is not None:
            self.services.host.cancel_child(child, "abandoned by its parent")
            return False
        work = self._work.pop(key, None)
        if work is None:
            if key == MODEL_KEY:
                self._held_decide = None
            self._release_held(key, None)
            return False
        if work.remote:
            work.scope.detach()
            # Killed before the scope is cancelled: the cooperative signal has had its chance.
            return work.handle is None or bool(work.handle.kill())
        work.scope.cancel("abandoned")
        work.scope.detach()
        if work.handle is not None:
            work.handle.cancel()
        else:
            self.services.pool.abandon(work.job)
        return False

    def schedule(self, kind: TimerKind, key: str, attempt: int, at: float) -> None:
        """Fire `TimerFired(kind, key, attempt)` into this actor's inbox at `at`."""
        old = self._timers.pop((kind, key), None)
        if old is not None:
            old.cancel()
        ref = self.actor_ref
        message = TimerFired(kind, key, attempt)

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):  # the run ended first
                ref.tell(message)

        self._timers[(kind, key)] = self.services.timer.schedule_at(at, fire)

    def unschedule(self, kind: TimerKind, key: str) -> None:
        """Cancel a pending timer."""
        handle = self._timers.pop((kind, key), None)
        if handle is not None:
            handle.cancel()
