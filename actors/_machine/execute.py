"""Plan execution: turning a decision into keyed calls, dispatching them within the parallel
limit, retries, timeouts, approvals and interrupts, and completing the plan in step order."""

from __future__ import annotations

from typing import Any

from pydantic import Secret, SecretBytes, SecretStr

from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    CallStatus,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Phase,
    Plan,
    RunState,
    SideEffect,
    SubagentCall,
    ToolCall,
    ToolResult,
    WaitingFor,
)
from steerable.protocol._ids import call_id as make_call_id
from steerable.protocol._ids import idempotency_key
from steerable.protocol.codec import redact

from .base import (
    MODEL_KEY,
    PLAN_KEY,
    Call,
    MachineBase,
    call_error,
    cancelled,
    jitter_unit,
)
from .children import ChildrenMixin
from .effects import CallJob, TimerKind
from .stage import Stage

__all__ = ["ExecutionMixin"]

_SECRETS = (SecretStr, SecretBytes, Secret)


class ExecutionMixin(ChildrenMixin, MachineBase):
    """The run machine's plan execution (see `RunMachine`)."""

    def pending_approvals(self) -> list[Call]:
        """Calls of the current plan waiting for a person."""
        return self._plan.pending_approvals()

    def _interrupt(self, now: float) -> None:
        if self._model_in_flight and not self._model_discarded:
            self._model_discarded = True
            self.fx.cancel_work(MODEL_KEY, "interrupt")
            self.fx.schedule(
                TimerKind.GRACE, MODEL_KEY, self.model_calls, now + self.config.cancel_grace
            )
        elif self._stage is Stage.EXECUTING and not self._plan.interrupting:
            self._plan.interrupt()
            for call in self.plan:
                unstarted = call.status in (CallStatus.PENDING, CallStatus.AWAITING_APPROVAL)
                if unstarted or call.retry_pending:
                    self._complete(call, None, cancelled("interrupt", call), now, advance=False)
                elif call.status is CallStatus.RUNNING:
                    call.cancel_reason = "interrupt"
                    self.fx.cancel_work(call.call_id, "interrupt")
            if self._plan.running:
                self.fx.schedule(TimerKind.GRACE, PLAN_KEY, 0, now + self.config.cancel_grace)
            if self.state is RunState.WAITING and not self.pending_approvals():
                # The approvals it waited for were cancelled with the plan.
                self.waiting_for = None
                self._set_state(RunState.RUNNING)
            self._after_call(now)

    def _on_approval(self, msg: ApprovalDecision, now: float) -> None:
        call = self._find(msg.call_id)
        if call is None or call.status is not CallStatus.AWAITING_APPROVAL:
            return
        self.fx.emit(
            EventKind.APPROVAL_SETTLED,
            Phase.EXECUTE,
            {"call_id": call.call_id, "approved": msg.approved, "reason": msg.reason},
        )
        if msg.approved:
            call.status = CallStatus.PENDING
            call.needs_approval = False
        else:
            error = AgentError.of(
                ErrorCode.APPROVAL_DENIED,
                f"a person denied {call.name}: {msg.reason or 'no reason'}",
                call_id=call.call_id,
                tool=call.name,
                reason=msg.reason,
            )
            self._complete(call, None, error, now, advance=False)
        if not self.pending_approvals() and self.state is RunState.WAITING:
            self.waiting_for = None
            self._set_state(RunState.RUNNING)
        self._after_call(now)

    def _on_plan(self, plan: Plan, now: float) -> None:
        if not plan.steps:
            self._terminate(
                RunState.ERROR,
                AgentError.of(
                    ErrorCode.INVALID_DECISION,
                    "the agent returned an empty plan: no progress possible (R11)",
                ),
            )
            return
        self.fx.emit(EventKind.PLANNING_STARTED, Phase.PLAN, {"steps": len(plan.steps)})
        calls: list[Call] = []
        executable = 0
        children = 0
        for index, step in enumerate(plan.steps):
            cid = make_call_id(self.decisions, index)
            key = idempotency_key(self.run_id, cid)
            if isinstance(step, SubagentCall):
                call = self._plan_subagent(index, cid, key, step, children)
                children += call.status is CallStatus.PENDING
            else:
                call, ok = self._plan_call(index, cid, key, step)
                executable += ok
            calls.append(call)
        steps_left = self.config.max_steps - self.steps
        if executable > steps_left:
            # No half-run plans (docs/contract.md "Budgets at the edge").
            self._exhaust(
                "max_steps", self.config.max_steps, planned=executable, steps_left=steps_left
            )
            return
        self._redact_decision(plan, calls)
        short = self._reserve(calls, executable)
        if short is not None:
            # Children cannot get a share of a budget that is used up: no half-run plans.
            self._exhaust(short, getattr(self.config, short), planned_children=children)
            return
        self._plan.begin(calls, now)
        approvals = [c for c in calls if c.status is CallStatus.AWAITING_APPROVAL]
        self.fx.emit(
            EventKind.PLANNING_FINISHED,
            Phase.PLAN,
            {"calls": [c.call_id for c in calls], "approvals": len(approvals)},
        )
        self._checkpoint()
        self._enter(Stage.EXECUTING)
        self.fx.emit(EventKind.EXECUTE_STARTED, Phase.EXECUTE, {"calls": len(calls)})
        for call in approvals:
            self.fx.emit(
                EventKind.APPROVAL_REQUESTED,
                Phase.EXECUTE,
                {"call_id": call.call_id, "tool": call.name, "arguments": call.arguments},
            )
        if approvals:
            self.waiting_for = WaitingFor.APPROVAL
            self._set_state(RunState.WAITING, approvals=len(approvals))
        self._after_call(now)

    def _redact_decision(self, plan: Plan, calls: list[Call]) -> None:
        """R26: an argument the tool declares secret never reaches the transcript in clear.

        The agent may pass a credential as a plain string to a `SecretStr` parameter; the
        validated call holds the secret, and the recorded decision gets its reference.
        """
        secret = [any(isinstance(v, _SECRETS) for v in c.arguments.values()) for c in calls]
        if not any(secret):
            return
        steps: list[ToolCall | SubagentCall] = []
        for step, call, has_secret in zip(plan.steps, calls, secret, strict=True):
            if has_secret and isinstance(step, ToolCall):
                arguments = {
                    k: redact(call.arguments[k])
                    if isinstance(call.arguments.get(k), _SECRETS)
                    else v
                    for k, v in step.arguments.items()
                }
                steps.append(ToolCall(name=step.name, arguments=arguments))
            else:
                steps.append(step)
        entry = self.transcript[-1]
        assert isinstance(entry, DecisionEntry)
        self.transcript[-1] = DecisionEntry(
            model_call=entry.model_call, decision=plan.model_copy(update={"steps": tuple(steps)})
        )

    def _plan_call(self, index: int, cid: str, key: str, step: ToolCall) -> tuple[Call, bool]:
        """Turn one plan step into a call; unknown tools and bad arguments resolve at once."""
        tool = self.tools.get(step.name)
        if tool is None:
            call = Call(index, cid, "tool", step.name, dict(step.arguments), key, None)
            self._resolve_now(
                call,
                AgentError.of(
                    ErrorCode.UNKNOWN_TOOL,
                    f"no tool named {step.name!r}",
                    tool=step.name,
                    call_id=cid,
                    available=sorted(self.tools),
                ),
            )
            return call, False
        try:
            arguments = tool.validate(step.arguments)
        except Exception as exc:  # noqa: BLE001 - any validator failure is the agent's bad input
            error = getattr(exc, "error", None)
            if not isinstance(error, AgentError):
                error = AgentError.of(ErrorCode.INVALID_ARGUMENTS, str(exc), tool=step.name)
            call = Call(index, cid, "tool", step.name, dict(step.arguments), key, tool.spec)
            self._resolve_now(call, error)
            return call, False
        call = Call(index, cid, "tool", step.name, arguments, key, tool.spec)
        if call.needs_approval:
            call.status = CallStatus.AWAITING_APPROVAL
        return call, True

    def _resolve_now(self, call: Call, error: AgentError) -> None:
        call.status = CallStatus.DONE
        call.result = result = ToolResult(
            call_id=call.call_id, tool=call.name, ok=False, error=error, attempts=0
        )
        self._meter.count("tool_errors")
        self._record_result(result, Phase.PLAN)
        self.fx.journal(result)

    def _after_call(self, now: float) -> None:
        """Dispatch what the parallel limit allows; complete the plan when every call is done."""
        if self._holding:
            return  # a resume is still applying stored messages; it moves on after them
        if self._stage is Stage.CANCELLING:
            self._maybe_finish_cancel(now)
            return
        if self._stage is not Stage.EXECUTING:
            return
        limit = self.config.max_parallel_tools
        plan = self._plan
        if not plan.interrupting and self._cancel_reason is None:
            running = plan.running
            for call in plan.calls:
                if running >= limit:
                    break
                if call.status is CallStatus.PENDING and call.kind == "subagent":
                    call.status = CallStatus.RUNNING
                    running += 1
                    call.first_dispatch = now
                    self._start_child(call, now)
                elif call.status is CallStatus.PENDING:
                    call.status = CallStatus.RUNNING
                    running += 1
                    if not call.counted:  # a re-dispatch after a crash is the same step
                        call.counted = True
                        self._meter.step()  # R27: a validated, approved execution is one tool step
                    call.first_dispatch = now
                    self._dispatch_attempt(call, now)
        if plan.running:
            return
        if plan.all_done():
            self._plan_complete(now)
        elif self.state is RunState.WAITING and self._parked_revision != self.revision:
            # Only approvals are left: a safe boundary where the run waits for a person.
            self._checkpoint()
            self._parked_revision = self.revision

    def _dispatch_attempt(self, call: Call, now: float) -> None:
        call.attempt += 1
        call.retry_pending = False
        spec = call.spec
        timeout = (
            spec.timeout
            if spec is not None and spec.timeout is not None
            else self.config.step_timeout
        )
        deadline = now + timeout
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)  # R14: never past the run's remaining time
        self.fx.schedule(TimerKind.TOOL_TIMEOUT, call.call_id, call.attempt, deadline)
        if call.attempt == 1:
            self.fx.emit(
                EventKind.TOOL_STARTED, Phase.EXECUTE, {"call_id": call.call_id, "tool": call.name}
            )
        self.fx.dispatch(
            CallJob(call.call_id, call.name, call.arguments, call.key, call.attempt, deadline)
        )

    def _should_retry(self, call: Call, error: AgentError, now: float) -> bool:
        """R16: retry retryable failures of none/idempotent tools, with backoff, in time."""
        spec = call.spec
        if not error.retryable or spec is None or spec.side_effect is SideEffect.WRITE:
            return False
        if self._plan.interrupting or self._cancel_reason is not None or call.cancel_reason:
            return False
        retry = call.attempt  # the retry about to happen is number `attempt`
        policy = self.config.retry
        if retry > policy.max_retries:
            return False
        at = now + policy.delay(retry, jitter_unit(call.key, retry))
        if self.deadline is not None and at >= self.deadline:
            return False
        self._meter.count("retries")
        self._record(
            call_error(call.call_id, call.name, error, retried=True, attempt=call.attempt),
            Phase.EXECUTE,
            call_id=call.call_id,
            retried=True,
        )
        self.fx.emit(
            EventKind.TOOL_RETRY,
            Phase.EXECUTE,
            {
                "call_id": call.call_id,
                "tool": call.name,
                "attempt": call.attempt + 1,
                "delay": at - now,
                "error": error.code.value,
            },
        )
        self.fx.schedule(TimerKind.TOOL_RETRY, call.call_id, call.attempt + 1, at)
        call.retry_pending = True
        return True

    def _complete(
        self, call: Call, value: Any, error: AgentError | None, now: float, *, advance: bool = True
    ) -> None:
        if call.kind == "subagent":
            assert error is not None  # a child's own outcome arrives through child_done
            self._child_cancelled(call, error, now, advance=advance)
            return
        previous = call.status
        call.status = CallStatus.DONE
        call.retry_pending = False
        if previous is CallStatus.RUNNING:
            self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call.call_id)
            self.fx.unschedule(TimerKind.TOOL_RETRY, call.call_id)
        elif (
            previous is CallStatus.AWAITING_APPROVAL
            and error is not None
            and error.code is not ErrorCode.APPROVAL_DENIED
        ):
            self.fx.emit(
                EventKind.APPROVAL_SETTLED,
                Phase.EXECUTE,
                {"call_id": call.call_id, "approved": False, "reason": error.message},
            )
        duration = now - call.first_dispatch if call.first_dispatch else 0.0
        result = ToolResult(
            call_id=call.call_id,
            tool=call.name,
            ok=error is None,
            value=value if error is None else None,
            error=error,
            attempts=call.attempt,
            duration=duration,
        )
        call.result = result
        if error is not None:
            self._meter.count("tool_errors")
            self._record_result(result, Phase.EXECUTE)
        self.fx.journal(result)
        self.fx.emit(
            EventKind.TOOL_FINISHED,
            Phase.EXECUTE,
            {
                "call_id": call.call_id,
                "tool": call.name,
                "ok": error is None,
                "error": None if error is None else error.code.value,
                "attempts": call.attempt,
            },
        )
        if advance:
            self._after_call(now)

    def _on_tool_timeout(self, call_id: str, attempt: int, now: float) -> None:
        call = self._find(call_id)
        if (
            call is None
            or call.status is not CallStatus.RUNNING
            or call.attempt != attempt
            or call.retry_pending
        ):
            return
        # R15: control returns at once; the thread may never return, so it is abandoned.
        self.fx.cancel_work(call_id, "timeout")
        self.fx.abandon_work(call_id)
        spec = call.spec
        write = spec is not None and spec.side_effect is SideEffect.WRITE
        if write:
            error = AgentError.of(
                ErrorCode.SIDE_EFFECT_UNKNOWN,
                f"{call.name} timed out; its side effect may or may not have happened",
                tool=call.name,
                call_id=call_id,
                side_effect="unknown",
                idempotency_key=call.key,
            )
        else:
            error = AgentError.of(
                ErrorCode.TIMEOUT,
                f"{call.name} timed out",
                retryable=True,
                tool=call.name,
                call_id=call_id,
            )
        if not write and self._should_retry(call, error, now):
            return
        self._complete(call, None, error, now)

    def _plan_complete(self, now: float) -> None:
        self.fx.unschedule(TimerKind.GRACE, PLAN_KEY)
        for call in self.plan:
            if call.result is not None:
                self.transcript.append(call.result)
        self._add_phase(Phase.EXECUTE, now - self._plan.exec_started)
        self.fx.emit(
            EventKind.EXECUTE_FINISHED,
            Phase.EXECUTE,
            {"calls": len(self.plan), "interrupted": self._plan.interrupting},
        )
        self._plan.clear()
        self._enter(Stage.IDLE)
        if self.state is RunState.WAITING:
            self.waiting_for = None
            self._set_state(RunState.RUNNING)
        self._boundary(now)

    def _find(self, call_id: str) -> Call | None:
        return self._plan.find(call_id)
