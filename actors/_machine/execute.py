"""Plan execution: turning a decision into keyed calls, dispatching them within the parallel
limit, retries, timeouts, approvals and interrupts, and completing the plan in step order."""

from __future__ import annotations

from typing import Any

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
    SubagentResult,
    ToolCall,
    ToolResult,
    WaitingFor,
)
from steerable.protocol._frozen import FrozenDict
from steerable.protocol._ids import call_id as make_call_id
from steerable.protocol._ids import idempotency_key

from .base import (
    MODEL_KEY,
    PLAN_KEY,
    RUN_KEY,
    Call,
    MachineBase,
    Stage,
    call_error,
    cancelled,
    jitter_unit,
)
from .children import ChildrenMixin
from .effects import CallJob, TimerKind
from .preview import preview
from .recording import checked_arguments, recorded_arguments

__all__ = ["ExecutionMixin"]

_RESERVED_KEYS = frozenset({MODEL_KEY, RUN_KEY, PLAN_KEY, "hooks"})
"""Work and timer keys of the run itself: never a call id."""


class ExecutionMixin(ChildrenMixin, MachineBase):
    """The run machine's plan execution (see `RunMachine`).

    A plan's cost is linear in its steps (docs/reliability.md, "Hostile values"): calls are
    found by id through an index, and dispatching resumes from a cursor before which no call
    is pending, instead of scanning the whole plan on every result.
    """

    # Built for (and kept with) one plan list; replaced when the plan is.
    _plan_index: tuple[list[Call], dict[str, Call]] | None = None
    _scan: tuple[list[Call], int] | None = None

    def pending_approvals(self) -> list[Call]:
        """Calls of the current plan waiting for a person."""
        return [c for c in self.plan if c.status is CallStatus.AWAITING_APPROVAL]

    def _interrupt(self, now: float) -> None:
        if self._model_in_flight and not self._model_discarded:
            self._model_discarded = True
            self.fx.cancel_work(MODEL_KEY, "interrupt")
            self.fx.schedule(
                TimerKind.GRACE, MODEL_KEY, self.model_calls, now + self.config.cancel_grace
            )
        elif self._stage is Stage.EXECUTING and not self._interrupting:
            self._interrupting = True
            for call in self.plan:
                unstarted = call.status in (CallStatus.PENDING, CallStatus.AWAITING_APPROVAL)
                if unstarted or call.retry_pending:
                    self._complete(call, None, cancelled("interrupt", call), now, advance=False)
                elif call.status is CallStatus.RUNNING:
                    call.cancel_reason = "interrupt"
                    self.fx.cancel_work(call.call_id, "interrupt")
            if self._running:
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
            self._scan = None  # a call before the dispatch cursor is pending again
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
        recorded: list[dict[str, Any] | None] = []
        executable = 0
        children = 0
        taken = self._taken_call_ids(plan)
        for index, step in enumerate(plan.steps):
            cid = self._call_id(step.id, index, taken)
            key = idempotency_key(self.run_id, cid)
            if isinstance(step, SubagentCall):
                call = self._plan_subagent(index, cid, key, step, children)
                children += call.status is CallStatus.PENDING
                recorded.append(None)
            else:
                call, ok, arguments = self._plan_call(index, cid, key, step)
                executable += ok
                recorded.append(arguments)
            calls.append(call)
        self._record_decision(plan, calls, recorded)
        steps_left = self.config.max_steps - self.steps
        if executable > steps_left:
            # No half-run plans (docs/contract.md "Budgets at the edge").
            self._exhaust(
                "max_steps", self.config.max_steps, planned=executable, steps_left=steps_left
            )
            return
        short = self._reserve(calls, executable)
        if short is not None:
            # Children cannot get a share of a budget that is used up: no half-run plans.
            self._exhaust(short, getattr(self.config, short), planned_children=children)
            return
        self.plan = calls
        self._interrupting = False
        approvals = [c for c in calls if c.status is CallStatus.AWAITING_APPROVAL]
        self.fx.emit(
            EventKind.PLANNING_FINISHED,
            Phase.PLAN,
            {"calls": [c.call_id for c in calls], "approvals": len(approvals)},
        )
        self._checkpoint()
        self._enter(Stage.EXECUTING)
        self._exec_started = now
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

    def _taken_call_ids(self, current: Plan) -> set[str]:
        """Every call id this run has used; built from the transcript once per machine.

        Built lazily so that a resumed or forked run (a new machine) knows the ids of its
        history without the checkpoint having to carry them.
        """
        taken = self._call_ids
        if taken is None:
            taken = set(_RESERVED_KEYS)
            for entry in self.transcript:
                if isinstance(entry, ToolResult | SubagentResult):
                    taken.add(entry.call_id)
                elif (
                    isinstance(entry, DecisionEntry)
                    and isinstance(entry.decision, Plan)
                    and entry.decision is not current  # the decision being planned now
                ):
                    taken.update(s.id for s in entry.decision.steps if s.id is not None)
            self._call_ids = taken
        return taken

    def _call_id(self, own: str | None, index: int, taken: set[str]) -> str:
        """The id a step runs under: the model's own if it is new to the run, else assigned.

        Ids must be unique in the run: timers, work and late results are keyed by them, and
        idempotency keys derive from them. A model that reuses ids (some servers number
        calls per response) gets the runtime's `c<decision>.<index>` instead; the decision
        entry records whichever id was used.
        """
        if own is not None and own not in taken:
            taken.add(own)
            return own
        cid = make_call_id(self.decisions, index)
        suffix = 0
        while cid in taken:  # only after a model chose an id shaped like the runtime's
            suffix += 1
            cid = f"{make_call_id(self.decisions, index)}.{suffix}"
        taken.add(cid)
        return cid

    def _record_decision(
        self, plan: Plan, calls: list[Call], recorded: list[dict[str, Any] | None]
    ) -> None:
        """Record the decision with each step's call id and its arguments as
        `recorded_arguments` made them (frozen, secrets redacted).

        Done before the plan can end any way (accepted, invalid, over budget): what the
        transcript keeps is storable and holds no secret in clear (R26).
        """
        steps = plan.steps
        unchanged = [
            step.id == call.call_id
            and (r is None or not isinstance(step, ToolCall) or r is step.arguments)
            for step, call, r in zip(steps, calls, recorded, strict=True)
        ]
        if all(unchanged):
            return
        new_steps = tuple(
            step
            if same
            else step.model_copy(update={"id": call.call_id})
            if r is None or not isinstance(step, ToolCall)
            else step.model_copy(update={"arguments": r, "id": call.call_id})  # r is frozen
            for step, call, r, same in zip(steps, calls, recorded, unchanged, strict=True)
        )
        entry = self.transcript[-1]
        assert isinstance(entry, DecisionEntry)
        self.transcript[-1] = DecisionEntry(
            model_call=entry.model_call, decision=plan.model_copy(update={"steps": new_steps})
        )

    def _plan_call(
        self, index: int, cid: str, key: str, step: ToolCall
    ) -> tuple[Call, bool, dict[str, Any]]:
        """Turn one plan step into a call; unknown tools and bad arguments resolve at once.

        Returns the call, whether it will execute, and the arguments to record for it.
        """
        tool = self.tools.get(step.name)
        spec = None if tool is None else tool.spec
        problem = checked_arguments(step.name, step.arguments, validated=False)
        if problem is not None:
            # Nothing of them can be stored: the call records none, the error says why.
            call = Call(index, cid, "tool", step.name, {}, key, spec)
            self._resolve_now(
                call,
                AgentError.of(ErrorCode.INVALID_ARGUMENTS, problem, tool=step.name, call_id=cid),
            )
            return call, False, FrozenDict()
        if tool is None:
            recorded = recorded_arguments(None, step.arguments, None)
            call = Call(index, cid, "tool", step.name, dict(recorded), key, None)
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
            return call, False, recorded
        error: AgentError | None = None
        try:
            arguments = tool.validate(step.arguments)
        except Exception as exc:  # noqa: BLE001 - any validator failure is the agent's bad input
            found = getattr(exc, "error", None)
            error = (
                found
                if isinstance(found, AgentError)
                else AgentError.of(ErrorCode.INVALID_ARGUMENTS, str(exc), tool=step.name)
            )
        else:
            problem = checked_arguments(step.name, arguments, validated=True)
            if problem is not None:  # a validator made something no store can keep
                error = AgentError.of(
                    ErrorCode.INVALID_ARGUMENTS, problem, tool=step.name, call_id=cid
                )
        if error is not None:
            recorded = recorded_arguments(spec, step.arguments, None)
            call = Call(index, cid, "tool", step.name, dict(recorded), key, spec)
            self._resolve_now(call, error)
            return call, False, recorded
        call = Call(index, cid, "tool", step.name, arguments, key, spec)
        if call.needs_approval:
            call.status = CallStatus.AWAITING_APPROVAL
        return call, True, recorded_arguments(spec, step.arguments, arguments)

    def _resolve_now(self, call: Call, error: AgentError) -> None:
        call.status = CallStatus.DONE
        call.result = result = ToolResult(
            call_id=call.call_id, tool=call.name, ok=False, error=error, attempts=0
        )
        self._m["tool_errors"] += 1
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
        if not self._interrupting and self._cancel_reason is None:
            plan = self.plan
            scan = self._scan
            i = scan[1] if scan is not None and scan[0] is plan else 0
            settled = i  # no call before `settled` is pending
            while i < len(plan) and self._running < limit:
                call = plan[i]
                i += 1
                if call.status is not CallStatus.PENDING:
                    if settled == i - 1:
                        settled = i
                    continue
                if settled == i - 1:
                    settled = i  # dispatched below: no longer pending
                if call.kind == "subagent":
                    call.status = CallStatus.RUNNING
                    self._running += 1
                    call.first_dispatch = now
                    self._start_child(call, now)
                else:
                    call.status = CallStatus.RUNNING
                    self._running += 1
                    if not call.counted:  # a re-dispatch after a crash is the same step
                        call.counted = True
                        self.steps += 1  # R27: a validated, approved execution is one tool step
                    call.first_dispatch = now
                    self._dispatch_attempt(call, now)
            self._scan = (plan, settled)
        if self._running:
            return
        if all(c.status is CallStatus.DONE for c in self.plan):
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
                EventKind.TOOL_STARTED,
                Phase.EXECUTE,
                {
                    "call_id": call.call_id,
                    "tool": call.name,
                    "arguments": preview(call.arguments) if call.arguments else {},
                },
            )
        self.fx.dispatch(
            CallJob(call.call_id, call.name, call.arguments, call.key, call.attempt, deadline)
        )

    def _should_retry(self, call: Call, error: AgentError, now: float) -> bool:
        """R16: retry retryable failures of none/idempotent tools, with backoff, in time."""
        spec = call.spec
        if not error.retryable or spec is None or spec.side_effect is SideEffect.WRITE:
            return False
        if self._interrupting or self._cancel_reason is not None or call.cancel_reason:
            return False
        retry = call.attempt  # the retry about to happen is number `attempt`
        policy = self.config.retry
        if retry > policy.max_retries:
            return False
        at = now + policy.delay(retry, jitter_unit(call.key, retry))
        if self.deadline is not None and at >= self.deadline:
            return False
        self._m["retries"] += 1
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
            self._running -= 1
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
            self._m["tool_errors"] += 1
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
                "duration": duration,
                "abandoned": error is not None and error.details.get("abandoned") is True,
                **(
                    {"value": preview(result.value)}
                    if error is None
                    else {"message": preview(error.message)}
                ),
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
        # R15: control returns at once; the thread may never return, so it is abandoned (a
        # process-isolated call is killed instead).
        self.fx.cancel_work(call_id, "timeout")
        killed = bool(self.fx.abandon_work(call_id))
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
                **({"killed": True} if killed else {"abandoned": True}),
            )
        else:
            error = AgentError.of(
                ErrorCode.TIMEOUT,
                f"{call.name} timed out",
                retryable=True,
                tool=call.name,
                call_id=call_id,
                **({"killed": True} if killed else {"abandoned": True}),
            )
        if not write and self._should_retry(call, error, now):
            return
        self._complete(call, None, error, now)

    def _plan_complete(self, now: float) -> None:
        self.fx.unschedule(TimerKind.GRACE, PLAN_KEY)
        for call in self.plan:
            if call.result is not None:
                self.transcript.append(call.result)
        self._add_phase(Phase.EXECUTE, now - self._exec_started)
        self.fx.emit(
            EventKind.EXECUTE_FINISHED,
            Phase.EXECUTE,
            {"calls": len(self.plan), "interrupted": self._interrupting},
        )
        self.plan = []
        self._interrupting = False
        self._enter(Stage.IDLE)
        if self.state is RunState.WAITING:
            self.waiting_for = None
            self._set_state(RunState.RUNNING)
        self._boundary(now)

    def _find(self, call_id: str) -> Call | None:
        plan = self.plan
        index = self._plan_index
        if index is None or index[0] is not plan or len(index[1]) != len(plan):
            index = self._plan_index = (plan, {call.call_id: call for call in plan})
        return index[1].get(call_id)
