"""The one error contract (R5): a code, a message, retryability and details, kept apart."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from ._base import Record, built_record
from ._frozen import FrozenDict, FrozenMap, freeze

__all__ = ["DEFAULT_RETRYABLE", "AgentError", "ErrorCode", "SteerableError"]


class ErrorCode(StrEnum):
    """Every error the runtime reports has one of these codes (docs/states-and-errors.md)."""

    HANDLER_ERROR = "handler_error"
    """A tool, agent or callback raised an exception."""
    TIMEOUT = "timeout"
    """A tool call or the whole run ran past its deadline."""
    PROVIDER_TIMEOUT = "provider_timeout"
    """The agent's `decide` (the model call) ran past `model_timeout`."""
    PROVIDER_ERROR = "provider_error"
    """A model provider refused or failed a model call (HTTP status, connection, overflow)."""
    CANCELLED = "cancelled"
    """The work was cancelled (by the host, an interrupting message, or a parent run)."""
    APPROVAL_DENIED = "approval_denied"
    """A person denied a tool call that required approval."""
    CAPABILITY_MISMATCH = "capability_mismatch"
    """A resume found tools or agents that differ from the checkpoint's capability snapshot."""
    SIDE_EFFECT_UNKNOWN = "side_effect_unknown"
    """A write may or may not have happened (timed out, or interrupted by a crash)."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """A budget (tool steps, model calls, tokens) was used up."""
    INVALID_DECISION = "invalid_decision"
    """The agent returned something that is not a usable decision (e.g. an empty plan)."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """A tool call's arguments did not validate against the tool's signature."""
    UNKNOWN_TOOL = "unknown_tool"
    """A tool call named a tool the runtime does not have."""
    UNKNOWN_AGENT = "unknown_agent"
    """A subagent call named an agent the runtime does not have."""
    CHECKPOINT_INCOMPATIBLE = "checkpoint_incompatible"
    """A checkpoint's format or task version cannot be used by this runtime."""
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"
    """Bytes that should be a checkpoint are not one (truncated, flipped, foreign)."""
    HOOK_ERROR = "hook_error"
    """A lifecycle hook raised; the run went on."""
    SUBAGENT_FAILED = "subagent_failed"
    """A subagent run ended in a state other than FINISHED."""
    RESOURCE_EXHAUSTED = "resource_exhausted"
    """The process refused more work: too many abandoned threads, or a thread could not start."""
    STORE_UNAVAILABLE = "store_unavailable"
    """The checkpoint store could not store (full, locked, read-only); nothing stored was lost."""
    NOT_FOUND = "not_found"
    """A run, revision or call id that the runtime does not know."""
    RUN_ENDED = "run_ended"
    """A message was sent to a run that is already terminal (or a runtime that shut down)."""
    RUN_OWNED = "run_owned"
    """The run is owned by another live runtime (its lease has not expired); details name the
    owner and the lease's expiry. A run that lost its lease in this process reports it too."""
    INTERNAL_ERROR = "internal_error"
    """A defect in steerable itself; please report it."""
    TOOL_CRASHED = "tool_crashed"
    """An isolated tool's worker died during the call (signal, exit, limit); see details."""


DEFAULT_RETRYABLE: dict[ErrorCode, bool] = {
    ErrorCode.HANDLER_ERROR: False,
    ErrorCode.TIMEOUT: False,
    ErrorCode.PROVIDER_TIMEOUT: True,
    ErrorCode.PROVIDER_ERROR: False,
    ErrorCode.CANCELLED: False,
    ErrorCode.APPROVAL_DENIED: False,
    ErrorCode.CAPABILITY_MISMATCH: False,
    ErrorCode.SIDE_EFFECT_UNKNOWN: False,
    ErrorCode.BUDGET_EXHAUSTED: False,
    ErrorCode.INVALID_DECISION: False,
    ErrorCode.INVALID_ARGUMENTS: False,
    ErrorCode.UNKNOWN_TOOL: False,
    ErrorCode.UNKNOWN_AGENT: False,
    ErrorCode.CHECKPOINT_INCOMPATIBLE: False,
    ErrorCode.CHECKPOINT_CORRUPT: False,
    ErrorCode.HOOK_ERROR: False,
    ErrorCode.SUBAGENT_FAILED: False,
    ErrorCode.RESOURCE_EXHAUSTED: True,
    ErrorCode.STORE_UNAVAILABLE: True,
    ErrorCode.NOT_FOUND: False,
    ErrorCode.RUN_ENDED: False,
    ErrorCode.RUN_OWNED: False,
    ErrorCode.INTERNAL_ERROR: False,
    ErrorCode.TOOL_CRASHED: False,
}
"""Whether each code is retryable when the reporter does not say otherwise."""


class AgentError(Record):
    """One error, as the runtime reports it to agents and hosts (R5).

    Attributes:
        code: What kind of error this is.
        message: A human-readable sentence.
        retryable: Whether trying the same thing again may succeed.
        details: Structured context (tool name, call id, budget and limit, ...); msgpack-able.
    """

    code: ErrorCode
    message: str
    retryable: bool = False
    details: FrozenMap = Field(default_factory=FrozenDict)

    @classmethod
    def of(
        cls, code: ErrorCode, message: str, *, retryable: bool | None = None, **details: Any
    ) -> AgentError:
        """Build an error, taking retryability from `DEFAULT_RETRYABLE` unless given."""
        if retryable is None:
            # An unknown code is refused by validation below (a ValidationError, not a KeyError).
            retryable = DEFAULT_RETRYABLE.get(code, False)
        if (
            cls is AgentError
            and type(code) is ErrorCode
            and type(message) is str
            and type(retryable) is bool
        ):
            # What validation would leave, without its pass (~3 µs of the 4-5 an error costs,
            # and the runtime builds a few per cancelled or failed call): keyword names are
            # always str, and the details are frozen exactly as `FrozenMap` freezes them.
            return built_record(
                AgentError,
                {
                    "code": code,
                    "message": message,
                    "retryable": retryable,
                    "details": freeze(details),
                },
                {"code", "message", "retryable", "details"},
            )
        return cls(code=code, message=message, retryable=retryable, details=details)


class SteerableError(Exception):
    """The exception the runtime raises at the host boundary; it carries an `AgentError`.

    Raised for bad input that cannot be reported as a run result: a corrupt or foreign
    checkpoint, an incompatible resume, an unknown run id, a runtime that is shut down.
    """

    def __init__(self, error: AgentError) -> None:
        super().__init__(f"[{error.code}] {error.message}")
        self.error = error

    @property
    def code(self) -> ErrorCode:
        """The error's code."""
        return self.error.code
