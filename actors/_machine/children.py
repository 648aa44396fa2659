"""Subagents in the run machine: budgets carved from the parent, and a child's result.

A `SubagentCall` step becomes a call of kind "subagent" (`planning.py`). Before any child
starts, its tool steps, model calls and tokens are reserved from what the parent has left, so
parallel children can never overshoot the parent together; when a child ends, what it used
rolls up into the parent's counters (`Meter.charge`) and the rest of its reservation returns
(docs/requirements.md "Run trees").
"""

from __future__ import annotations

from steerable.protocol import (
    AgentError,
    CallStatus,
    ErrorCode,
    RunConfig,
    RunOutcome,
    RunState,
    SubagentResult,
    Usage,
)

from .base import Call
from .effects import ChildJob
from .planning import child_run_id

__all__ = ["cancelled_child", "child_job", "child_result", "child_run_id", "reserve"]


def reserve(
    calls: list[Call],
    tool_steps: int,
    config: RunConfig,
    *,
    steps: int,
    model_calls: int,
    usage: Usage,
) -> str | None:
    """Carve each pending child's budgets from what is left; None, or the budget short.

    Writes the reservation into the new calls' arguments (before the plan is installed).
    """
    children = [c for c in calls if c.kind == "subagent" and c.status is CallStatus.PENDING]
    if not children:
        return None
    steps_left = config.max_steps - steps - tool_steps
    # The parent keeps one model call to read its children's results.
    calls_left = config.max_model_calls - model_calls - 1
    tokens = None if config.token_budget is None else config.token_budget - usage.total
    explicit_steps = sum(c.arguments["max_steps"] or 0 for c in children)
    explicit_calls = sum(c.arguments["max_model_calls"] or 0 for c in children)
    implicit_steps = [c for c in children if c.arguments["max_steps"] is None]
    implicit_calls = [c for c in children if c.arguments["max_model_calls"] is None]
    if explicit_steps > steps_left:
        return "max_steps"
    if explicit_calls > calls_left:
        return "max_model_calls"
    share_steps = (steps_left - explicit_steps) // max(1, len(implicit_steps))
    share_calls = (calls_left - explicit_calls) // max(1, len(implicit_calls))
    if implicit_calls and share_calls < 1:
        return "max_model_calls"
    for c in children:
        args = c.arguments
        args["max_steps"] = args["max_steps"] or share_steps
        args["max_model_calls"] = args["max_model_calls"] or share_calls
        args["token_budget"] = None if tokens is None else tokens // len(children)
    return None


def child_job(call: Call, run_id: str, depth: int, deadline: float | None, now: float) -> ChildJob:
    """The job that starts (or resumes) the child run of `call`."""
    args = call.arguments
    return ChildJob(
        call_id=call.call_id,
        run_id=child_run_id(run_id, call.call_id),
        agent=call.name,
        task=args["task"],
        depth=depth + 1,
        max_steps=args["max_steps"],
        max_model_calls=args["max_model_calls"],
        token_budget=args.get("token_budget"),
        seconds_left=None if deadline is None else max(0.0, deadline - now),
    )


def child_result(call: Call, outcome: RunOutcome) -> SubagentResult:
    """A child run's outcome as its parent records it (R7)."""
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
    return SubagentResult(
        call_id=call.call_id,
        agent=call.name,
        child_run_id=outcome.run_id,
        state=outcome.state,
        ok=ok,
        output=outcome.output if ok else None,
        error=error,
        child_revision=outcome.revision,
    )


def cancelled_child(call: Call, run_id: str, error: AgentError) -> SubagentResult:
    """The result of a child call that ends without its child's outcome (interrupt, cancel,
    deadline)."""
    started = call.status is CallStatus.RUNNING
    return SubagentResult(
        call_id=call.call_id,
        agent=call.name,
        child_run_id=child_run_id(run_id, call.call_id) if started else "",
        state=RunState.CANCELLED,
        ok=False,
        error=error,
    )
