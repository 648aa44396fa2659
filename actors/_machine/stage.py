"""Where a run's loop stands (finer than `RunState`), and the moves between stages.

`STAGE_TRANSITIONS` lists every move the machine may make; `RunMachine._enter` is the one
writer of the stage and checks each move against it, as `RunState` moves are checked against
`steerable.protocol._state.TRANSITIONS`. Staying in a stage is not a move (a no-op).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["STAGE_SUCCESSORS", "STAGE_TRANSITIONS", "Stage", "check_stage"]


class Stage(Enum):
    """Where the loop stands."""

    IDLE = 0
    """Between steps: at a safe boundary, or waiting for a model retry."""
    REASONING = 1
    """A model call is in flight."""
    EXECUTING = 2
    """A plan's calls run (or wait for approval)."""
    WAITING_USER = 3
    """The agent asked the user a question."""
    CANCELLING = 4
    """A cancel was accepted; in-flight work is given `cancel_grace` to stop."""
    DONE = 5
    """Terminal."""


STAGE_TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    # IDLE -> EXECUTING / WAITING_USER: a resume re-enters the stage its checkpoint stood in.
    Stage.IDLE: frozenset(
        {Stage.REASONING, Stage.EXECUTING, Stage.WAITING_USER, Stage.CANCELLING, Stage.DONE}
    ),
    Stage.REASONING: frozenset(
        {Stage.IDLE, Stage.EXECUTING, Stage.WAITING_USER, Stage.CANCELLING, Stage.DONE}
    ),
    Stage.EXECUTING: frozenset({Stage.IDLE, Stage.CANCELLING, Stage.DONE}),
    Stage.WAITING_USER: frozenset({Stage.IDLE, Stage.CANCELLING, Stage.DONE}),
    Stage.CANCELLING: frozenset({Stage.DONE}),  # a cancel is final
    Stage.DONE: frozenset(),
}


STAGE_SUCCESSORS = [
    tuple(STAGE_TRANSITIONS[stage]) for stage in sorted(Stage, key=lambda s: s.value)
]
"""`STAGE_TRANSITIONS` by stage value, as tuples: the check runs a few times per step, and an
`Enum` member's hash and `.value` are Python calls (`_value_` is its plain attribute; a
tuple's `in` compares by identity first)."""


def check_stage(current: Stage, new: Stage) -> None:
    """Raise `RuntimeError` (a defect: the supervisor ends the run) on an illegal move."""
    if new is not current and new not in STAGE_SUCCESSORS[current._value_]:
        raise RuntimeError(f"illegal stage move {current.name} -> {new.name}")
