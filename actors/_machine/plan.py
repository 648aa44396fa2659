"""The current plan of a run: its calls, their statuses, and what is derived from them.

`PlanState` is the one writer of every `Call` in a plan. The counts of running and finished
calls are kept by the status changes it makes (`_move`), never scanned and never kept by hand
elsewhere: a plan's cost stays linear in its steps (docs/reliability.md, "Hostile values").
Calls are found by id through an index, and dispatching resumes from a cursor before which
no call is pending.
"""

from __future__ import annotations

from collections.abc import Iterable

from steerable.protocol import (
    CallStatus,
    DecisionEntry,
    Plan,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)

from .base import MODEL_KEY, PLAN_KEY, RUN_KEY, Call

__all__ = ["PlanState"]

_RESERVED_KEYS = frozenset({MODEL_KEY, RUN_KEY, PLAN_KEY, "hooks"})
"""Work and timer keys of the run itself: never a call id."""

_RUNNING = CallStatus.RUNNING
_DONE = CallStatus.DONE
_PENDING = CallStatus.PENDING
_AWAITING = CallStatus.AWAITING_APPROVAL


class PlanState:
    """The calls of the current plan (empty between plans) and their derived counts.

    Attributes:
        calls: The calls, in step order (read-only outside this class).
        running: How many calls are RUNNING (derived from the moves below).
        pending: How many calls are PENDING (likewise): nothing to dispatch while it is 0.
        interrupting: An interrupting message is stopping this plan.
    """

    __slots__ = (
        "_cursor",
        "_done",
        "_index",
        "_taken",
        "calls",
        "interrupting",
        "pending",
        "running",
    )

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.running = self.pending = 0
        self.interrupting = False
        self._done = 0
        self._index: dict[str, Call] = {}
        self._cursor = 0  # no call before it is pending
        self._taken: set[str] | None = None  # every call id the run used; see `taken`

    # ------------------------------------------------------------------ the plan as a whole

    def install(self, calls: list[Call]) -> None:
        """Make `calls` the current plan (their statuses as built or restored)."""
        running = done = pending = 0
        index: dict[str, Call] = {}
        for call in calls:
            index[call.call_id] = call
            status = call.status
            if status is _RUNNING:
                running += 1
            elif status is _DONE:
                done += 1
            elif status is _PENDING:
                pending += 1
        self.calls = calls
        self._index = index
        self.running = running
        self.pending = pending
        self._done = done
        self._cursor = 0
        self.interrupting = False

    def clear(self) -> None:
        """The plan is complete (or was never accepted): no current plan."""
        self.calls = []
        self._index = {}
        self.running = self.pending = self._done = self._cursor = 0
        self.interrupting = False

    def interrupt(self) -> None:
        """An interrupting message stops this plan: nothing more is dispatched."""
        self.interrupting = True

    @property
    def all_done(self) -> bool:
        """Whether every call of the plan has its result."""
        return self._done == len(self.calls)

    def find(self, call_id: str) -> Call | None:
        """The call of the current plan with this id, or None."""
        return self._index.get(call_id)

    def pending_approvals(self) -> list[Call]:
        """Calls waiting for a person."""
        return [c for c in self.calls if c.status is _AWAITING]

    def unfinished(self) -> list[Call]:
        """Calls without a result yet (a snapshot: completing them does not disturb it)."""
        return [c for c in self.calls if c.status is not _DONE]

    def running_calls(self) -> list[Call]:
        """Calls RUNNING now (a snapshot list)."""
        return [c for c in self.calls if c.status is _RUNNING] if self.running else []

    def work_in_flight(self) -> list[str]:
        """Work keys of the calls running on a worker (not waiting for a retry)."""
        if not self.running:
            return []
        return [c.call_id for c in self.calls if c.status is _RUNNING and not c.retry_pending]

    def next_pending(self) -> Call | None:
        """The first PENDING call, from the cursor on; None when none is left."""
        calls = self.calls
        i = self._cursor
        n = len(calls)
        while i < n:
            call = calls[i]
            if call.status is _PENDING:
                self._cursor = i
                return call
            i += 1
        self._cursor = i
        return None

    def taken(self, transcript: Iterable[TranscriptEntry], current: Plan) -> set[str]:
        """Every call id this run has used; built from the transcript once per machine.

        Built lazily so that a resumed or forked run (a new machine) knows the ids of its
        history without the checkpoint having to carry them; `current` is the decision
        being planned now (its own ids are not taken yet).
        """
        taken = self._taken
        if taken is None:
            taken = set(_RESERVED_KEYS)
            for entry in transcript:
                if isinstance(entry, ToolResult | SubagentResult):
                    taken.add(entry.call_id)
                elif (
                    isinstance(entry, DecisionEntry)
                    and isinstance(entry.decision, Plan)
                    and entry.decision is not current
                ):
                    taken.update(s.id for s in entry.decision.steps if s.id is not None)
            self._taken = taken
        return taken

    # ------------------------------------------------------------------ moves of one call

    def _move(self, call: Call, status: CallStatus) -> CallStatus:
        """The one place a call's status changes; the counts follow. Returns the old status."""
        old = call.status
        if old is status:
            return old
        call.status = status
        if old is _RUNNING:
            self.running -= 1
        elif old is _DONE:
            self._done -= 1
        elif old is _PENDING:
            self.pending -= 1
        if status is _RUNNING:
            self.running += 1
        elif status is _DONE:
            self._done += 1
        elif status is _PENDING:
            self.pending += 1
            self._cursor = 0  # a call before the cursor may be pending again
        return old

    def start(self, call: Call, now: float) -> bool:
        """Dispatch a PENDING call; True if it is the call's first start (a new step)."""
        self._move(call, _RUNNING)
        call.first_dispatch = now
        if call.counted:  # a re-dispatch after a crash is the same step (or the same child)
            return False
        call.counted = True
        return True

    def next_attempt(self, call: Call) -> int:
        """Begin the call's next attempt; returns its number (from 1)."""
        call.attempt += 1
        call.retry_pending = False
        return call.attempt

    def wait_for_retry(self, call: Call) -> None:
        """The current attempt ended; a retry timer will start the next."""
        call.retry_pending = True

    def finish(self, call: Call, result: ToolResult | SubagentResult) -> CallStatus:
        """The call has its result; returns the status it had."""
        call.retry_pending = False
        call.result = result
        return self._move(call, _DONE)

    def approve(self, call: Call) -> None:
        """A person approved the call: it may be dispatched."""
        call.needs_approval = False
        self._move(call, _PENDING)

    def stop(self, call: Call, reason: str) -> None:
        """The call was signalled to stop; its result will say so."""
        call.cancel_reason = reason

    def requeue(self, call: Call) -> None:
        """A call that runs in no process now (after a restart) waits to be dispatched again."""
        self._move(call, _PENDING)

    def assume_running(self, call: Call) -> None:
        """A restored call that may have started before the process stopped."""
        self._move(call, _RUNNING)

    def name_child(self, call: Call, child_run_id: str) -> None:
        """The child run a subagent call started."""
        call.child = child_run_id
