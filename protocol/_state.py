"""Run states and the transitions allowed between them (R8)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TRANSITIONS", "RunState", "WaitingFor"]


class RunState(StrEnum):
    """The lifecycle state of a run. Terminal states are never left (R8)."""

    IDLE = "idle"
    """Created, not started."""
    RUNNING = "running"
    """The loop is deciding or executing."""
    WAITING = "waiting"
    """Parked on a person: a user message (AskUser) or an approval."""
    FINISHED = "finished"
    """Terminal: the agent's output was accepted (R9)."""
    EXHAUSTED = "exhausted"
    """Terminal: a budget ran out (R10)."""
    CANCELLED = "cancelled"
    """Terminal: cancelled by the host or a parent run (R18)."""
    ERROR = "error"
    """Terminal: the run cannot go on (invalid decision, agent failure, run timeout...)."""

    @property
    def is_terminal(self) -> bool:
        """Whether no transition leaves this state."""
        return self in _TERMINAL


class WaitingFor(StrEnum):
    """What a WAITING run waits for."""

    USER = "user"
    APPROVAL = "approval"


_TERMINAL = frozenset({RunState.FINISHED, RunState.EXHAUSTED, RunState.CANCELLED, RunState.ERROR})

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.IDLE: frozenset({RunState.RUNNING, RunState.WAITING, *_TERMINAL}),
    RunState.RUNNING: frozenset({RunState.WAITING, *_TERMINAL}),
    RunState.WAITING: frozenset({RunState.RUNNING, *_TERMINAL}),
    RunState.FINISHED: frozenset(),
    RunState.EXHAUSTED: frozenset(),
    RunState.CANCELLED: frozenset(),
    RunState.ERROR: frozenset(),
}
"""The allowed transitions, as data: `TRANSITIONS[a]` holds every state `a` may move to."""
