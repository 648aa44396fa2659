"""The port through which the pure run machine acts on the world.

The machine (`_machine.py`) never touches a thread, a clock or a store: every effect is a call
on this port. The `RunSupervisor` implements it for real; tests implement it with a recorder
and drive the machine directly (hypothesis state machines, replay). Calls rather than returned
effect objects keep the hot path free of allocations; a recorder turns them back into a list.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from steerable.protocol import (
    EventKind,
    Phase,
    RunOutcome,
    RunView,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)

__all__ = ["CallJob", "ChildJob", "Effects", "TimerKind", "call_job"]


class TimerKind(StrEnum):
    """The timers a run schedules; each fires back into the run's inbox."""

    TOOL_TIMEOUT = "tool_timeout"
    MODEL_TIMEOUT = "model_timeout"
    RUN_DEADLINE = "run_deadline"
    TOOL_RETRY = "tool_retry"
    MODEL_RETRY = "model_retry"
    GRACE = "grace"


@dataclass(frozen=True, slots=True)
class CallJob:
    """One attempt of one tool call, as the machine asks for it to be dispatched."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    attempt: int
    deadline: float


_c_call_id, _c_tool, _c_arguments, _c_key, _c_attempt, _c_deadline = (
    vars(CallJob)[name].__set__ for name in CallJob.__dataclass_fields__
)
_new = object.__new__


def call_job(
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
    idempotency_key: str,
    attempt: int,
    deadline: float,
) -> CallJob:
    """`CallJob(...)` set through its slots (once per attempt): the frozen dataclass's own
    __init__ sets each field with `object.__setattr__`, at twice the cost."""
    job = _new(CallJob)
    _c_call_id(job, call_id)
    _c_tool(job, tool)
    _c_arguments(job, arguments)
    _c_key(job, idempotency_key)
    _c_attempt(job, attempt)
    _c_deadline(job, deadline)
    return job


@dataclass(frozen=True, slots=True)
class ChildJob:
    """A subagent run to start (or resume, if the store has it) for call `call_id`."""

    call_id: str
    run_id: str
    agent: str
    task: str
    depth: int
    max_steps: int
    max_model_calls: int
    token_budget: int | None
    seconds_left: float | None


class Effects(Protocol):
    """Everything the machine can make happen. Implementations must not block."""

    def decide(self, model_call: int, view: RunView, deadline: float) -> None:
        """Call the agent's `decide(view)` (and `accept` on a Finish) off the supervisor."""
        ...

    def dispatch(self, job: CallJob) -> None:
        """Run one tool call attempt on a worker, with a cancel scope and its deadline."""
        ...

    def start_child(self, job: ChildJob) -> None:
        """Start the child run of a subagent call; its outcome comes back as `child_done`."""
        ...

    def cancel_work(self, key: str, reason: str) -> None:
        """Signal the cancel scope of a call (`key` = call id) or model call (`key` = "model")."""
        ...

    def abandon_work(self, key: str) -> bool | None:
        """Give up on a call or model call that did not stop: its worker is never reused.

        Returns True if the work was killed instead (a process-isolated or remote call): its
        result then says `killed`, not `abandoned`. False or None: it may still be running.
        """
        ...

    def schedule(self, kind: TimerKind, key: str, attempt: int, at: float) -> None:
        """Fire timer (kind, key, attempt) at monotonic time `at` (replaces the same kind+key)."""
        ...

    def unschedule(self, kind: TimerKind, key: str) -> None:
        """Cancel timer (kind, key) if it is pending."""
        ...

    def emit(self, kind: EventKind, phase: Phase | None, data: dict[str, Any]) -> None:
        """Publish an event (and fire the hooks of its moment)."""
        ...

    def journal(self, result: ToolResult | SubagentResult) -> None:
        """Store a call's result as it arrives (durable inbox), before the plan completes."""
        ...

    def checkpoint(
        self,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: list[TranscriptEntry],
    ) -> None:
        """Write revision `revision`: the snapshot and the transcript entries since the last."""
        ...

    def settled(self, outcome: RunOutcome) -> None:
        """The run reached a terminal state: publish its outcome."""
        ...
