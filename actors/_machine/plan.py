"""The current plan of a run: its calls, in step order, and what is derived from them.

`PlanState` owns the list of calls and the plan's flags; the number of calls running is
derived from the calls' statuses (a call is running from its dispatch until its result, retry
waits included), never kept by hand. Its writers are its own methods, called by the machine.
"""

from __future__ import annotations

from steerable.protocol import CallStatus

from .base import Call

__all__ = ["PlanState"]


class PlanState:
    """The calls of the plan being executed (empty between plans)."""

    __slots__ = ("calls", "exec_started", "interrupting")

    def __init__(self) -> None:
        self.calls: list[Call] = []
        """Step order. Written by `begin`, `restore` and `clear`."""
        self.interrupting = False
        """An interrupting message cancelled the plan. Written by `begin`, `interrupt`, `clear`."""
        self.exec_started = 0.0
        """When execution (re)started: the execute phase's clock. Written by `begin`, `resumed`."""

    @property
    def running(self) -> int:
        """Calls dispatched (or started as children) and not yet done, retry waits included."""
        n = 0
        for call in self.calls:
            if call.status is CallStatus.RUNNING:
                n += 1
        return n

    def begin(self, calls: list[Call], now: float) -> None:
        """A new plan: its calls are keyed and checkpointed; execution starts at `now`."""
        self.calls = calls
        self.interrupting = False
        self.exec_started = now

    def restore(self, calls: list[Call]) -> None:
        """The plan of a restored checkpoint (its execution restarts at `resumed`)."""
        self.calls = calls

    def resumed(self, now: float) -> None:
        """Execution of a restored plan restarts at `now`."""
        self.exec_started = now

    def interrupt(self) -> None:
        """An interrupting message: nothing more is dispatched."""
        self.interrupting = True

    def clear(self) -> None:
        """The plan is complete: its results are in the transcript."""
        self.calls = []
        self.interrupting = False

    def find(self, call_id: str) -> Call | None:
        """The call `call_id` of this plan, if any."""
        for call in self.calls:
            if call.call_id == call_id:
                return call
        return None

    def pending_approvals(self) -> list[Call]:
        """Calls waiting for a person."""
        return [c for c in self.calls if c.status is CallStatus.AWAITING_APPROVAL]

    def all_done(self) -> bool:
        """Whether every call has its result."""
        return all(c.status is CallStatus.DONE for c in self.calls)
