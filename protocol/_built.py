"""Per-step records built from values that are already validated, without a second pass.

`recorded_plan` (actors/_machine/planning.py) rebuilds the agent's plan with the call ids the
steps ran under once per decision; every input is a field of a validated `Plan` / `ToolCall`
or a runtime-made call id, so pydantic's validation would only re-check what was checked where
the values entered (the agent's decision). `model_construct` is no cheaper than validating
these small records (it walks the fields in Python), so the instance is filled in directly
with exactly the state a validated construction leaves (`__dict__` in field order, the fields
set, no extra or private values); tests/test_built.py proves a built record equals the
validated one. Bad input is still rejected where it enters: these builders are only for values
that have already crossed that boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import built_record, slot_twin
from ._decisions import AskUser, Finish, Plan, PlanStep, ToolCall, Usage
from ._errors import AgentError
from ._frozen import freeze
from ._messages import DecisionEntry, ToolResult, UserMessage
from ._view import Budgets, RunView, Transcript

__all__ = [
    "built_budgets",
    "built_decision_entry",
    "built_plan",
    "built_tool_call",
    "built_tool_result",
    "built_view",
]

_new = object.__new__


def built_tool_call(name: str, arguments: Mapping[str, Any], call_id: str) -> ToolCall:
    """`ToolCall(name=..., arguments=..., id=...)` from a validated call's name, frozen arguments
    and a call id of 1-128 characters (the caller's guarantee)."""
    return built_record(
        ToolCall,
        {"kind": "tool", "name": name, "arguments": arguments, "id": call_id},
        {"name", "arguments", "id"},
    )


def built_plan(steps: tuple[PlanStep, ...], usage: Usage, thought: str) -> Plan:
    """`Plan(steps=..., usage=..., thought=...)` from validated steps, usage and thought."""
    return built_record(
        Plan,
        {"kind": "plan", "steps": steps, "usage": usage, "thought": thought},
        {"steps", "usage", "thought"},
    )


_DECISION_TYPES = (Plan, Finish, AskUser)


def built_decision_entry(model_call: int, decision: Plan | Finish | AskUser) -> DecisionEntry:
    """`DecisionEntry(model_call=..., decision=...)` for a validated decision (its own record,
    kept as it is, as validation keeps it) and the machine's model call number.

    Anything not of the exact types the record holds (a subclass of a decision, a number that
    is not an int) goes through the validated constructor.
    """
    if type(model_call) is not int or type(decision) not in _DECISION_TYPES:
        return DecisionEntry(model_call=model_call, decision=decision)
    return built_record(
        DecisionEntry,
        {"kind": "decision", "model_call": model_call, "decision": decision},
        {"model_call", "decision"},
    )


def built_tool_result(
    call_id: str,
    tool: str,
    ok: bool,
    value: Any,
    error: AgentError | None,
    attempts: int,
    duration: float,
) -> ToolResult:
    """`ToolResult(...)` with every field given, for a finished call (actors/_machine/execute.py).

    The tool's `value` is the one input from outside: it is frozen here exactly as the field's
    validator would (`FrozenAny` is `Any` then `freeze`). Anything not of the exact type the
    record holds goes through the validated constructor, so a wrong value errors as before.
    """
    if (
        type(call_id) is not str
        or type(tool) is not str
        or type(ok) is not bool
        or (error is not None and type(error) is not AgentError)
        or type(attempts) is not int
        or type(duration) is not float
    ):
        return ToolResult(
            call_id=call_id,
            tool=tool,
            ok=ok,
            value=value,
            error=error,
            attempts=attempts,
            duration=duration,
        )
    return built_record(
        ToolResult,
        {
            "kind": "tool_result",
            "call_id": call_id,
            "tool": tool,
            "ok": ok,
            "value": freeze(value),
            "error": error,
            "attempts": attempts,
            "duration": duration,
        },
        {"call_id", "tool", "ok", "value", "error", "attempts", "duration"},
    )


# `RunView` and `Budgets` are frozen slotted dataclasses, built once per model call
# (actors/_machine/reasoning.py) through a twin of each (`slot_twin`). tests/test_built.py
# checks they equal the constructed ones.
_ViewTwin = slot_twin(RunView)
_BudgetsTwin = slot_twin(Budgets)


def built_budgets(
    steps_left: int, model_calls_left: int, tokens_left: int | None, seconds_left: float | None
) -> Budgets:
    """`Budgets(steps_left, model_calls_left, tokens_left, seconds_left)`."""
    budgets: Any = _new(_BudgetsTwin)
    budgets.steps_left = steps_left
    budgets.model_calls_left = model_calls_left
    budgets.tokens_left = tokens_left
    budgets.seconds_left = seconds_left
    budgets.__class__ = Budgets
    return budgets  # type: ignore[no-any-return]


def built_view(
    run_id: str,
    task: str,
    transcript: Transcript,
    delivered: tuple[UserMessage, ...],
    usage: Usage,
    model_calls: int,
    steps: int,
    budgets: Budgets,
    depth: int,
    parent_run_id: str | None,
    session_id: str | None,
    task_id: str | None,
    tools: tuple[Any, ...],
    subagents: tuple[str, ...],
) -> RunView:
    """`RunView(...)` with every field but `call` (None: the runtime sets it) given in order."""
    view: Any = _new(_ViewTwin)
    view.run_id = run_id
    view.task = task
    view.transcript = transcript
    view.delivered = delivered
    view.usage = usage
    view.model_calls = model_calls
    view.steps = steps
    view.budgets = budgets
    view.depth = depth
    view.parent_run_id = parent_run_id
    view.session_id = session_id
    view.task_id = task_id
    view.tools = tools
    view.subagents = subagents
    view.call = None
    view.__class__ = RunView
    return view  # type: ignore[no-any-return]
