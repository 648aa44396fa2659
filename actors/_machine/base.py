"""Shared pieces of the run machine: the call record, stages, and the state every part reads.

`RunMachine` is assembled from three parts along its seams: the loop (`_machine.py`), plan
execution (`_execute.py`) and persistence (`_persist.py`). `MachineBase` declares the state
they share, so each part type-checks on its own; only the loop's `__init__` assigns it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

from steerable.protocol import (
    AgentError,
    CallStatus,
    CapabilitySnapshot,
    Compatibility,
    ErrorCode,
    EventKind,
    ForkOrigin,
    HostMessage,
    Phase,
    RunConfig,
    RunState,
    SubagentResult,
    ToolResult,
    ToolSpec,
    TranscriptEntry,
    Usage,
    UserMessage,
    WaitingFor,
)

from .effects import Effects
from .stage import Stage

__all__ = [
    "MODEL_KEY",
    "Call",
    "MachineBase",
    "Stage",
    "ToolLike",
    "call_error",
    "cancelled",
    "jitter_unit",
    "stopped_by_deadline",
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
    """One call of the current plan. Mutable: only the machine touches it."""

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
    ) -> None:
        self.index = index
        self.call_id = call_id
        self.kind = kind
        self.name = name
        self.arguments = arguments
        self.key = key
        self.spec = spec
        self.status = CallStatus.PENDING
        self.attempt = 0
        self.result: ToolResult | SubagentResult | None = None
        self.first_dispatch = 0.0
        self.needs_approval = spec is not None and spec.requires_approval
        self.cancel_reason: str | None = None
        self.retry_pending = False
        self.counted = False
        self.child: str | None = None  # a subagent call's child run id, once started

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


class MachineBase:
    """The state the machine's parts share, and the loop methods they call across seams."""

    fx: Effects
    run_id: str
    trace_id: str
    task: str
    agent: str
    config: RunConfig
    tools: Mapping[str, ToolLike]
    session_id: str | None
    task_id: str | None
    parent_run_id: str | None
    depth: int
    created_at: float
    compatibility: Compatibility
    capabilities: CapabilitySnapshot
    forked_from: ForkOrigin | None
    _static: dict[str, Any]
    _static_cache: dict[str, Any] | None

    state: RunState
    waiting_for: WaitingFor | None
    _stage: Stage
    transcript: list[TranscriptEntry]
    errors: list[AgentError]
    output: Any
    revision: int
    _checkpointed_len: int

    model_calls: int
    steps: int
    decisions: int
    usage: Usage
    _model_retries: int
    _model_in_flight: bool
    _model_discarded: bool
    _reason_started: float
    _exec_started: float

    last_seq: int
    _pending: list[HostMessage]
    plan: list[Call]
    _running: int
    _interrupting: bool
    _cancel_reason: str | None
    deadline: float | None

    _m: dict[str, Any]
    _phase_seconds: dict[str, float]
    _started_at: float
    _now: float
    _deadline_left: float | None
    _parked_revision: int
    _holding: bool
    _unseen: tuple[UserMessage, ...]
    _fork_waits: bool
    _call_ids: set[str] | None
    _deadline_passed: bool

    # Loop methods the other parts call (defined in `_machine.py`).
    def _enter(self, stage: Stage) -> None:
        raise NotImplementedError

    def _boundary(self, now: float) -> None:
        raise NotImplementedError

    def _exhaust(self, budget: str, limit: int | None, **details: Any) -> None:
        raise NotImplementedError

    def _terminate(self, state: RunState, error: AgentError | None) -> None:
        raise NotImplementedError

    def _set_state(self, state: RunState, **data: Any) -> None:
        raise NotImplementedError

    def _maybe_finish_cancel(self, now: float) -> None:
        raise NotImplementedError

    def _retry_model(self, error: AgentError, now: float) -> bool:
        raise NotImplementedError

    def _end_by_deadline(self, now: float, killed: set[str] | frozenset[str] = frozenset()) -> None:
        raise NotImplementedError

    def _record(self, error: AgentError, phase: Phase | None = None, **event: Any) -> None:
        """R6: every error is recorded on the run, in order, and is an `error` event."""
        self.errors.append(error)
        self.fx.emit(
            EventKind.ERROR, phase, {"code": error.code.value, "message": error.message, **event}
        )

    def _record_result(
        self, result: ToolResult | SubagentResult, phase: Phase | None, *, silent: bool = False
    ) -> None:
        """Record the error of a call's result (if it failed), naming the call.

        `silent`: on restore, which emits nothing (the error's event was the crashed run's).
        """
        error = result.error
        if error is None:
            return
        tool = result.tool if isinstance(result, ToolResult) else result.agent
        error = call_error(result.call_id, tool, error)
        if silent:
            self.errors.append(error)
        else:
            self._record(error, phase, call_id=result.call_id)

    def _add_phase(self, phase: Phase, seconds: float) -> None:
        raise NotImplementedError

    def _checkpoint(self) -> None:
        raise NotImplementedError

    def host(self, msg: HostMessage, now: float) -> None:
        raise NotImplementedError

    # Execution methods the persistence part calls (defined in `_execute.py`).
    def _after_call(self, now: float) -> None:
        raise NotImplementedError

    def _complete(
        self, call: Call, value: Any, error: AgentError | None, now: float, *, advance: bool = True
    ) -> None:
        raise NotImplementedError

    def pending_approvals(self) -> list[Call]:
        raise NotImplementedError

    def _find(self, call_id: str) -> Call | None:
        raise NotImplementedError

    @property
    def in_flight(self) -> bool:
        """Whether a model call or a tool call is under way."""
        return self._model_in_flight or self._running > 0

    def _note(self, text: str, **data: Any) -> None:
        raise NotImplementedError
