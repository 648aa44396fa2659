"""`ChildRun`: the actor of a subagent's run, and `ChildLink`, its tie to the parent run.

A child run is a run like any other (docs/subagents.md), so `ChildRun` is a `RunSupervisor`;
what it adds is the link: the budget reserved for it from the parent's, its result going up as
a `ChildDone` message into the parent's inbox, and cancellation coming down from the parent's
cancel scope as a `CancelNow` into its own inbox, ahead of what its tools see.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from steerable.actors._machine.effects import ChildJob
from steerable.protocol import RunConfig, RunOutcome

from .messages import CancelNow, ChildDone
from .supervisor import RunSupervisor

__all__ = ["ChildLink", "ChildRun"]

_MIN_CHILD_SECONDS = 1e-3  # a child started with no time left still gets a deadline


@dataclass(frozen=True, slots=True)
class ChildLink:
    """What ties a child run to its parent.

    Attributes:
        parent_run_id: The parent run.
        job: The subagent call it answers, with the budget reserved for it when the parent
            planned the call (steps, model calls, tokens, seconds).
    """

    parent_run_id: str
    job: ChildJob

    @property
    def call_id(self) -> str:
        """The parent's subagent call this child answers."""
        return self.job.call_id

    def config(self, parent: RunConfig) -> RunConfig:
        """The child's `RunConfig`: the parent's policies, with the reserved budget."""
        job = self.job
        return parent.model_copy(
            update={
                "max_steps": job.max_steps,
                "max_model_calls": job.max_model_calls,
                "token_budget": job.token_budget,
                "total_timeout": None
                if job.seconds_left is None
                else max(job.seconds_left, _MIN_CHILD_SECONDS),
            }
        )

    def done(self, outcome: RunOutcome) -> ChildDone:
        """The message that takes `outcome` up into the parent's inbox."""
        return ChildDone(self.call_id, outcome)


class ChildRun(RunSupervisor):
    """The actor that owns a subagent's run: a `RunSupervisor` linked to its parent.

    Built by the runtime for every child run (started, resumed or woken from passivation).
    Its outcome goes up to the parent as a `ChildDone` message (the parent is woken if it is
    passivated); a cancel of the parent's scope reaches it as `CancelNow` before its own tools
    see the signal, so it records CANCELLED in order. Hosts steer it through
    `Runtime.handle(child_run_id)`, like any run.

    Args:
        link: The tie to the parent run.
        **kwargs: As for `RunSupervisor`.
    """

    def __init__(self, *, link: ChildLink, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.link = link
        self._unlink: Callable[[], None] | None = None

    @property
    def parent_run_id(self) -> str:
        """The parent run."""
        return self.link.parent_run_id

    def starting(self) -> None:
        """Listen for cancellation from above, before the first message is handled.

        The cell's scope hangs under the parent's; a scope runs its callbacks before it
        cancels its children, so the `CancelNow` is in this inbox before any tool of this run
        wakes on the signal (and, if the scope is cancelled already, it is told at once).
        """
        ref = self.actor_ref

        def cancelled(reason: str) -> None:
            with contextlib.suppress(pykka.ActorDeadError):  # ended or parked meanwhile
                ref.tell(CancelNow(reason))

        self._unlink = self.cell.scope.on_cancel(cancelled)

    def stopping(self) -> None:
        """Stop listening (a woken run's new actor listens itself), then stop as a run does."""
        if self._unlink is not None:
            self._unlink()
            self._unlink = None
        super().stopping()

    def outcome_published(self, outcome: RunOutcome) -> None:
        """Send the outcome up: the parent records it as the subagent call's result."""
        self.services.host.deliver(self.link.parent_run_id, self.link.done(outcome))
