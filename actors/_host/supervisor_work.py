"""The supervisor's work: model calls, tool calls, child runs and timers in flight.

The base of `RunSupervisor` (split from supervisor.py along its seam): the machine's
effects port for starting, holding (write-ahead: a call with side effects waits for its
checkpoint), cancelling and abandoning work, and for its timers (docs/pykka.md T2, T3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.inline import tell_now
from steerable.actors._engine.timer import TimerHandle
from steerable.actors._machine.effects import CallJob, ChildJob, TimerKind
from steerable.actors._machine.machine import MODEL_KEY, RunMachine
from steerable.actors._tools.context import tool_context
from steerable.actors._tools.tool import Tool
from steerable.protocol import AgentError, ErrorCode, EventKind, Phase, RunView, SideEffect

from .jobs import Accept, DecideJob, ToolDone, ToolJob
from .live import LiveEvent, ModelCallContext
from .messages import ALARM

# Read per call: on Python 3.11 `SideEffect.NONE` is a metaclass `__getattr__` dispatch
# (actors/_machine/members.py).
_NO_SIDE_EFFECT = SideEffect.NONE

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
    # The run's timers: (kind, key) -> (at, seq, attempt); the alarm rings at the earliest.
    _timers: dict[tuple[TimerKind, str], tuple[float, int, int]]
    _timer_seq: int
    _alarm: TimerHandle | None
    _alarm_at: float
    _wall: float
    # The events of the step being handled, appended together when it ends (None: no step).
    _step_events: list[tuple[EventKind, Phase | None, dict[str, Any]]] | None

    if TYPE_CHECKING:  # provided by pykka's Actor (no stub shadows it at run time)

        @property
        def actor_ref(self) -> pykka.ActorRef[Any]: ...

    def _flush_events(self) -> None:
        """Append the events this step has buffered so far.

        Called when the step ends, and before anything that another run, or the host, may
        see before the step ends: a child run starting or being cancelled, an event that
        fires hooks or settles approvals, a run's outcome. So the log's order is the order
        of emission, also across the runs of a tree.
        """
        pending = self._step_events
        if pending:
            cell = self.cell
            cell.events.append_step(cell.run_id, self._wall, cell.parent_run_id, pending)
            self._step_events = []

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
        view = _with_call(view, ModelCallContext(model_call, scope, self.actor_ref))
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
            if self.services.pool.closed:
                job.report(
                    self.services.clock.now(), None, RuntimeError("the runtime is shut down")
                )
            else:  # T1: no worker thread could be started, and none is left to take it
                job.start_failed(RuntimeError("can't start new thread"))

    def dispatch(self, job: CallJob) -> None:
        """Run one tool call attempt on a worker, or on the event loop for `async def` tools.

        Write-ahead (R4, R21): a call with side effects starts only once the checkpoint that
        holds its idempotency key is stored, so a crash can never leave a write whose key no
        checkpoint knows. Side-effect-free calls start at once.
        """
        tool = self.tools[job.tool]
        if tool.spec.side_effect is not _NO_SIDE_EFFECT and self._stored < self.cell.revision:
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
        scope = cell.scope.child(job.deadline)
        ctx = tool_context(
            cell.run_id,
            cell.trace_id,
            job.call_id,
            job.tool,
            job.idempotency_key,
            job.attempt,
            job.deadline,
            scope,
            services.clock.now,
            _ToolEmit(self.actor_ref, job.call_id),
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
            if services.pool.closed:
                tool_job.report(None, RuntimeError("the runtime is shut down"))
            else:  # T1: no worker thread could be started, and none is left to take it
                tool_job.start_failed(RuntimeError("can't start new thread"))

    def start_child(self, job: ChildJob) -> None:
        """Start (or resume) the child run of a subagent call (R3: its own run id)."""
        self._children[job.call_id] = job.run_id
        self._flush_events()  # the child's first events follow its subagent_started
        self.services.host.start_child(self.cell, job)

    def cancel_work(self, key: str, reason: str) -> None:
        """Signal a call's (or the model call's) cancel scope; async work is cancelled too.

        A child run is cancelled through its own inbox, so it records CANCELLED in order.
        """
        child = self._children.get(key)
        if child is not None:
            self._flush_events()
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
            self._flush_events()
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

    # Timers: one alarm per run on the runtime's timer heap, never one entry per timer. Most of
    # a run's timers (model and tool timeouts) are replaced or cancelled long before they are
    # due, and each later than the one before: scheduling one is a dict write and cancelling
    # a dict delete. The alarm moves only to an earlier deadline; when it rings, the timers
    # due by then fire (deadline order, ties in schedule order) and it is set to the next.

    def schedule(self, kind: TimerKind, key: str, attempt: int, at: float) -> None:
        """Fire timer `(kind, key, attempt)` at `at` (replaces a pending one of kind+key)."""
        seq = self._timer_seq
        self._timer_seq = seq + 1
        self._timers[(kind, key)] = (at, seq, attempt)
        if at < self._alarm_at:
            self._set_alarm(at)

    def unschedule(self, kind: TimerKind, key: str) -> None:
        """Cancel a pending timer (the alarm stays: ringing early only sets it again)."""
        self._timers.pop((kind, key), None)

    def _set_alarm(self, at: float) -> None:
        alarm = self._alarm
        if alarm is not None:
            alarm.cancel()
        self._alarm_at = at
        self._alarm = self.services.timer.schedule_at(at, _Ring(self.actor_ref))

    def _cancel_timers(self) -> None:
        """Drop every timer and the alarm (the run stops or is fenced out)."""
        self._timers.clear()
        alarm, self._alarm = self._alarm, None
        self._alarm_at = math.inf
        if alarm is not None:
            alarm.cancel()

    def _ring(self, now: float) -> None:
        """The alarm rang (or a stale ring arrived): fire what is due, set the next alarm."""
        alarm = self._alarm
        if alarm is not None and not alarm.pending:  # this ring was the current alarm's
            self._alarm = None
            self._alarm_at = math.inf
        timers = self._timers
        due = sorted(
            (at, seq, kind, key, attempt)
            for (kind, key), (at, seq, attempt) in timers.items()
            if at <= now
        )
        for _, seq, kind, key, attempt in due:
            entry = timers.get((kind, key))
            if entry is None or entry[1] != seq:
                continue  # cancelled or replaced by a timer that fired before it
            del timers[(kind, key)]
            self._timer_fired(kind, key, attempt, now)
        if timers:
            earliest = min(entry[0] for entry in timers.values())
            if earliest < self._alarm_at:
                self._set_alarm(earliest)

    def _timer_fired(self, kind: TimerKind, key: str, attempt: int, now: float) -> None:
        raise NotImplementedError  # RunSupervisor


_VIEW_FIELDS = tuple(f.name for f in dataclasses.fields(RunView) if f.name != "call")


def _with_call(view: RunView, call: ModelCallContext) -> RunView:
    """`dataclasses.replace(view, call=call)`, cheaper (once per model call).

    The machine builds a fresh view for each model call and keeps none (reasoning.py `ask`),
    so a view without a call gets this one in place; one that has a call already is copied
    field by field (a third of `replace`'s cost), the original left as it was.
    """
    if view.call is None:
        object.__setattr__(view, "call", call)
        return view
    new = object.__new__(RunView)
    for name in _VIEW_FIELDS:
        object.__setattr__(new, name, getattr(view, name))
    object.__setattr__(new, "call", call)
    return new


class _ToolEmit:
    """`ToolContext.emit` of one call: a `LiveEvent` told to its run (slotted: no closure)."""

    __slots__ = ("_call_id", "_ref")

    def __init__(self, ref: pykka.ActorRef[Any], call_id: str) -> None:
        self._ref = ref
        self._call_id = call_id

    def __call__(self, name: str, data: dict[str, Any], live: bool) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            event = LiveEvent(EventKind.CUSTOM, {**data, "live": live}, call_id=self._call_id)
            tell_now(self._ref, event)


class _Ring:
    """The timer callback of a run's alarm: tells the run `ALARM` (slotted: no closure)."""

    __slots__ = ("_ref",)

    def __init__(self, ref: pykka.ActorRef[Any]) -> None:
        self._ref = ref

    def __call__(self) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # the run ended first
            self._ref.tell(ALARM)
