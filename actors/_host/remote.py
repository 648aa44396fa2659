"""Run-addressed operations: steer, cancel and approve a run wherever it lives.

`rt.send(run_id, ...)` and the others work the same whether the run lives in this runtime
(then they are `handle.*`), in another process sharing the store, or nowhere (parked,
orphaned). For a run elsewhere the operation is stored first (`submit_op`): straight into the
inbox when nobody holds the run's lease (its next owner reads it on claim), else as a pending
operation its owner takes into the inbox, in order, exactly once. The owner learns of it from
the wake thread: one per runtime, watching the store's change counter (`PRAGMA data_version`
for SQLite) every `WAKE_INTERVAL` seconds (docs/durability.md, "Steering from any process").
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.log import get_logger
from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    ApprovalRequest,
    CallStatus,
    CancelRequest,
    ErrorCode,
    HostMessage,
    RunOutcome,
    RunState,
    SteerableError,
    SteeringMode,
    UserMessage,
)

if TYPE_CHECKING:
    from .directory import RunDirectory, RunEntry

__all__ = ["WAKE_INTERVAL", "RemoteOps", "WakeWatcher"]

_log = get_logger("steerable.remote")

WAKE_INTERVAL = 0.005
"""Seconds between two reads of the store's change counter by the wake thread."""


class WakeWatcher:
    """One thread that calls `on_change()` when the store's change counter moves."""

    def __init__(self, store: Any, on_change: Callable[[], None]) -> None:
        self._store = store
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="steerable-wake", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last = None
        while not self._stop.wait(WAKE_INTERVAL):
            try:
                counter = self._store.change_counter()
                if counter != last:
                    last = counter
                    self._on_change()
            except Exception:  # noqa: BLE001 - retried at the next interval
                _log.warning("wake_check_failed", exc_info=True)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread."""
        self._stop.set()
        self._thread.join(timeout)


def _ended(run_id: str, state: RunState) -> SteerableError:
    return SteerableError(
        AgentError.of(
            ErrorCode.RUN_ENDED,
            f"run {run_id} is {state.value}; nothing more can be sent to it",
            run_id=run_id,
            state=state.value,
        )
    )


class RemoteOps:
    """The owner's side (taking operations into live runs) and the sender's side (storing
    operations for runs elsewhere, waiting for their seq)."""

    def __init__(
        self,
        directory: RunDirectory,
        cancel_now: Callable[[Any, str], None],
        wall: Callable[[], float],
    ) -> None:
        self.directory = directory
        self.store: Any = directory.store
        self._cancel_now = cancel_now
        self._wall = wall
        self._lock = threading.Lock()  # one pickup at a time: ops enter in op order
        self.enabled = callable(getattr(self.store, "submit_op", None))

    # ------------------------------------------------------------------ owner side

    def pickup(self) -> None:
        """Take every pending operation of a run that lives here into its inbox."""
        with self._lock:
            live = {e.cell.run_id for e in self.directory.entries()}
            if not live:
                return
            for op_id, run_id, message, message_id in self.store.open_ops(live):
                entry = self.directory.get(run_id)
                if entry is not None:
                    self._take(entry, op_id, message, message_id)

    def _take(
        self, entry: RunEntry, op_id: int, message: HostMessage, message_id: str | None
    ) -> None:
        cell = entry.cell
        run_id = cell.run_id
        if cell.state.is_terminal or (
            isinstance(message, ApprovalDecision) and not cell.claim_approval(message.call_id)
        ):
            self.store.settle_op(op_id, run_id, None, None)
            return
        if isinstance(message, CancelRequest):
            with cell.lock:
                refused = cell.cancel_requested
                cell.cancel_requested = True
            if refused:
                self.store.settle_op(op_id, run_id, None, None)
                return
            self._cancel_now(cell, message.reason)
            cell.scope.cancel(message.reason)

        def build(seq: int) -> HostMessage:
            return message.model_copy(update={"seq": seq})

        settled = False

        def store_it(m: HostMessage) -> None:
            nonlocal settled
            self.store.settle_op(op_id, run_id, m, message_id)
            settled = True

        try:
            message = self.directory.post(cell, build, store_it, message_id=message_id)
        except SteerableError:
            self.store.settle_op(op_id, run_id, None, None)
            return
        if not settled:  # its message_id was accepted here before: the first one's seq
            with contextlib.suppress(SteerableError):  # fenced: the run's owner settles it
                self.store.settle_op(op_id, run_id, message, message_id, stored=True)

    # ------------------------------------------------------------------ sender side

    def submit(
        self, run_id: str, message: HostMessage, message_id: str | None, timeout: float
    ) -> int:
        """Store `message` for a run that does not live here; its seq (-1: refused)."""
        if not self.enabled:
            raise SteerableError(
                AgentError.of(
                    ErrorCode.NOT_FOUND,
                    f"run {run_id} does not live in this runtime and its store cannot reach "
                    "another process",
                    run_id=run_id,
                )
            )
        op_id, seq = self.store.submit_op(run_id, message, message_id)
        deadline = time.monotonic() + timeout
        while seq is None:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {run_id}'s owner did not take the operation within {timeout}s; "
                    "it is stored and reaches the run when its owner (or the next) reads it"
                )
            threading.Event().wait(WAKE_INTERVAL)
            seq = self.store.op_seq(op_id)
        return int(seq)

    def user_message(self, content: str, mode: SteeringMode) -> UserMessage:
        """A user message for `submit` (its seq is given by whoever stores it)."""
        return UserMessage(seq=0, content=content, mode=mode, at=self._wall())

    def cancel_request(self, reason: str) -> CancelRequest:
        """A cancel for `submit`."""
        return CancelRequest(seq=0, reason=reason, at=self._wall())

    def decision(self, call_id: str, approved: bool, reason: str) -> ApprovalDecision:
        """An approval decision for `submit`."""
        return ApprovalDecision(
            seq=0, call_id=call_id, approved=approved, reason=reason, at=self._wall()
        )

    def pending_approvals(self, run_id: str) -> list[ApprovalRequest]:
        """A stored run's calls waiting for approval, less those a stored decision settles."""
        stored = self.store.load(run_id)
        decided = {m.call_id for m in stored.messages if isinstance(m, ApprovalDecision)}
        return [
            ApprovalRequest(call_id=c.call_id, tool=c.name, arguments=c.arguments, run_id=run_id)
            for c in stored.snapshot.plan
            if c.status is CallStatus.AWAITING_APPROVAL and c.call_id not in decided
        ]

    def stored_outcome(self, run_id: str, timeout: float | None) -> RunOutcome:
        """Wait (following the store) until a run that lives elsewhere is terminal."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            snap = self.store.load(run_id).snapshot
            if snap.state.is_terminal:
                return RunOutcome(
                    run_id=run_id,
                    state=snap.state,
                    output=snap.output,
                    errors=snap.errors,
                    metrics=snap.metrics,
                    revision=snap.revision,
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not end within {timeout}s")
            threading.Event().wait(WAKE_INTERVAL * 10)

    ended = staticmethod(_ended)
