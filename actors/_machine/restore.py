"""The calls of a stored plan, rebuilt for a resume (R21) or a fork (R23).

Pure builders: each returns the call with its restored state and, when its stored arguments
no longer validate (or hold a secret only as its reference), the error result it ends with.
The machine installs the calls and records those errors without acting (docs/durability.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steerable.protocol import (
    AgentError,
    CallStatus,
    ErrorCode,
    PlannedCall,
    SubagentResult,
    ToolResult,
)
from steerable.protocol._ids import idempotency_key

from .base import Call, ToolLike

__all__ = ["SECRET_REF", "fresh_call", "restored_call"]

SECRET_REF = "secret:sha256:"
"""How the codec stores a secret (R26); such an argument cannot be restored."""


def _revalidated(
    name: str, call_id: str, arguments: dict[str, Any], tool: ToolLike
) -> tuple[dict[str, Any], AgentError | None]:
    """Stored arguments are their JSON form: validate them again for the tool (R21).

    A secret argument is stored only as its reference (R26) and cannot be restored: the
    call ends `invalid_arguments`, and the agent must supply the secret again.
    """
    if any(isinstance(v, str) and v.startswith(SECRET_REF) for v in arguments.values()):
        return arguments, AgentError.of(
            ErrorCode.INVALID_ARGUMENTS,
            f"a secret argument of {name} is stored only as a reference and cannot "
            "be restored; call the tool again with the secret",
            tool=name,
            call_id=call_id,
        )
    try:
        return tool.validate(arguments), None
    except Exception as exc:  # noqa: BLE001 - the tool changed; reported to the agent
        details = getattr(exc, "error", None)
        error = (
            details
            if isinstance(details, AgentError)
            else AgentError.of(ErrorCode.INVALID_ARGUMENTS, str(exc), tool=name)
        )
        return arguments, error


def restored_call(
    pc: PlannedCall,
    result: ToolResult | SubagentResult | None,
    kept: dict[str, Any] | None,
    tools: Mapping[str, ToolLike],
) -> tuple[Call, bool, ToolResult | None]:
    """One call of a resumed plan: (call, whether it used a step after the checkpoint, the
    error result of arguments that no longer validate)."""
    tool = tools.get(pc.name) if pc.kind == "tool" else None
    status = pc.status
    attempt = pc.attempts
    if pc.kind == "subagent":  # started: dispatched, or finished with its child's result
        counted = status is not CallStatus.PENDING or bool(getattr(result, "child_run_id", ""))
    else:
        counted = status in (CallStatus.RUNNING, CallStatus.DONE) and attempt > 0
    arguments = dict(pc.arguments)
    charged = False
    failed: ToolResult | None = None
    if result is not None:
        status = CallStatus.DONE
        attempts = result.attempts if isinstance(result, ToolResult) else 0
        if attempts and not counted:
            # It ran after the checkpoint (which predates its dispatch): charge its step.
            counted = charged = True
            attempt = attempts
    elif kept is not None:
        arguments = kept
    elif tool is not None and status is not CallStatus.DONE:
        arguments, error = _revalidated(pc.name, pc.call_id, arguments, tool)
        if error is not None:
            status = CallStatus.DONE
            result = failed = ToolResult(
                call_id=pc.call_id, tool=pc.name, ok=False, error=error, attempts=attempt
            )
    call = Call(
        0,
        pc.call_id,
        pc.kind,
        pc.name,
        arguments,
        pc.idempotency_key,
        None if tool is None else tool.spec,
        status=status,
        result=result,
        attempt=attempt,
        counted=counted,
        child=pc.child_run_id,
    )
    return call, charged, failed


def fresh_call(
    pc: PlannedCall, run_id: str, tools: Mapping[str, ToolLike]
) -> tuple[Call, ToolResult | None]:
    """One call of a forked plan: this run's key, approvals asked again (R23)."""
    tool = tools.get(pc.name) if pc.kind == "tool" else None
    spec = None if tool is None else tool.spec
    arguments = dict(pc.arguments)
    failed = None
    if tool is not None:
        arguments, error = _revalidated(pc.name, pc.call_id, arguments, tool)
        if error is not None:
            failed = ToolResult(call_id=pc.call_id, tool=pc.name, ok=False, error=error, attempts=0)
    key = idempotency_key(run_id, pc.call_id)
    if failed is not None:
        call = Call(
            0, pc.call_id, pc.kind, pc.name, arguments, key, spec,
            status=CallStatus.DONE, result=failed,
        )  # fmt: skip
    else:  # pending, or awaiting approval again (approvals are not carried over)
        call = Call(0, pc.call_id, pc.kind, pc.name, arguments, key, spec)
    return call, failed
