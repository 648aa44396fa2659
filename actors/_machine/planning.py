"""Turning a decision's plan into keyed calls: ids, keys, validation, and what is recorded.

Pure functions of the plan and the run's capabilities: unknown tools, bad arguments and
subagents that cannot start become calls that already hold their error result (the machine
records and journals them), and the decision is recorded with the ids the calls run under and
their arguments as `recorded_arguments` made them (frozen, secrets redacted, R26).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steerable.protocol import (
    AgentError,
    CallStatus,
    ErrorCode,
    Plan,
    RunConfig,
    RunState,
    SubagentCall,
    SubagentResult,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from steerable.protocol._built import built_plan, built_tool_call
from steerable.protocol._decisions import PlanStep
from steerable.protocol._frozen import FrozenDict
from steerable.protocol._ids import call_id as make_call_id
from steerable.protocol._ids import idempotency_key

from .base import Call, ToolLike
from .recording import checked_arguments, recorded_arguments

__all__ = ["Planned", "child_run_id", "plan_calls", "recorded_plan"]


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The run id of the child started by call `call_id` of `parent_run_id`.

    Derived, not drawn: re-dispatching the call after a crash finds the same child in the
    store and resumes it instead of starting a second one.
    """
    return f"{parent_run_id}-{call_id}"


class Planned:
    """The calls of one plan and what the machine needs to know of them."""

    __slots__ = ("calls", "children", "executable", "recorded")

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.recorded: list[dict[str, Any] | None] = []  # per step: arguments to record
        self.executable = 0  # tool calls that will execute (steps they will use)
        self.children = 0  # subagent calls that will start

    def add(self, call: Call, recorded: dict[str, Any] | None, *, starts: bool) -> None:
        """The next step's call; `starts`: it will execute (a tool) or start (a child)."""
        self.calls.append(call)
        self.recorded.append(recorded)
        if starts:
            if call.kind == "subagent":
                self.children += 1
            else:
                self.executable += 1


def plan_calls(
    plan: Plan,
    *,
    run_id: str,
    decisions: int,
    taken: set[str],
    tools: Mapping[str, ToolLike],
    subagents: frozenset[str],
    depth: int,
    config: RunConfig,
    children_started: int,
) -> Planned:
    """The calls of `plan`, in step order; `taken` gains their ids."""
    out = Planned()
    for index, step in enumerate(plan.steps):
        cid = _call_id(step.id, index, taken, decisions)
        key = idempotency_key(run_id, cid)
        if isinstance(step, SubagentCall):
            call = _plan_subagent(
                index, cid, key, step, run_id, subagents, depth, config,
                children_started + out.children,
            )  # fmt: skip
            out.add(call, None, starts=call.status is CallStatus.PENDING)
        else:
            call, ok, arguments = _plan_call(index, cid, key, step, tools)
            out.add(call, arguments, starts=ok)
    return out


def _call_id(own: str | None, index: int, taken: set[str], decisions: int) -> str:
    """The id a step runs under: the model's own if it is new to the run, else assigned.

    Ids must be unique in the run: timers, work and late results are keyed by them, and
    idempotency keys derive from them. A model that reuses ids (some servers number calls
    per response) gets the runtime's `c<decision>.<index>` instead; the decision entry
    records whichever id was used.
    """
    if own is not None and own not in taken:
        taken.add(own)
        return own
    cid = make_call_id(decisions, index)
    suffix = 0
    while cid in taken:  # only after a model chose an id shaped like the runtime's
        suffix += 1
        cid = f"{make_call_id(decisions, index)}.{suffix}"
    taken.add(cid)
    return cid


def recorded_plan(plan: Plan, planned: Planned) -> Plan:
    """`plan` as the transcript records it: each step with its call id and recorded arguments.

    Done before the plan can end any way (accepted, invalid, over budget): what the
    transcript keeps is storable and holds no secret in clear (R26).
    """
    steps = plan.steps
    calls = planned.calls
    recorded = planned.recorded
    new_steps: list[PlanStep] | None = None  # made at the first step that changes
    for index, step in enumerate(steps):
        call = calls[index]
        r = recorded[index]
        same = step.id == call.call_id
        if same and r is not None and isinstance(step, ToolCall):
            same = r is step.arguments
        if same:
            if new_steps is not None:
                new_steps.append(step)
            continue
        if new_steps is None:
            new_steps = list(steps[:index])
        # Built without a second validation (protocol/_built.py): every input is a field of
        # the agent's validated plan, a frozen recorded argument map or a runtime-made call id.
        new_steps.append(
            built_tool_call(step.name, step.arguments if r is None else r, call.call_id)
            if isinstance(step, ToolCall)
            else step.model_copy(update={"id": call.call_id})
        )
    if new_steps is None:
        return plan
    return built_plan(tuple(new_steps), plan.usage, plan.thought)


def _failed(
    index: int,
    cid: str,
    name: str,
    key: str,
    spec: ToolSpec | None,
    arguments: dict[str, Any],
    error: AgentError,
) -> Call:
    result = ToolResult(call_id=cid, tool=name, ok=False, error=error, attempts=0)
    return Call(
        index, cid, "tool", name, arguments, key, spec, status=CallStatus.DONE, result=result
    )


def _plan_call(
    index: int, cid: str, key: str, step: ToolCall, tools: Mapping[str, ToolLike]
) -> tuple[Call, bool, dict[str, Any]]:
    """Turn one plan step into a call; unknown tools and bad arguments resolve at once.

    Returns the call, whether it will execute, and the arguments to record for it.
    """
    # The step's fields read once: a pydantic field read costs several times a local's.
    name = step.name
    raw = step.arguments
    tool = tools.get(name)
    spec = None if tool is None else tool.spec
    problem = checked_arguments(name, raw, validated=False)
    if problem is not None:
        # Nothing of them can be stored: the call records none, the error says why.
        bad = AgentError.of(ErrorCode.INVALID_ARGUMENTS, problem, tool=name, call_id=cid)
        return _failed(index, cid, name, key, spec, {}, bad), False, FrozenDict()
    if tool is None:
        recorded = recorded_arguments(None, raw, None)
        unknown = AgentError.of(
            ErrorCode.UNKNOWN_TOOL,
            f"no tool named {name!r}",
            tool=name,
            call_id=cid,
            available=sorted(tools),
        )
        return _failed(index, cid, name, key, None, dict(recorded), unknown), False, recorded
    error: AgentError | None = None
    try:
        arguments = tool.validate(raw)
    except Exception as exc:  # noqa: BLE001 - any validator failure is the agent's bad input
        found = getattr(exc, "error", None)
        error = (
            found
            if isinstance(found, AgentError)
            else AgentError.of(ErrorCode.INVALID_ARGUMENTS, str(exc), tool=name)
        )
    else:
        problem = checked_arguments(name, arguments, validated=True)
        if problem is not None:  # a validator made something no store can keep
            error = AgentError.of(ErrorCode.INVALID_ARGUMENTS, problem, tool=name, call_id=cid)
    if error is not None:
        recorded = recorded_arguments(spec, raw, None)
        return _failed(index, cid, name, key, spec, dict(recorded), error), False, recorded
    call = Call(index, cid, "tool", name, arguments, key, spec)
    return call, True, recorded_arguments(spec, raw, arguments)


def _plan_subagent(
    index: int,
    cid: str,
    key: str,
    step: SubagentCall,
    run_id: str,
    subagents: frozenset[str],
    depth: int,
    config: RunConfig,
    started: int,
) -> Call:
    """A child call, or a call resolved at once with the reason it cannot start."""
    arguments: dict[str, Any] = {
        "task": step.task,
        "max_steps": step.max_steps,
        "max_model_calls": step.max_model_calls,
    }
    error = None
    if step.agent not in subagents:
        error = AgentError.of(
            ErrorCode.UNKNOWN_AGENT,
            f"no subagent named {step.agent!r} is registered",
            agent=step.agent,
            available=sorted(subagents),
        )
    elif depth + 1 > config.max_depth:
        error = AgentError.of(
            ErrorCode.BUDGET_EXHAUSTED,
            f"a subagent at depth {depth + 1} exceeds max_depth {config.max_depth}",
            budget="max_depth",
            limit=config.max_depth,
        )
    elif started >= config.max_children:
        error = AgentError.of(
            ErrorCode.BUDGET_EXHAUSTED,
            f"this run may start at most {config.max_children} subagents",
            budget="max_children",
            limit=config.max_children,
        )
    if error is None:  # derived, so the plan's checkpoint already names the child (R3)
        child = child_run_id(run_id, cid)
        return Call(index, cid, "subagent", step.agent, arguments, key, None, child=child)
    result = SubagentResult(
        call_id=cid,
        agent=step.agent,
        child_run_id="",
        state=RunState.ERROR,
        ok=False,
        error=error,
    )
    return Call(
        index, cid, "subagent", step.agent, arguments, key, None,
        status=CallStatus.DONE, result=result,
    )  # fmt: skip
