"""`Runtime`'s run-addressed operations: steer, query and read any run by its id.

The base of `Runtime` (split from runtime.py along its seam): each operation reaches a run
wherever it lives, through `RunOwnership` (a run live here gets its handle; one another
process owns is reached through the store: docs/durability.md, "Steering from any
process"), and the store's reads (replay, revisions, unfinished runs, trees).
"""

from __future__ import annotations

from steerable.actors._stores.replay import Replay, replay_of
from steerable.actors._stores.store import CheckpointStore, RevisionInfo
from steerable.protocol import (
    AgentError,
    ApprovalRequest,
    ErrorCode,
    RunOutcome,
    RunState,
    SteerableError,
    SteeringMode,
)

from .directory import RunDirectory
from .event_stream import EventStream
from .handle import RunHandle
from .offload import HostIO
from .ownership import RunOwnership
from .runtrees import RunTree, build_tree
from .stored_events import PrefixedStream, StoredEventStream

__all__ = ["RunAddressing"]


class RunAddressing:
    """Operations on a run by id, for `Runtime` (which builds the parts they use)."""

    store: CheckpointStore
    directory: RunDirectory
    ownership: RunOwnership
    host_io: HostIO

    def send(
        self,
        run_id: str,
        content: str,
        mode: SteeringMode | str | None = None,
        message_id: str | None = None,
        *,
        timeout: float = 10.0,
    ) -> int:
        """Send a user message to a run wherever it lives; returns its inbox `seq`.

        A run that lives here gets `handle.send`. For a run another process owns, the
        message is stored, then this waits up to `timeout` for the owner to give it its seq;
        a run nobody holds gets it in its inbox for its next owner. `message_id` makes a
        retried send one message (for a run that does not live here: docs/durability.md).

        Raises:
            SteerableError: `not_found` (unknown run), `run_ended` (terminal run).
            ValueError: as `RunHandle.send`.
            TimeoutError: the owner did not take it within `timeout` (it stays stored).
        """
        return self.ownership.send(run_id, content, mode, message_id, timeout)

    def cancel(self, run_id: str, reason: str = "cancelled", *, timeout: float = 10.0) -> bool:
        """Cancel a run wherever it lives; False if it is terminal or already cancelling.

        Raises:
            SteerableError: `not_found` for an unknown run.
        """
        return self.ownership.cancel(run_id, reason, timeout)

    def approve(self, run_id: str, call_id: str, *, timeout: float = 10.0) -> bool:
        """Approve a pending call of a run wherever it lives; True if it settled one."""
        return self.ownership.decide(run_id, call_id, True, "", timeout)

    def deny(self, run_id: str, call_id: str, reason: str = "", *, timeout: float = 10.0) -> bool:
        """Deny a pending call of a run wherever it lives; True if it settled one."""
        return self.ownership.decide(run_id, call_id, False, reason, timeout)

    def pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        """The calls of a run (wherever it lives) waiting for a person's approval."""
        return self.ownership.pending_approvals(run_id)

    def state(self, run_id: str) -> RunState:
        """A run's state: live here, else as last stored (`not_found` if unknown)."""
        return self.ownership.state(run_id)

    def outcome(self, run_id: str, timeout: float | None = None) -> RunOutcome:
        """Wait for a run's outcome wherever it lives (following the store if elsewhere).

        Raises:
            TimeoutError: not terminal within `timeout`.
            SteerableError: `not_found`; `run_owned` if this runtime lost it to another.
        """
        return self.ownership.outcome(run_id, timeout)

    def events(
        self, run_id: str, start: int = 0, timeout: float | None = None
    ) -> EventStream | StoredEventStream | PrefixedStream:
        """A run's events from seq `start`, wherever it lives (`for` and `async for`).

        A run that lives here streams as `handle.events()` (a resumed run's stored events
        before this process come first). Otherwise its stored events are replayed, then
        followed as they are stored, until its `run_ended` (docs/durability.md, "Stored
        events"). `timeout` bounds the wait for one event (`TimeoutError`).

        Raises:
            SteerableError: `not_found` for a run the store does not know (or a run that
                does not live here, with a store that keeps no events).
        """
        return self.ownership.events(run_id, start, timeout, self.host_io.submit)

    def replay(self, run_id: str, revision: int | None = None) -> Replay:
        """A run's transcript and events up to `revision` (default: the latest), read-only.

        Nothing is executed: no agent, tool or hook is called (R23).
        """
        return replay_of(self.store.load(run_id, revision))

    def revisions(self, run_id: str) -> list[RevisionInfo]:
        """Every stored revision of a run, oldest first."""
        return self.store.revisions(run_id)

    def unfinished(self) -> list[str]:
        """Ids of stored runs that are not terminal and not live here (candidates to resume)."""
        return [
            r.run_id
            for r in self.store.runs()
            if not r.state.is_terminal and self.directory.get(r.run_id) is None
        ]

    def tree(self, run_id: str) -> RunTree:
        """A run and its subagents, recursively, each with its current state.

        Built from the store (every run checkpoints at its boundaries) and the live runs here.

        Raises:
            SteerableError: `not_found` if neither knows the run.
        """
        return build_tree(self.store, self.directory, run_id)

    def handle(self, run_id: str) -> RunHandle:
        """A handle on a live run (active or passivated).

        Raises:
            SteerableError: code `not_found` if no live run has this id.
        """
        entry = self.directory.get(run_id)
        if entry is None:
            raise SteerableError(
                AgentError.of(ErrorCode.NOT_FOUND, f"no live run {run_id!r}", run_id=run_id)
            )
        return RunHandle(self.directory, entry.cell)
