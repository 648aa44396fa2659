"""The payloads of the events the run machine emits (docs/events.md lists them).

Built only from what the machine passes in; previews bound every value (`preview.py`).
"""

from __future__ import annotations

from typing import Any

from steerable.protocol import AgentError, RunOutcome, RunState, SubagentResult, ToolResult

from .base import Call
from .preview import NO_ARGUMENTS, PREVIEW_CHARS, preview

__all__ = [
    "approval_requested",
    "run_ended",
    "subagent_finished",
    "subagent_started",
    "tool_finished",
    "tool_retry",
    "tool_started",
]


def approval_requested(call: Call) -> dict[str, Any]:
    """`approval_requested`: the call a person must approve."""
    return {"call_id": call.call_id, "tool": call.name, "arguments": call.arguments}


def tool_started(call: Call) -> dict[str, Any]:
    """`tool_started`: the call's first attempt is dispatched."""
    arguments = call.arguments
    return {
        "call_id": call.call_id,
        "tool": call.name,
        "arguments": preview(arguments) if arguments else NO_ARGUMENTS,
    }


def tool_retry(call: Call, delay: float, error: AgentError) -> dict[str, Any]:
    """`tool_retry`: the next attempt comes after `delay` seconds."""
    return {
        "call_id": call.call_id,
        "tool": call.name,
        "attempt": call.attempt + 1,
        "delay": delay,
        "error": error.code.value,
    }


def tool_finished(call: Call, result: ToolResult) -> dict[str, Any]:
    """`tool_finished`: the call's result, previewed."""
    # One dict literal per outcome, the common preview inlined (a short string): built once
    # per call on the supervisor's thread (issue 14's budget for rich events).
    error = result.error
    if error is None:
        value = result.value
        return {
            "call_id": call.call_id,
            "tool": call.name,
            "ok": True,
            "error": None,
            "attempts": call.attempt,
            "duration": result.duration,
            "abandoned": False,
            "value": value
            if type(value) is str and len(value) <= PREVIEW_CHARS
            else preview(value),
        }
    return {
        "call_id": call.call_id,
        "tool": call.name,
        "ok": False,
        "error": error.code._value_,
        "attempts": call.attempt,
        "duration": result.duration,
        "abandoned": error.details.get("abandoned") is True,
        "message": preview(error.message),
    }


def subagent_started(call: Call, child_run_id: str) -> dict[str, Any]:
    """`subagent_started`: the child run and the budgets reserved for it."""
    args = call.arguments
    return {
        "call_id": call.call_id,
        "agent": call.name,
        "child_run_id": child_run_id,
        "max_steps": args["max_steps"],
        "max_model_calls": args["max_model_calls"],
    }


def subagent_finished(call: Call, result: SubagentResult) -> dict[str, Any]:
    """`subagent_finished`: how the child ended."""
    return {
        "call_id": call.call_id,
        "agent": call.name,
        "child_run_id": result.child_run_id,
        "state": result.state.value,
        "ok": result.ok,
    }


def run_ended(state: RunState, error: AgentError | None, outcome: RunOutcome) -> dict[str, Any]:
    """`run_ended`: the terminal state, its error and output, previewed."""
    return {
        "state": state.value,
        "error": None if error is None else error.code.value,
        "message": None if error is None else preview(error.message),
        "output": preview(outcome.output),
        "revision": outcome.revision,
    }
