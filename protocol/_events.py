"""Observable phases (R12), hook names (R13) and the events a run emits."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from ._base import Record

__all__ = ["HOOK_EVENTS", "EventKind", "HookName", "Phase", "RunEvent"]


class Phase(StrEnum):
    """The runtime phases of one loop iteration (R12, R27)."""

    LOAD = "load"
    """Starting or resuming: state loaded, inbox applied."""
    REASON = "reason"
    """The agent's `decide` (the model call) is running."""
    PLAN = "plan"
    """The decision is checked and turned into calls with idempotency keys."""
    EXECUTE = "execute"
    """The plan's calls run."""
    OBSERVE = "observe"
    """Results are in; the transcript is updated at a safe boundary."""


class HookName(StrEnum):
    """The lifecycle hooks of R13; each fires with the `RunEvent` of its moment."""

    ON_START = "on_start"
    BEFORE_REASONING = "before_reasoning"
    AFTER_REASONING = "after_reasoning"
    BEFORE_PLANNING = "before_planning"
    AFTER_PLANNING = "after_planning"
    BEFORE_EXECUTE = "before_execute"
    AFTER_EXECUTE = "after_execute"
    ON_CANCEL = "on_cancel"
    ON_FINISH = "on_finish"


class EventKind(StrEnum):
    """What happened. The first nine are the hook moments (see `HOOK_EVENTS`)."""

    RUN_STARTED = "run_started"
    REASONING_STARTED = "reasoning_started"
    REASONING_FINISHED = "reasoning_finished"
    PLANNING_STARTED = "planning_started"
    PLANNING_FINISHED = "planning_finished"
    EXECUTE_STARTED = "execute_started"
    EXECUTE_FINISHED = "execute_finished"
    RUN_CANCELLED = "run_cancelled"
    RUN_ENDED = "run_ended"
    STATE_CHANGED = "state_changed"
    TOOL_STARTED = "tool_started"
    TOOL_FINISHED = "tool_finished"
    TOOL_RETRY = "tool_retry"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_SETTLED = "approval_settled"
    MESSAGE_ACCEPTED = "message_accepted"
    MESSAGE_DELIVERED = "message_delivered"
    FINISH_REJECTED = "finish_rejected"
    CHECKPOINT = "checkpoint"
    ERROR = "error"
    SUBAGENT_STARTED = "subagent_started"
    SUBAGENT_FINISHED = "subagent_finished"
    MODEL_DELTA = "model_delta"
    """Live only (never stored): a piece of a streaming model call's text or tool calls."""
    CUSTOM = "custom"
    """An event of the tool's or agent's own (`ctx.emit`, `view.call.event`): `name`, `data`,
    and `live` (True: for live readers only; False: kept with the run's stored events)."""


HOOK_EVENTS: dict[EventKind, HookName] = {
    EventKind.RUN_STARTED: HookName.ON_START,
    EventKind.REASONING_STARTED: HookName.BEFORE_REASONING,
    EventKind.REASONING_FINISHED: HookName.AFTER_REASONING,
    EventKind.PLANNING_STARTED: HookName.BEFORE_PLANNING,
    EventKind.PLANNING_FINISHED: HookName.AFTER_PLANNING,
    EventKind.EXECUTE_STARTED: HookName.BEFORE_EXECUTE,
    EventKind.EXECUTE_FINISHED: HookName.AFTER_EXECUTE,
    EventKind.RUN_CANCELLED: HookName.ON_CANCEL,
    EventKind.RUN_ENDED: HookName.ON_FINISH,
}
"""Which hook fires for which event kind."""


class RunEvent(Record):
    """One event of a run, as `handle.events()` and hooks see it.

    Attributes:
        run_id: The run that emitted it (a child's id for events of a subagent).
        trace_id: The trace the run belongs to.
        seq: Position in the run's event stream, from 0.
        kind: What happened.
        phase: The runtime phase it belongs to, if any.
        at: Wall-clock seconds.
        data: Details (call ids, tools, states, errors), msgpack-able.
        parent_run_id: The parent run, for a subagent's events.
    """

    run_id: str
    trace_id: str
    seq: int
    kind: EventKind
    phase: Phase | None = None
    at: float = 0.0
    data: dict[str, Any] = Field(default_factory=dict)
    parent_run_id: str | None = None

    @property
    def hook(self) -> HookName | None:
        """The hook that fires for this event, if any."""
        return HOOK_EVENTS.get(self.kind)
