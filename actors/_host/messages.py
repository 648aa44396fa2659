"""The runtime's own messages to a run's actor (slotted dataclasses: cheap on the hot path).

A leaf module: the directory, the factory, the supervisors and the child-run link all name
these without importing one another. docs/architecture.md ("Messages") lists every message a
run's actor handles, these and the job reports of `jobs.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from steerable.actors._machine.effects import TimerKind
from steerable.actors._stores.lease import lease_lost
from steerable.protocol import AgentError, HostMessage, RunOutcome, SteerableError

__all__ = [
    "ALARM",
    "Alarm",
    "Begin",
    "CancelNow",
    "ChildDone",
    "HostMsg",
    "LeaseLost",
    "LeaseRenewed",
    "StoreFailed",
    "Stored",
    "TimerFired",
    "lease_lost_error",
]


@dataclass(slots=True)
class Begin:
    """Message: start the run, or resume a restored one with the messages stored since."""

    resume: bool = False
    messages: tuple[HostMessage, ...] = ()
    wake: bool = False


@dataclass(slots=True)
class HostMsg:
    """Message: a host message was accepted (and stored) for this run."""

    message: HostMessage


@dataclass(slots=True)
class TimerFired:
    """Message: a timer of this run fired."""

    kind: TimerKind
    key: str
    attempt: int


@dataclass(slots=True)
class Alarm:
    """Message: the run's alarm rang; the timers due by now fire (one heap entry per run)."""


ALARM = Alarm()
"""The one `Alarm` message (it carries nothing)."""


@dataclass(slots=True)
class Stored:
    """Message: the store holds revision `revision` of this run (committed)."""

    revision: int


@dataclass(slots=True)
class StoreFailed:
    """Message: the store gave up a write of this run (revision -1: a journal entry)."""

    revision: int
    error: AgentError


@dataclass(slots=True)
class CancelNow:
    """Message: the host is cancelling the run (ahead of its stored CancelRequest)."""

    reason: str


@dataclass(slots=True)
class LeaseLost:
    """Message: another runtime owns this run now; stop at once, writing nothing."""


@dataclass(slots=True)
class LeaseRenewed:
    """Message: the lease is still held; calls waiting for that may start."""


@dataclass(slots=True)
class ChildDone:
    """Message: the child run of subagent call `call_id` reached its terminal state."""

    call_id: str
    outcome: RunOutcome


def lease_lost_error(run_id: str, epoch: int) -> SteerableError:
    """What `result()` raises in a runtime whose run was taken over by another owner."""
    return lease_lost(run_id, epoch, "this process stopped it without writing")
