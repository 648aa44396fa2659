"""`RunCell`: what a run's supervisor publishes and its handles read, without asking the actor.

The host never `ask`s a supervisor (docs/pykka.md T2): state, revision, pending approvals and the
outcome are published here by the supervisor's thread and read from any thread. The cell
also serialises host messages: the inbox `seq` is assigned, the message stored, and the actor
told under one lock, so messages reach the run in `seq` order (R20).
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
from collections.abc import Callable

from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.flag import LazyEvent
from steerable.actors._engine.gil import hand_over
from steerable.protocol import (
    AgentError,
    ApprovalRequest,
    HostMessage,
    RunOutcome,
    RunState,
)

from .events import EventLog

__all__ = ["RunCell"]


class RunCell:
    """The shared, thread-safe face of one run.

    Args:
        run_id: The run.
        trace_id: Its trace.
        parent_run_id: Its parent, for a subagent.
        events: Its event log (a child shares its root's log).
        next_seq: The next inbox seq (a resumed run continues after its last one).
    """

    def __init__(
        self,
        run_id: str,
        trace_id: str,
        parent_run_id: str | None,
        events: EventLog,
        next_seq: int = 0,
        *,
        parent_scope: CancelScope | None = None,
    ) -> None:
        self.run_id = run_id
        self.trace_id = trace_id
        self.parent_run_id = parent_run_id
        self.events = events
        # A child's scope hangs under its parent's: cancelling a run reaches its whole tree
        # at once (R18); the tree's root owns the event stream and closes it.
        self.scope = CancelScope() if parent_scope is None else parent_scope.child()
        self.owns_events = parent_run_id is None
        self._on_settle: list[Callable[[RunOutcome], None]] = []
        self.state = RunState.IDLE
        self.revision = -1
        self.future: concurrent.futures.Future[RunOutcome] = concurrent.futures.Future()
        self.awaited = False
        """Set when the host waits for the outcome (`result()`, `await wait()`): the thread
        that settles the run then hands the GIL to it before its own teardown."""
        self.lock = threading.Lock()
        self.next_seq = next_seq
        self.message_ids: dict[str, int] = {}
        """Caller-chosen message ids accepted here, with their seqs (one message per id)."""
        self.cancel_requested = False
        # Lazy: most runs never have a sender waiting for their first checkpoint.
        self.stored: threading.Event = LazyEvent()
        """Set once the store holds a revision of this run, or gave up a write of it (a
        durable `send()` waits for it)."""
        self.store_error: AgentError | None = None
        """Set (once) when the store gave up a write of this run: sends are refused with it."""
        self._approvals: dict[str, ApprovalRequest] = {}
        # Approved or denied by the host, not yet settled by the run: a resumed run announces
        # its restored approvals again after resume() returned (and a host may already have
        # answered them); that announcement must not bring them back.
        self._answered: set[str] = set()
        self._approvals_open = True
        self.epoch = 0
        """The lease epoch this runtime holds the run at (0: a store without ownership)."""
        self.lease_deadline = math.inf
        """Monotonic time until which the lease is surely held; past it no tool starts."""
        self.lease_wait = False
        """A tool waits for a lease renewal (set by the supervisor, cleared by the keeper)."""

    # --------------------------------------------------------------- host side

    def accept(
        self,
        build: Callable[[int], HostMessage],
        deliver: Callable[[HostMessage], None],
        message_id: str | None = None,
        known: Callable[[], int | None] | None = None,
    ) -> HostMessage:
        """Assign the next seq, build the message, store and deliver it, all in order.

        With a `message_id` seen before (here, or stored: `known()`), nothing is delivered:
        the message is built with the first one's seq and returned.
        """
        with self.lock:
            if message_id is not None:
                seq = self.message_ids.get(message_id)
                if seq is None and known is not None:
                    seq = known()
                if seq is not None:
                    self.message_ids[message_id] = seq
                    return build(seq)
            message = build(self.next_seq)
            deliver(message)
            self.next_seq += 1
            if message_id is not None:
                self.message_ids[message_id] = message.seq
            return message

    def claim_approval(self, call_id: str) -> ApprovalRequest | None:
        """Take a pending approval out of the table; the request for exactly one caller."""
        with self.lock:
            request = self._approvals.pop(call_id, None)
            if request is not None:
                self._answered.add(call_id)
            return request

    def unclaim_approval(self, request: ApprovalRequest) -> None:
        """Put back an approval whose decision could not be posted (it is still pending)."""
        with self.lock:
            self._answered.discard(request.call_id)
            if self._approvals_open:
                self._approvals.setdefault(request.call_id, request)

    def pending_approvals(self) -> list[ApprovalRequest]:
        """The calls waiting for a person, oldest first."""
        with self.lock:
            return list(self._approvals.values())

    # --------------------------------------------------------------- supervisor side

    def approval_requested(self, request: ApprovalRequest) -> None:
        """A call is parked for approval (or announced again by a resumed run)."""
        with self.lock:
            if self._approvals_open and request.call_id not in self._answered:
                self._approvals[request.call_id] = request

    def approval_settled(self, call_id: str) -> None:
        """A parked call was approved, denied or cancelled."""
        with self.lock:
            self._approvals.pop(call_id, None)
            self._answered.discard(call_id)

    def close_approvals(self) -> None:
        """The run ended: nothing can be approved any more."""
        with self.lock:
            self._approvals.clear()
            self._answered.clear()
            self._approvals_open = False

    def store_failed(self, error: AgentError) -> None:
        """The store gave up a write of this run (called on the store's writer thread)."""
        if self.store_error is None:
            self.store_error = error
        self.stored.set()  # whoever waits for a first revision learns it will not come

    def settle(self, outcome: RunOutcome) -> None:
        """Publish the outcome (once), tell who waits for it, close the event stream."""
        self.state = outcome.state
        self.revision = outcome.revision
        if self.future.done():
            return
        # The store has the run's last events (run_ended) before anyone learns the outcome;
        # a run that owns its log closes it below, so the store may keep the log's own.
        self.events.store_pending(final=self.owns_events)
        self.future.set_result(outcome)
        if self.awaited:
            hand_over()  # the host learns the outcome now, not after this run's teardown
        with self.lock:
            callbacks, self._on_settle = self._on_settle, []
        for callback in callbacks:
            callback(outcome)
        if self.owns_events:
            self.events.close()
        self.scope.detach()

    def on_settle(self, callback: Callable[[RunOutcome], None]) -> None:
        """Call `callback(outcome)` when the run settles (at once if it has)."""
        with self.lock:
            if not self.future.done():
                self._on_settle.append(callback)
                return
        callback(self.future.result())

    def fail(self, error: AgentError) -> RunOutcome:
        """Last resort after a defect: settle the host's future with an ERROR outcome."""
        outcome = RunOutcome(
            run_id=self.run_id, state=RunState.ERROR, errors=(error,), revision=self.revision
        )
        self.settle(outcome)
        return outcome
