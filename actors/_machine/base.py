"""Shared pieces of the run machine: keys, the call record, and the errors a call can end with.

`Call` is a plain slotted record of one call of the current plan. Only `PlanState`
(`plan.py`) changes a call once it is part of a plan: it derives the count of running calls
from the status changes it makes (docs/architecture.md, "The run machine").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

from steerable.protocol import (
    AgentError,
    CallStatus,
    ErrorCode,
    SideEffect,
    SubagentResult,
    ToolResult,
    ToolSpec,
)

from .members import STATUS_AWAITING_APPROVAL, STATUS_PENDING

__all__ = [
    "MODEL_KEY",
    "PLAN_KEY",
    "RUN_KEY",
    "Call",
    "ToolLike",
    "call_error",
    "cancelled",
    "jitter_unit",
    "lost_on_resume",
    "named_error",
    "stopped_by_deadline",
    "stopped_by_run_deadline",
    "timed_out",
]

MODEL_KEY = "model"
"""The work key of the run's model call (tool calls use their call id)."""
RUN_KEY = "run"
PLAN_KEY = "plan"


class ToolLike(Protocol):
    """What the machine needs of a tool: its spec and a pure argument validator."""

    @property
    def spec(self) -> ToolSpec: ...

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]: ...


class Call:
    """One call of a plan. Built with its initial state; then changed only by `PlanState`."""

    __slots__ = (
        "arguments",
        "attempt",
        "call_id",
        "cancel_reason",
        "child",
        "counted",
        "first_dispatch",
        "index",
        "key",
        "kind",
        "name",
        "needs_approval",
        "result",
        "retry_pending",
        "spec",
        "status",
    )

    def __init__(
        self,
        index: int,
        call_id: str,
        kind: str,
        name: str,
        arguments: dict[str, Any],
        key: str,
        spec: ToolSpec | None,
        *,
        status: CallStatus | None = None,
        result: ToolResult | SubagentResult | None = None,
        attempt: int = 0,
        counted: bool = False,
        child: str | None = None,
    ) -> None:
        self.index = index
        self.call_id = call_id
        self.kind = kind
        self.name = name
        self.arguments = arguments
        self.key = key
        self.spec = spec
        self.needs_approval = spec is not None and spec.requires_approval
        if status is None:
            status = STATUS_AWAITING_APPROVAL if self.needs_approval else STATUS_PENDING
        self.status = status
        self.attempt = attempt
        self.result = result
        self.first_dispatch = 0.0
        self.cancel_reason: str | None = None
        self.retry_pending = False
        self.counted = counted
        self.child = child  # a subagent call's child run id, once known

    def snapshot(self) -> dict[str, Any]:
        """The call as a `PlannedCall` body."""
        return {
            "call_id": self.call_id,
            "kind": self.kind,
            "name": self.name,
            "arguments": self.arguments,
            "idempotency_key": self.key,
            "status": str(self.status),
            "attempts": self.attempt,
            "child_run_id": self.child,
        }


def jitter_unit(key: str, attempt: int) -> float:
    """A deterministic draw in [0, 1): replays and tests see the same delays (R16)."""
    digest = hashlib.blake2b(f"{key}/{attempt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


def call_error(call_id: str, tool: str, error: AgentError, **extra: Any) -> AgentError:
    """`error` as the run records it for call `call_id`: naming the call (and `extra`)."""
    details = error.details
    if details.get("call_id") == call_id and "tool" in details and not extra:
        return error
    return error.model_copy(
        update={"details": {**details, "call_id": call_id, "tool": tool, **extra}}
    )


def named_error(result: ToolResult | SubagentResult) -> AgentError | None:
    """The error of a call's result as the run records it (naming the call), or None."""
    error = result.error
    if error is None:
        return None
    tool = result.tool if isinstance(result, ToolResult) else result.agent
    return call_error(result.call_id, tool, error)


def stopped_by_deadline(result: ToolResult | SubagentResult | None) -> bool:
    """Whether `result` is that of a call the run's deadline stopped (the run ended there)."""
    error = None if result is None else result.error
    return (
        error is not None
        and error.code is ErrorCode.TIMEOUT
        and error.details.get("scope") == "run"
    )


def cancelled(
    reason: str, call: Call, *, abandoned: bool = False, killed: bool = False, **details: Any
) -> AgentError:
    """The `cancelled` error of one call; `killed`: its process was killed (docs/isolation.md);
    `details`: more (e.g. the value it returned after the signal)."""
    return AgentError.of(
        ErrorCode.CANCELLED,
        f"{call.name} was cancelled ({reason})",
        call_id=call.call_id,
        tool=call.name,
        reason=reason,
        abandoned=abandoned and not killed,
        **({"killed": True} if killed else {}),
        **details,
    )


def timed_out(call: Call, *, killed: bool) -> AgentError:
    """The error of a call past its own timeout (R15): `side_effect_unknown` for a write."""
    spec = call.spec
    gone: dict[str, Any] = {"killed": True} if killed else {"abandoned": True}
    if spec is not None and spec.side_effect is SideEffect.WRITE:
        return AgentError.of(
            ErrorCode.SIDE_EFFECT_UNKNOWN,
            f"{call.name} timed out; its side effect may or may not have happened",
            tool=call.name,
            call_id=call.call_id,
            side_effect="unknown",
            idempotency_key=call.key,
            **gone,
        )
    return AgentError.of(
        ErrorCode.TIMEOUT,
        f"{call.name} timed out",
        retryable=True,
        tool=call.name,
        call_id=call.call_id,
        **gone,
    )


def stopped_by_run_deadline(call: Call, *, killed: bool) -> AgentError:
    """The error of a call without a result when the run's deadline ends the run."""
    return AgentError.of(
        ErrorCode.TIMEOUT,
        f"{call.name} was stopped by the run's deadline",
        tool=call.name,
        call_id=call.call_id,
        scope="run",
        **({"killed": True} if killed else {}),
    )


def lost_on_resume(call: Call) -> AgentError:
    """The error of a call that was running when the process stopped and cannot run again."""
    if call.spec is None:
        return AgentError.of(
            ErrorCode.UNKNOWN_TOOL,
            f"no tool named {call.name!r} after resume",
            tool=call.name,
            call_id=call.call_id,
        )
    return AgentError.of(
        ErrorCode.SIDE_EFFECT_UNKNOWN,
        f"{call.name} was running when the process stopped; its side effect may or "
        "may not have happened",
        tool=call.name,
        call_id=call.call_id,
        idempotency_key=call.key,
        side_effect="unknown",
    )
