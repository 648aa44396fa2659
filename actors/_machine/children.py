"""Subagents in the run machine: child calls, budgets carved from the parent, results up.

A `SubagentCall` step becomes a call of kind "subagent". Before any child starts, its tool
steps, model calls and tokens are reserved from what the parent has left, so parallel children
can never overshoot the parent together; when a child ends, what it used rolls up into the
parent's counters and the rest of its reservation returns (docs/requirements.md "Run trees").
"""

from __future__ import annotations

from typing import Any

from steerable.protocol import (
    AgentError,
    CallStatus,
    ErrorCode,
    EventKind,
    Phase,
    RunOutcome,
    RunState,
    SubagentCall,
    SubagentResult,
    Usage,
)

from .base import Call, MachineBase
from .effects import ChildJob

__all__ = ["ChildrenMixin", "child_run_id"]


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The run id of the child started by call `call_id` of `parent_run_id`.

    Derived, not drawn: re-dispatching the call after a crash finds the same child in the
    store and resumes it instead of starting a second one.
    """
    return f"{parent_run_id}-{call_id}"


class ChildrenMixin(MachineBase):
    """The run machine's subagent calls (see `RunMachine`)."""

    subagents: frozenset[str]
    children_started: int

    def _plan_subagent(
        self, index: int, cid: str, key: str, step: SubagentCall, planned_children: int
    ) -> Call:
        """A child call, or a call resolved at once with the reason it cannot start."""
        arguments: dict[str, Any] = {
            "task": step.task,
            "max_steps": step.max_steps,
            "max_model_calls": step.max_model_calls,
        }
        call = Call(index, cid, "subagent", step.agent, arguments, key, None)
        error = None
        if step.agent not in self.subagents:
            error = AgentError.of(
                ErrorCode.UNKNOWN_AGENT,
                f"no subagent named {step.agent!r} is registered",
                agent=step.agent,
                available=sorted(self.subagents),
            )
        elif self.depth + 1 > self.config.max_depth:
            error = AgentError.of(
                ErrorCode.BUDGET_EXHAUSTED,
                f"a subagent at depth {self.depth + 1} exceeds max_depth {self.config.max_depth}",
                budget="max_depth",
                limit=self.config.max_depth,
            )
        elif self.children_started + planned_children >= self.config.max_children:
            error = AgentError.of(
                ErrorCode.BUDGET_EXHAUSTED,
                f"this run may start at most {self.config.max_children} subagents",
                budget="max_children",
                limit=self.config.max_children,
            )
        if error is not None:
            self._child_failed_now(call, error)
        else:  # derived, so the plan's checkpoint already names the child (R3)
            call.child = child_run_id(self.run_id, cid)
        return call

    def _child_failed_now(self, call: Call, error: AgentError) -> None:
        call.status = CallStatus.DONE
        call.result = result = SubagentResult(
            call_id=call.call_id,
            agent=call.name,
            child_run_id="",
            state=RunState.ERROR,
            ok=False,
            error=error,
        )
        self._record_result(result, Phase.PLAN)
        self.fx.journal(result)

    def _reserve(self, calls: list[Call], tool_steps: int) -> str | None:
        """Carve each pending child's budgets from what is left; None, or the budget short."""
        children = [c for c in calls if c.kind == "subagent" and c.status is CallStatus.PENDING]
        if not children:
            return None
        cfg = self.config
        steps = cfg.max_steps - self.steps - tool_steps
        # The parent keeps one model call to read its children's results.
        calls_left = cfg.max_model_calls - self.model_calls - 1
        tokens = None if cfg.token_budget is None else cfg.token_budget - self.usage.total
        explicit_steps = sum(c.arguments["max_steps"] or 0 for c in children)
        explicit_calls = sum(c.arguments["max_model_calls"] or 0 for c in children)
        implicit_steps = [c for c in children if c.arguments["max_steps"] is None]
        implicit_calls = [c for c in children if c.arguments["max_model_calls"] is None]
        if explicit_steps > steps:
            return "max_steps"
        if explicit_calls > calls_left:
            return "max_model_calls"
        share_steps = (steps - explicit_steps) // max(1, len(implicit_steps))
        share_calls = (calls_left - explicit_calls) // max(1, len(implicit_calls))
        if implicit_calls and share_calls < 1:
            return "max_model_calls"
        for c in children:
            c.arguments["max_steps"] = c.arguments["max_steps"] or share_steps
            c.arguments["max_model_calls"] = c.arguments["max_model_calls"] or share_calls
            c.arguments["token_budget"] = None if tokens is None else tokens // len(children)
        return None

    def _start_child(self, call: Call, now: float) -> None:
        if not call.counted:  # a child re-dispatched after a crash is the same child
            call.counted = True
            self.children_started += 1
        call.child = child_run_id(self.run_id, call.call_id)
        args = call.arguments
        deadline = self.deadline
        self.fx.emit(
            EventKind.SUBAGENT_STARTED,
            Phase.EXECUTE,
            {
                "call_id": call.call_id,
                "agent": call.name,
                "child_run_id": child_run_id(self.run_id, call.call_id),
                "max_steps": args["max_steps"],
                "max_model_calls": args["max_model_calls"],
            },
        )
        self.fx.start_child(
            ChildJob(
                call_id=call.call_id,
                run_id=child_run_id(self.run_id, call.call_id),
                agent=call.name,
                task=args["task"],
                depth=self.depth + 1,
                max_steps=args["max_steps"],
                max_model_calls=args["max_model_calls"],
                token_budget=args.get("token_budget"),
                seconds_left=None if deadline is None else max(0.0, deadline - now),
            )
        )

    def child_done(self, call_id: str, outcome: RunOutcome, now: float) -> None:
        """A child run reached its terminal state: its result enters the parent (R7)."""
        self._now = now
        call = self._find(call_id)
        if (
            self._stage_done()
            or call is None
            or call.kind != "subagent"
            or call.status is not CallStatus.RUNNING
        ):
            self._m["late_results_dropped"] += 1
            return
        metrics = outcome.metrics
        # Subagent usage counts toward the parent's budgets (docs/contract.md, "Budgets at
        # the edge").
        self.steps += metrics.steps
        self.model_calls += metrics.model_calls
        self.usage = self.usage + Usage(
            input_tokens=metrics.input_tokens, output_tokens=metrics.output_tokens
        )
        self._finish_child(call, outcome, now)

    def _finish_child(self, call: Call, outcome: RunOutcome, now: float) -> None:
        ok = outcome.state is RunState.FINISHED
        error = None
        if not ok:
            last = outcome.error
            code = ErrorCode.CANCELLED if call.cancel_reason else ErrorCode.SUBAGENT_FAILED
            if last is not None and last.code is ErrorCode.UNKNOWN_AGENT:
                code = ErrorCode.UNKNOWN_AGENT  # the child could not even start
            error = AgentError.of(
                code,
                f"subagent {call.name} ended {outcome.state.value}"
                + (f": {last.message}" if last is not None else ""),
                child_run_id=outcome.run_id,
                state=outcome.state.value,
                errors=[e.model_dump(mode="json") for e in outcome.errors],
            )
        result = SubagentResult(
            call_id=call.call_id,
            agent=call.name,
            child_run_id=outcome.run_id,
            state=outcome.state,
            ok=ok,
            output=outcome.output if ok else None,
            error=error,
            child_revision=outcome.revision,
        )
        self._record_child(call, result, now)

    def _record_child(
        self, call: Call, result: SubagentResult, now: float, *, advance: bool = True
    ) -> None:
        if call.status is CallStatus.RUNNING:
            self._running -= 1
        call.status = CallStatus.DONE
        call.result = result
        self._record_result(result, Phase.EXECUTE)
        self.fx.journal(result)
        self.fx.emit(
            EventKind.SUBAGENT_FINISHED,
            Phase.EXECUTE,
            {
                "call_id": call.call_id,
                "agent": call.name,
                "child_run_id": result.child_run_id,
                "state": result.state.value,
                "ok": result.ok,
            },
        )
        if advance:
            self._after_call(now)

    def _child_cancelled(self, call: Call, error: AgentError, now: float, *, advance: bool) -> None:
        """A child call ends without its child's outcome (interrupt, cancel, deadline)."""
        started = call.status is CallStatus.RUNNING
        result = SubagentResult(
            call_id=call.call_id,
            agent=call.name,
            child_run_id=child_run_id(self.run_id, call.call_id) if started else "",
            state=RunState.CANCELLED,
            ok=False,
            error=error,
        )
        self._record_child(call, result, now, advance=advance)

    def _stage_done(self) -> bool:
        raise NotImplementedError
