"""Plan execution: a decision's keyed calls dispatched within the parallel limit, retries,
timeouts, approvals, interrupts and stops, and the plan completed in step order.

`Execution` is the run machine's policy for plans. It owns the `PlanState` (the one writer of
the calls) and acts through the effects port; what concerns the run as a whole (checkpoints,
stages, states, the next boundary, the end) it asks of the machine through the narrow
interface `RunMachine` gives it (docs/architecture.md, "The run machine").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    CallStatus,
    ErrorCode,
    EventKind,
    Plan,
    RunOutcome,
    SideEffect,
    SubagentResult,
    ToolResult,
    WaitingFor,
)
from steerable.protocol._built import built_decision_entry, built_tool_result

from . import events
from .base import (
    PLAN_KEY,
    Call,
    call_error,
    cancelled,
    jitter_unit,
    lost_on_resume,
    stopped_by_run_deadline,
    timed_out,
)
from .children import cancelled_child, child_job, child_result, reserve
from .effects import TimerKind, call_job
from .members import (
    KIND_EXECUTE_FINISHED,
    KIND_EXECUTE_STARTED,
    KIND_PLANNING_FINISHED,
    KIND_PLANNING_STARTED,
    KIND_TOOL_FINISHED,
    KIND_TOOL_STARTED,
    PHASE_EXECUTE,
    PHASE_PLAN,
    STAGE_CANCELLING,
    STAGE_DONE,
    STAGE_EXECUTING,
    STAGE_IDLE,
    STATE_WAITING,
    STATUS_RUNNING,
    TIMER_TOOL_RETRY,
    TIMER_TOOL_TIMEOUT,
)
from .parts import EXECUTE, Meter
from .plan import PlanState
from .planning import child_run_id, plan_calls, recorded_plan

if TYPE_CHECKING:
    from .machine import RunMachine

__all__ = ["Execution"]


class Execution:
    """The plans of one run (see the module docstring).

    Args:
        machine: The run machine this executes for.
        meter: The run's meter (shared: it is the one writer of its counters).
    """

    __slots__ = (
        "_config",
        "_exec_started",
        "_fx",
        "_machine",
        "_max_parallel",
        "_meter",
        "_plan",
        "_step_timeout",
    )

    def __init__(self, machine: RunMachine, meter: Meter) -> None:
        self._machine = machine
        self._fx = machine.fx
        self._config = config = machine.config
        # Read at every step: plain attributes, not pydantic field reads (RunConfig is frozen).
        self._max_parallel = config.max_parallel_tools
        self._step_timeout = config.step_timeout
        self._meter = meter
        self._plan = PlanState()
        self._exec_started = 0.0

    @property
    def calls(self) -> list[Call]:
        """The calls of the current plan (empty between plans)."""
        return self._plan.calls

    @property
    def running(self) -> int:
        """How many calls are running."""
        return self._plan.running

    def pending_approvals(self) -> list[Call]:
        """Calls waiting for a person."""
        return self._plan.pending_approvals()

    def work_in_flight(self) -> list[str]:
        """Work keys of the calls running on a worker."""
        return self._plan.work_in_flight()

    # ------------------------------------------------------------------ results arriving

    def tool_done(
        self, call_id: str, attempt: int, value: Any, error: AgentError | None, now: float
    ) -> None:
        """A worker finished attempt `attempt` of call `call_id` (value, or error)."""
        call = self._plan.find(call_id)
        if (
            self._machine.stage is STAGE_DONE
            or call is None
            or call.status is not STATUS_RUNNING
            or call.attempt != attempt
            or call.retry_pending  # this attempt already ended (timed out or failed)
        ):
            self._meter.count("late_results_dropped")
            return
        self._fx.unschedule(TIMER_TOOL_TIMEOUT, call_id)
        reason = call.cancel_reason or self._machine.cancel_reason
        if error is None and reason is not None:
            # It saw the interrupt or cancel and returned: still cancelled (docs/steering.md).
            error = cancelled(reason, call, value=value)
            value = None
        if error is not None and self._should_retry(call, error, now):
            return
        # Its timeout timer went above, and no retry timer is pending for an attempt that ran.
        self.complete(call, value, error, now, timers_done=True)

    def child_done(self, call_id: str, outcome: RunOutcome, now: float) -> None:
        """A child run reached its terminal state: its result enters the parent (R7)."""
        call = self._plan.find(call_id)
        if (
            self._machine.stage is STAGE_DONE
            or call is None
            or call.kind != "subagent"
            or call.status is not STATUS_RUNNING
        ):
            self._meter.count("late_results_dropped")
            return
        # Subagent usage counts toward the parent's budgets (docs/contract.md, "Budgets at
        # the edge").
        self._meter.charge(outcome.metrics)
        self._record_child(call, child_result(call, outcome), now)

    def retry_due(self, call_id: str, attempt: int, now: float) -> None:
        """A retry timer fired: the call's next attempt starts."""
        call = self._plan.find(call_id)
        if call is not None and call.retry_pending and call.attempt == attempt - 1:
            self.dispatch_attempt(call, now)

    # ------------------------------------------------------------------ the plan's course

    def plan(self, model_call: int, plan: Plan, now: float) -> None:
        m = self._machine
        self._fx.emit(KIND_PLANNING_STARTED, PHASE_PLAN, {"steps": len(plan.steps)})
        cfg = self._config
        meter = self._meter
        planned = plan_calls(
            plan,
            run_id=m.run_id,
            decisions=meter.decisions,
            taken=self._plan.taken(m.transcript, plan),
            tools=m.tools,
            subagents=m.subagents,
            depth=m.depth,
            config=cfg,
            children_started=meter.children_started,
        )
        calls = planned.calls
        for call in calls:
            result = call.result
            if result is not None:  # resolved at once: an unknown tool, bad arguments ...
                if isinstance(result, ToolResult):
                    meter.count("tool_errors")
                m.record_result(result, PHASE_PLAN)
                self._fx.journal(result)
        # Built without a validation pass (protocol/_built.py): the plan is the agent's
        # validated decision as `recorded_plan` rebuilt it.
        m.add_entry(built_decision_entry(model_call, recorded_plan(plan, planned)))
        steps_left = cfg.max_steps - meter.steps
        if planned.executable > steps_left:
            # No half-run plans (docs/contract.md "Budgets at the edge").
            m.exhaust("max_steps", cfg.max_steps, planned=planned.executable, steps_left=steps_left)
            return
        short = (
            reserve(
                calls,
                planned.executable,
                cfg,
                steps=meter.steps,
                model_calls=meter.model_calls,
                usage=meter.usage,
            )
            if planned.children
            else None  # no child starts: nothing to reserve
        )
        if short is not None:
            # Children cannot get a share of a budget that is used up: no half-run plans.
            m.exhaust(short, getattr(cfg, short), planned_children=planned.children)
            return
        self._plan.install(calls)
        approvals = self._plan.pending_approvals()
        self._fx.emit(
            KIND_PLANNING_FINISHED,
            PHASE_PLAN,
            {"calls": [c.call_id for c in calls], "approvals": len(approvals)},
        )
        m.checkpoint()
        m.enter(STAGE_EXECUTING)
        self._exec_started = now
        self._fx.emit(KIND_EXECUTE_STARTED, PHASE_EXECUTE, {"calls": len(calls)})
        for call in approvals:
            self._fx.emit(
                EventKind.APPROVAL_REQUESTED, PHASE_EXECUTE, events.approval_requested(call)
            )
        if approvals:
            m.wait(WaitingFor.APPROVAL, approvals=len(approvals))
        self.after_call(now)

    def interrupt(self, now: float) -> None:
        """An interrupting message: the plan's calls stop (R19); the plan completes."""
        m = self._machine
        plan = self._plan
        if m.stage is not STAGE_EXECUTING or plan.interrupting:
            return
        plan.interrupt()
        for call in plan.calls:
            unstarted = call.status in (CallStatus.PENDING, CallStatus.AWAITING_APPROVAL)
            if unstarted or call.retry_pending:
                self.complete(call, None, cancelled("interrupt", call), now, advance=False)
            elif call.status is STATUS_RUNNING:
                plan.stop(call, "interrupt")
                self._fx.cancel_work(call.call_id, "interrupt")
        if plan.running:
            self._fx.schedule(TimerKind.GRACE, PLAN_KEY, 0, now + self._config.cancel_grace)
        if m.state is STATE_WAITING and not plan.pending_approvals():
            m.stop_waiting()  # the approvals it waited for were cancelled with the plan
        self.after_call(now)

    def approval(self, msg: ApprovalDecision, now: float) -> None:
        m = self._machine
        call = self._plan.find(msg.call_id)
        if call is None or call.status is not CallStatus.AWAITING_APPROVAL:
            return
        self._fx.emit(
            EventKind.APPROVAL_SETTLED,
            PHASE_EXECUTE,
            {"call_id": call.call_id, "approved": msg.approved, "reason": msg.reason},
        )
        if msg.approved:
            self._plan.approve(call)
        else:
            error = AgentError.of(
                ErrorCode.APPROVAL_DENIED,
                f"a person denied {call.name}: {msg.reason or 'no reason'}",
                call_id=call.call_id,
                tool=call.name,
                reason=msg.reason,
            )
            self.complete(call, None, error, now, advance=False)
        if not self._plan.pending_approvals() and m.state is STATE_WAITING:
            m.stop_waiting()
        self.after_call(now)

    def after_call(self, now: float) -> None:
        """Dispatch what the parallel limit allows; complete the plan when every call is done."""
        m = self._machine
        if m.holding:
            return  # a resume is still applying stored messages; it moves on after them
        if m.stage is STAGE_CANCELLING:
            m.maybe_finish_cancel(now)
            return
        if m.stage is not STAGE_EXECUTING:
            return
        plan = self._plan
        if not plan.interrupting and m.cancel_reason is None:
            limit = self._max_parallel
            while plan.pending and plan.running < limit:
                call = plan.next_pending()
                if call is None:
                    break
                first = plan.start(call, now)
                if call.kind == "subagent":
                    if first:  # a child re-dispatched after a crash is the same child
                        self._meter.child_started()
                    self._start_child(call, now)
                else:
                    if first:  # R27: a validated, approved execution is one tool step
                        self._meter.step()
                    self.dispatch_attempt(call, now)
        if plan.running:
            return
        if plan.all_done:
            self._plan_complete(now)
        elif m.state is STATE_WAITING:
            # Only approvals are left: a safe boundary where the run waits for a person.
            m.park()

    def dispatch_attempt(self, call: Call, now: float) -> None:
        m = self._machine
        attempt = self._plan.next_attempt(call)
        spec = call.spec
        timeout = (
            spec.timeout if spec is not None and spec.timeout is not None else self._step_timeout
        )
        deadline = now + timeout
        if m.deadline is not None:
            deadline = min(deadline, m.deadline)  # R14: never past the run's remaining time
        self._fx.schedule(TIMER_TOOL_TIMEOUT, call.call_id, attempt, deadline)
        if attempt == 1:
            self._fx.emit(KIND_TOOL_STARTED, PHASE_EXECUTE, events.tool_started(call))
        self._fx.dispatch(
            call_job(call.call_id, call.name, call.arguments, call.key, attempt, deadline)
        )

    def _start_child(self, call: Call, now: float) -> None:
        m = self._machine
        child = child_run_id(m.run_id, call.call_id)
        self._plan.name_child(call, child)
        self._fx.emit(
            EventKind.SUBAGENT_STARTED, PHASE_EXECUTE, events.subagent_started(call, child)
        )
        self._fx.start_child(child_job(call, m.run_id, m.depth, m.deadline, now))

    def _should_retry(self, call: Call, error: AgentError, now: float) -> bool:
        """R16: retry retryable failures of none/idempotent tools, with backoff, in time."""
        m = self._machine
        spec = call.spec
        if not error.retryable or spec is None or spec.side_effect is SideEffect.WRITE:
            return False
        if self._plan.interrupting or m.cancel_reason is not None or call.cancel_reason:
            return False
        retry = call.attempt  # the retry about to happen is number `attempt`
        policy = self._config.retry
        if retry > policy.max_retries:
            return False
        at = now + policy.delay(retry, jitter_unit(call.key, retry))
        if m.deadline is not None and at >= m.deadline:
            return False
        self._meter.count("retries")
        m.record(
            call_error(call.call_id, call.name, error, retried=True, attempt=call.attempt),
            PHASE_EXECUTE,
            call_id=call.call_id,
            retried=True,
        )
        self._fx.emit(EventKind.TOOL_RETRY, PHASE_EXECUTE, events.tool_retry(call, at - now, error))
        self._fx.schedule(TIMER_TOOL_RETRY, call.call_id, call.attempt + 1, at)
        self._plan.wait_for_retry(call)
        return True

    def complete(
        self,
        call: Call,
        value: Any,
        error: AgentError | None,
        now: float,
        *,
        advance: bool = True,
        timers_done: bool = False,
    ) -> None:
        """The call ends with `value` or `error`; `timers_done`: the caller already dropped its
        timers (a RUNNING call's); `advance`: dispatch what may start next, or end the plan."""
        m = self._machine
        if call.kind == "subagent":
            assert error is not None  # a child's own outcome arrives through child_done
            self._record_child(call, cancelled_child(call, m.run_id, error), now, advance=advance)
            return
        first = call.first_dispatch
        # Built without a validation pass (protocol/_built.py): the tool's value is frozen as
        # the field's validator would; the other fields are the machine's own values.
        result = built_tool_result(
            call.call_id,
            call.name,
            error is None,
            value if error is None else None,
            error,
            call.attempt,
            now - first if first else 0.0,
        )
        previous = self._plan.finish(call, result)
        if previous is STATUS_RUNNING:
            if not timers_done:
                self._fx.unschedule(TIMER_TOOL_TIMEOUT, call.call_id)
                self._fx.unschedule(TIMER_TOOL_RETRY, call.call_id)
        elif (
            previous is CallStatus.AWAITING_APPROVAL
            and error is not None
            and error.code is not ErrorCode.APPROVAL_DENIED
        ):
            self._fx.emit(
                EventKind.APPROVAL_SETTLED,
                PHASE_EXECUTE,
                {"call_id": call.call_id, "approved": False, "reason": error.message},
            )
        if error is not None:
            self._meter.count("tool_errors")
            m.record_result(result, PHASE_EXECUTE)
        self._fx.journal(result)
        self._fx.emit(KIND_TOOL_FINISHED, PHASE_EXECUTE, events.tool_finished(call, result))
        if advance:
            self.after_call(now)

    def _record_child(
        self, call: Call, result: SubagentResult, now: float, *, advance: bool = True
    ) -> None:
        m = self._machine
        self._plan.finish(call, result)
        m.record_result(result, PHASE_EXECUTE)
        self._fx.journal(result)
        self._fx.emit(
            EventKind.SUBAGENT_FINISHED, PHASE_EXECUTE, events.subagent_finished(call, result)
        )
        if advance:
            self.after_call(now)

    def tool_timeout(self, call_id: str, attempt: int, now: float) -> None:
        call = self._plan.find(call_id)
        if (
            call is None
            or call.status is not STATUS_RUNNING
            or call.attempt != attempt
            or call.retry_pending
        ):
            return
        # R15: control returns at once; the thread may never return, so it is abandoned (a
        # process-isolated call is killed instead).
        self._fx.cancel_work(call_id, "timeout")
        error = timed_out(call, killed=bool(self._fx.abandon_work(call_id)))
        if error.code is ErrorCode.TIMEOUT and self._should_retry(call, error, now):
            return
        self.complete(call, None, error, now)

    def _plan_complete(self, now: float) -> None:
        m = self._machine
        plan = self._plan
        if plan.interrupting:  # only an interrupt sets the plan's grace timer
            self._fx.unschedule(TimerKind.GRACE, PLAN_KEY)
        for call in plan.calls:
            if call.result is not None:
                m.add_entry(call.result)
        self._meter.add_phase(EXECUTE, now - self._exec_started)
        self._fx.emit(
            KIND_EXECUTE_FINISHED,
            PHASE_EXECUTE,
            {"calls": len(plan.calls), "interrupted": plan.interrupting},
        )
        plan.clear()
        m.enter(STAGE_IDLE)
        if m.state is STATE_WAITING:
            m.stop_waiting()
        m.boundary(now)

    # ------------------------------------------------------------------ stopping

    def cancel(self, reason: str, now: float) -> None:
        """The run is cancelled: calls waiting for a retry end; running calls are signalled."""
        for call in self._plan.calls:
            if call.retry_pending:
                self.complete(call, None, cancelled(reason, call), now, advance=False)
            elif call.status is STATUS_RUNNING:
                self._fx.cancel_work(call.call_id, reason)

    def interrupt_grace(self, now: float) -> None:
        """The interrupt's grace period ended: calls still running are abandoned (or killed)."""
        if not self._plan.interrupting or self._machine.stage is not STAGE_EXECUTING:
            return
        for call in self._plan.running_calls():
            self._fx.unschedule(TIMER_TOOL_TIMEOUT, call.call_id)
            was_killed = bool(self._fx.abandon_work(call.call_id))
            error = cancelled("interrupt", call, abandoned=True, killed=was_killed)
            self.complete(call, None, error, now, advance=False)
        self.after_call(now)

    def cancel_all(
        self, reason: str, abandoned: list[str], killed: list[str] | None, now: float
    ) -> None:
        """The cancel is final: every call without a result ends `cancelled`."""
        for call in self._plan.unfinished():
            error = cancelled(
                reason,
                call,
                abandoned=call.call_id in abandoned,
                killed=killed is not None and call.call_id in killed,
            )
            self.complete(call, None, error, now, advance=False)

    def stop_by_deadline(self, now: float, killed: set[str] | frozenset[str]) -> None:
        """The run's deadline passed: every call without a result is stopped by it.

        Their results are journaled before the terminal checkpoint: a resume that finds one
        (`stopped_by_deadline`) ends the run there too, as the crashed process did.
        """
        for call in self._plan.unfinished():
            error = stopped_by_run_deadline(call, killed=call.call_id in killed)
            self.complete(call, None, error, now, advance=False)

    def unschedule_running(self) -> None:
        """The run ends: the timers of running calls go."""
        for call in self._plan.running_calls():
            self._fx.unschedule(TIMER_TOOL_TIMEOUT, call.call_id)
            self._fx.unschedule(TIMER_TOOL_RETRY, call.call_id)

    # ------------------------------------------------------------------ restore

    def install(self, calls: list[Call]) -> None:
        """A restored (or forked) plan becomes the current plan, without acting."""
        self._plan.install(calls)

    def requeue_running(self) -> None:
        """After a restart, a running call runs in no process: it is pending again."""
        for call in self._plan.running_calls():
            self._plan.requeue(call)

    def resume(self, now: float, *, announce: bool) -> None:
        """Re-enter a restored plan: decide what happens to each call without a result."""
        self._machine.enter(STAGE_EXECUTING)
        self._exec_started = now
        for call in self._plan.calls:
            self._settle_restored(call, now, announce=announce)

    def _settle_restored(self, call: Call, now: float, *, announce: bool) -> None:
        if call.status is CallStatus.AWAITING_APPROVAL:
            if announce:
                self._fx.emit(
                    EventKind.APPROVAL_REQUESTED, PHASE_EXECUTE, events.approval_requested(call)
                )
            return
        resumed = self._machine.revision >= 0  # a fork (no revision yet) starts afresh
        spec = call.spec
        if (
            call.kind == "tool"
            and call.status is CallStatus.PENDING
            and resumed
            and announce
            and spec is not None
            and not spec.redispatch_safe
        ):
            # Its checkpoint was stored, so it may have started before the process stopped:
            # the runtime cannot tell, and never guesses (R15).
            self._plan.assume_running(call)
        if call.status is not STATUS_RUNNING:
            return
        if call.kind == "subagent" or (spec is not None and spec.redispatch_safe):
            # The same child id (resumed, not started twice), or re-dispatched with the same
            # key as the same step.
            self._plan.requeue(call)
            return
        self.complete(call, None, lost_on_resume(call), now, advance=False)
