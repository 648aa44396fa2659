"""`RunOwnership`: a runtime's side of run ownership (docs/durability.md, "Ownership").

It holds the runtime's owner identity, its `LeaseKeeper` (renewals, adoption), the wake thread
that brings operations stored by other processes to the runs that live here, and the
run-addressed operations (`rt.send(run_id, ...)` and the others) for runs that live elsewhere.
The `Runtime` facade delegates here; a run that lives here is always served by its handle.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._engine.log import get_logger
from steerable.actors._stores.store import CheckpointStore, Lease, Owner
from steerable.protocol import (
    AgentError,
    ApprovalRequest,
    ErrorCode,
    RunOutcome,
    RunState,
    SteerableError,
    SteeringMode,
)

from .event_stream import EventStream
from .handle import RunHandle
from .leases import LeaseKeeper
from .messages import LeaseLost, LeaseRenewed
from .remote import RemoteOps, WakeWatcher
from .stored_events import ChangeSignal, PrefixedStream, StoredEventStream, Submit

if TYPE_CHECKING:
    from .directory import RunDirectory
    from .factory import Agent
    from .host import RunHost

__all__ = ["DEFAULT_LEASE_TTL", "RunOwnership"]

_log = get_logger("steerable.runtime")

_READ_BATCH = 1000  # stored events read per query by a follower

DEFAULT_LEASE_TTL = 5.0
"""Seconds a run's lease lasts unless renewed (docs/deployment.md)."""

Resume = Callable[[Lease, "Agent", float], RunHandle]


class RunOwnership:
    """Leases, adoption and run-addressed operations of one runtime.

    Args:
        store: The runtime's store.
        directory: Its live runs.
        host: Its supervisors' host (told of leases lost).
        wall: Its wall clock.
        agents: Its registered agents (adoption resumes runs of these only).
        ttl: The lease TTL.
        adopt: Whether orphaned runs are adopted.
        resume: Resumes a run this runtime just claimed (`lease`, agent, claim time).
    """

    def __init__(
        self,
        *,
        store: CheckpointStore,
        directory: RunDirectory,
        host: RunHost,
        wall: Callable[[], float],
        agents: dict[str, Agent],
        ttl: float,
        adopt: bool,
        resume: Resume,
    ) -> None:
        self.store = store
        self.directory = directory
        self.agents = agents
        self.owner = Owner.new()
        self._resume = resume
        self._logged: set[str] = set()
        self.leases = LeaseKeeper(
            store,
            self.owner,
            ttl,
            on_lost=self.lease_lost,
            on_renewed=self._lease_renewed,
            adopt=self._adopt if adopt else None,
        )
        host.leases = self.leases
        host.on_lease_lost = self.lease_lost
        self.remote = RemoteOps(directory, directory.cancel_now, wall)
        # The store's own wake thread if it has one (PostgreSQL: LISTEN/NOTIFY), else one that
        # watches its change counter (SQLite: PRAGMA data_version).
        watch = getattr(store, "watch", None)
        change_counter = getattr(store, "change_counter", None)
        self.changes: ChangeSignal | None = ChangeSignal()
        """Told each time the store changed (followers of stored events wake on it)."""
        self._watcher: Any = None
        if callable(watch):
            self._watcher = watch(self._store_changed)
        elif callable(change_counter):
            self._watcher = WakeWatcher(store, self._store_changed)
        else:
            self.changes = None
        self.closed = False

    def _store_changed(self) -> None:
        self.remote.pickup()
        if self.changes is not None:
            self.changes.notify()

    # ------------------------------------------------------------------ leases

    def lease_lost(self, run_id: str) -> None:
        """Another runtime owns the run now: stop it here at once (any thread)."""
        self.leases.forget(run_id)
        entry = self.directory.get(run_id)
        if entry is None:
            return
        with entry.cell.lock:
            ref = entry.ref
            if ref is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(LeaseLost())
                    return
        self.directory.fenced_parked(entry)

    def _lease_renewed(self, run_id: str) -> None:
        entry = self.directory.get(run_id)
        ref = None if entry is None else entry.ref
        if ref is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(LeaseRenewed())

    def absorb(self, run_id: str) -> None:
        """Operations stored for the run while another owner held it enter its inbox now."""
        absorb = getattr(self.store, "absorb_ops", None)
        if absorb is not None:
            absorb(run_id)

    def _adopt(self) -> None:
        """Claim and resume orphaned runs whose agent is registered (the keeper's thread)."""
        if self.closed:
            return
        started = time.monotonic()
        leases, left = self.store.claim_orphans(self.owner, self.leases.ttl, frozenset(self.agents))
        for run_id, agent in left:
            if run_id not in self._logged:
                self._logged.add(run_id)
                _log.info("orphan_not_adopted", run_id=run_id, agent=agent, why="agent unknown")
        for lease in leases:
            try:
                self._resume(lease, self.agents[lease.agent], started)
                _log.info("run_adopted", run_id=lease.run_id, epoch=lease.epoch)
            except Exception:  # noqa: BLE001 - one bad run must not stop adoption of others
                _log.warning("adoption_failed", run_id=lease.run_id, exc_info=True)
                self.leases.release(lease.run_id)

    def stop_watching(self, timeout: float) -> None:
        """Stop taking operations from other processes (shutdown: they wait for the next
        owner) and adopting."""
        self.closed = True
        if self._watcher is not None:
            self._watcher.stop(timeout)

    def stop(self, timeout: float) -> None:
        """Stop renewing and release every lease still held (parked runs): another process
        may take them at once."""
        self.leases.stop(timeout)
        for run_id in self.leases.tracked():
            self.leases.release(run_id)

    # ------------------------------------------------------------------ run-addressed

    def _live(self, run_id: str) -> RunHandle | None:
        entry = self.directory.get(run_id)
        return None if entry is None else RunHandle(self.directory, entry.cell)

    def send(
        self,
        run_id: str,
        content: str,
        mode: SteeringMode | str | None,
        message_id: str | None,
        timeout: float,
    ) -> int:
        """`Runtime.send`."""
        handle = self._live(run_id)
        if handle is not None:
            return handle.send(content, mode, message_id=message_id)
        try:
            steering = SteeringMode(mode) if mode is not None else SteeringMode.QUEUE
        except ValueError:
            raise ValueError(f"mode must be 'queue' or 'interrupt', not {mode!r}") from None
        if not isinstance(content, str):
            raise TypeError(f"content must be a str, not {type(content).__name__}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"content is not valid Unicode text: {exc.reason}") from None
        message = self.remote.user_message(content, steering)
        seq = self.remote.submit(run_id, message, message_id, timeout)
        if seq < 0:
            raise RemoteOps.ended(run_id, RunState.FINISHED)
        return seq

    def cancel(self, run_id: str, reason: str, timeout: float) -> bool:
        """`Runtime.cancel`."""
        handle = self._live(run_id)
        if handle is not None:
            return handle.cancel(reason)
        try:
            seq = self.remote.submit(run_id, self.remote.cancel_request(reason), None, timeout)
        except SteerableError as exc:
            if exc.code is ErrorCode.RUN_ENDED:
                return False
            raise
        return seq >= 0

    def decide(
        self, run_id: str, call_id: str, approved: bool, reason: str, timeout: float
    ) -> bool:
        """`Runtime.approve` and `Runtime.deny`."""
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, not {type(reason).__name__}")
        handle = self._live(run_id)
        if handle is not None:
            return handle.approve(call_id) if approved else handle.deny(call_id, reason)
        try:
            if call_id not in {a.call_id for a in self.remote.pending_approvals(run_id)}:
                return False
            decision = self.remote.decision(call_id, approved, reason)
            return self.remote.submit(run_id, decision, None, timeout) >= 0
        except SteerableError as exc:
            if exc.code is ErrorCode.RUN_ENDED:
                return False
            raise

    def pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        """`Runtime.pending_approvals`."""
        handle = self._live(run_id)
        if handle is not None:
            return handle.pending_approvals()
        return self.remote.pending_approvals(run_id)

    def state(self, run_id: str) -> RunState:
        """`Runtime.state`."""
        handle = self._live(run_id)
        if handle is not None:
            return handle.state
        return self.store.load(run_id).snapshot.state

    def outcome(self, run_id: str, timeout: float | None) -> RunOutcome:
        """`Runtime.outcome`."""
        handle = self._live(run_id)
        if handle is not None:
            return handle.result(timeout)
        return self.remote.stored_outcome(run_id, timeout)

    def events(
        self, run_id: str, start: int, timeout: float | None, submit: Submit
    ) -> EventStream | StoredEventStream | PrefixedStream:
        """`Runtime.events`: live here (with the stored events before this process's history
        in front), else replayed from the store and followed (docs/durability.md)."""
        store = self.store
        entry = self.directory.get(run_id)
        if entry is not None:
            cell = entry.cell
            live = RunHandle(self.directory, cell).events(start, timeout)
            first = cell.events.first_seq
            root = cell.events.stored_as
            if start >= first or not root or not store.stores_events:
                return live
            prefix = [
                e
                for e in store.events(root, start, first - start)
                if e.seq < first and (cell.owns_events or e.run_id == run_id)
            ]
            live = RunHandle(self.directory, cell).events(first, timeout)
            return PrefixedStream(prefix, live)
        snap = store.load(run_id).snapshot  # not_found for an unknown run
        root = run_id
        parent = snap.parent_run_id
        while parent is not None:
            root = parent
            parent = store.load(parent).snapshot.parent_run_id
        if not store.stores_events:
            raise SteerableError(
                AgentError.of(
                    ErrorCode.NOT_FOUND,
                    f"run {run_id} does not live in this runtime and its store keeps no events",
                    run_id=run_id,
                )
            )
        state_of = getattr(store, "run_state", None)

        def terminal() -> bool:
            if callable(state_of):
                return bool(state_of(run_id).is_terminal)
            return store.load(run_id).snapshot.state.is_terminal

        return StoredEventStream(
            lambda seq: store.events(root, seq, _READ_BATCH),
            terminal,
            self.changes,
            submit,
            start,
            timeout,
            run_id,
            None if root == run_id else run_id,
        )
