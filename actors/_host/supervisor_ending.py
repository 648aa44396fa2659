"""The supervisor's ending: events, checkpoints and the store's answers, hooks, the outcome.

Part of `RunSupervisor` (split from supervisor.py along its seam): the machine's effects
port for events, journal entries and checkpoints; what a stored or failed write does to the
run (docs/reliability.md, "Store faults"); the run's hooks, one job at a time, drained after
its outcome is published (docs/states-and-errors.md, "Phases and hooks").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from threading import get_ident
from typing import TYPE_CHECKING, Any

import pykka

from steerable.actors._machine.effects import TimerKind
from steerable.actors._machine.preview import preview
from steerable.protocol import (
    HOOK_EVENTS,
    AgentError,
    ApprovalRequest,
    EventKind,
    HookName,
    Phase,
    RunEvent,
    RunOutcome,
    RunState,
    SideEffect,
    SubagentResult,
    ToolResult,
    TranscriptEntry,
)

from .jobs import HookJob
from .messages import Stored, StoreFailed
from .supervisor_work import SupervisorWork

__all__ = ["InlineCommit", "SupervisorEnding"]


class InlineCommit:
    """Which thread commits a run's writes inside its handler (`commit_now`), and the
    latest revision that commit stored: what its `on_stored` callbacks record instead of
    telling the run `Stored` (shared with them, so they hold no reference to the run)."""

    __slots__ = ("revision", "thread")

    def __init__(self) -> None:
        self.thread: int | None = None
        self.revision = -1


# Enum members read per step as module constants: on Python 3.11 a read such as
# `EventKind.CHECKPOINT` goes through the enum metaclass's `__getattr__` hook
# (actors/_machine/members.py).
_RUN_ENDED = EventKind.RUN_ENDED
_APPROVAL_REQUESTED = EventKind.APPROVAL_REQUESTED
_APPROVAL_SETTLED = EventKind.APPROVAL_SETTLED
_CHECKPOINT = EventKind.CHECKPOINT
_NO_SIDE_EFFECT = SideEffect.NONE


class SupervisorEnding(SupervisorWork):
    """Events, checkpoints, hooks and the end of one run, for `RunSupervisor`."""

    hooks: Mapping[HookName, Sequence[Callable[[RunEvent], object]]]
    _ended: tuple[Phase | None, dict[str, Any]] | None
    _store_error: AgentError | None
    _journal_failed: Callable[[AgentError], None] | None
    _final_state: RunState | None
    _hooks_pending: int
    _wall: float
    _hook_jobs: list[HookJob]
    _outcome: RunOutcome | None
    _published: bool
    _draining: bool
    _inline_commit: InlineCommit

    if TYPE_CHECKING:  # provided by RunSupervisor (no stub shadows it at run time)

        @property
        def _log(self) -> Any: ...

    def _on_stored(self, message: Stored, now: float) -> None:
        self._stored = max(self._stored, message.revision)
        held, self._held = self._held, []
        for revision, job in held:
            if revision <= self._stored:
                self._start_call(self.tools[job.tool], job)
            else:
                self._held.append((revision, job))
        if self._held_decide is not None and self._held_decide[0] <= self._stored:
            args = self._held_decide[1]
            self._held_decide = None
            self._start_decide(*args)
        if self._ended is not None and self._stored >= self.cell.revision:
            phase, data = self._ended
            self._ended = None
            self._emit(EventKind.RUN_ENDED, phase, data)
            self._finish()

    def _on_store_failed(self, message: StoreFailed, now: float) -> None:
        """The store gave up a write: the run cannot go on without losing what it does.

        It ends in ERROR `store_unavailable` (at once: its work is abandoned), and writes
        nothing more; the store keeps the run's last stored revision, which a later
        `resume()` continues from. A terminal state whose checkpoint was not stored is
        reported as that error, never as the state the store does not hold.
        """
        if self._store_error is not None:
            return
        cause = message.error
        what = "a journal entry" if message.revision < 0 else f"revision {message.revision}"
        error = AgentError.of(
            cause.code,  # store_unavailable; internal_error for a write the codec refused
            f"the store could not keep {what} of run {self.cell.run_id}: {cause.message}",
            **{
                **cause.details,
                "run_id": self.cell.run_id,
                "revision": message.revision,
                "stored_revision": self._stored,
            },
        )
        self._store_error = error
        self._log.error("store_unavailable", revision=message.revision, error=cause.message)
        machine = self.machine
        if not machine.is_terminal:
            machine.abort(error)
            return
        outcome = self._outcome
        if self._ended is None or outcome is None:
            return  # its terminal revision was stored: this was a late journal entry
        self._ended = None
        self._outcome = outcome.model_copy(
            update={
                "state": RunState.ERROR,
                "output": None,
                "errors": (*outcome.errors, error),
                "revision": self._stored,
            }
        )
        self._final_state = self.cell.state = RunState.ERROR
        self._emit(EventKind.ERROR, None, {"code": error.code.value, "message": error.message})
        self._emit(
            EventKind.RUN_ENDED,
            None,
            {
                "state": RunState.ERROR.value,
                "error": error.code.value,
                "message": preview(error.message),
                "output": None,
                "revision": self._stored,
            },
        )
        self._finish()

    def emit(self, kind: EventKind, phase: Phase | None, data: dict[str, Any]) -> None:
        """Append to the event stream; fire the hooks of this moment on a hook worker.

        `run_ended` waits for the terminal checkpoint to be stored: hosts and `on_finish`
        hooks learn the state the store holds.
        """
        if not (
            kind is _RUN_ENDED
            or kind is _APPROVAL_REQUESTED
            or kind is _APPROVAL_SETTLED
            or self.hooks
        ):
            # Most events of most runs: to the log, with the rest of the step's (identity
            # tests: an enum's hash is a Python-level call).
            pending = self._step_events
            if pending is not None:
                pending.append((kind, phase, data))
                return
            cell = self.cell
            cell.events.append(cell.run_id, kind, phase, self._wall, data, cell.parent_run_id)
            return
        if (
            kind is _RUN_ENDED
            and self._durable
            and self._store_error is None
            and self._stored < self.cell.revision
        ):
            self._ended = (phase, data)
            return
        if kind is _RUN_ENDED and self._store_error is not None and "revision" in data:
            data = {**data, "revision": self._stored}  # what the store holds, as the outcome
        self._emit(kind, phase, data)

    def _emit(self, kind: EventKind, phase: Phase | None, data: dict[str, Any]) -> None:
        self._flush_events()  # hooks, approvals and the outcome see every earlier event
        cell = self.cell
        if kind is _APPROVAL_REQUESTED:
            cell.approval_requested(
                ApprovalRequest(
                    call_id=data["call_id"],
                    tool=data["tool"],
                    arguments=data["arguments"],
                    run_id=cell.run_id,
                )
            )
        elif kind is _APPROVAL_SETTLED:
            cell.approval_settled(data["call_id"])
        at = self._wall
        seq = cell.events.append(cell.run_id, kind, phase, at, data, cell.parent_run_id)
        hook = HOOK_EVENTS.get(kind) if self.hooks else None
        if hook is not None:
            callbacks = self.hooks.get(hook)
            if callbacks:
                # The run's own values: already valid, so no validation pass (as the feed).
                event = RunEvent.model_construct(
                    run_id=cell.run_id,
                    trace_id=cell.trace_id,
                    seq=seq,
                    kind=kind,
                    phase=phase,
                    at=at,
                    data=data,
                    parent_run_id=cell.parent_run_id,
                )
                job = HookJob(callbacks, event, self.actor_ref)
                # One hook job of this run at a time: its hooks stay in order while other
                # runs' hooks use other hook workers (a hung hook costs only its own run).
                self._hook_jobs.append(job)
                self._hooks_pending += 1
                if len(self._hook_jobs) == 1:
                    self._submit_hook()

    def journal(self, result: ToolResult | SubagentResult) -> None:
        """Store a result as it arrives (the durable inbox of tool results).

        Every store keeps it: a passivated run's finished calls live only here until the
        plan completes.
        """
        if self._store_error is not None:
            return
        on_failed = self._journal_failed
        if on_failed is None:
            on_failed = self._journal_failed = self._failure_callback(-1)
        store = self.services.store
        store.journal(self.cell.run_id, result, on_failed=on_failed)
        tool = self.tools.get(result.tool) if isinstance(result, ToolResult) else None
        if tool is None or tool.spec.side_effect is not _NO_SIDE_EFFECT:
            # What a write (or a child run) did is stored at once, not at the next checkpoint
            # or the writer's next poll (a store that queued it lazily, decision 0004): after
            # a crash, it is not done again.
            store.commit_soon()

    def _failure_callback(self, revision: int) -> Callable[[AgentError], None]:
        ref = self.actor_ref
        cell = self.cell

        def on_failed(error: AgentError) -> None:  # on the store's writer thread
            cell.store_failed(error)
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(StoreFailed(revision, error))

        return on_failed

    def checkpoint(
        self,
        revision: int,
        snapshot: dict[str, Any],
        entries_from: int,
        entries: list[TranscriptEntry],
    ) -> None:
        """Write one revision (a durable store encodes and writes on its own thread).

        Nothing is written once the store gave up a write of this run: a later revision
        would be stored on top of a missing one.
        """
        if self._store_error is not None:
            return
        snapshot["updated_at"] = self._wall
        store = self.services.store
        on_stored = None
        on_failed = None
        if store.durable:
            on_failed = self._failure_callback(revision)
            ref = self.actor_ref
            stored_event = self.cell.stored
            inline = self._inline_commit

            def on_stored() -> None:
                stored_event.set()
                if inline.thread == get_ident():
                    # Committed by the run's own thread inside its handler (`commit_now`):
                    # the handler goes on at once, with no `Stored` message to handle.
                    inline.revision = max(inline.revision, revision)
                    return
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(Stored(revision))
        else:
            self._stored = revision  # an in-process store has it once the call returns
            stored = self.cell.stored
            if not stored.is_set():  # set once: Event.set takes a lock and notifies
                stored.set()
        cell = self.cell
        cell.revision = revision
        store.write_checkpoint(
            cell.run_id, revision, snapshot, entries_from, entries, on_stored, on_failed=on_failed
        )
        data = {"revision": revision}
        pending = self._step_events
        if pending is not None:  # stamped `updated_at`, which is this step's `_wall`
            pending.append((_CHECKPOINT, None, data))
        else:
            cell.events.append(
                cell.run_id, _CHECKPOINT, None, snapshot["updated_at"], data,
                cell.parent_run_id,
            )  # fmt: skip

    def settled(self, outcome: RunOutcome) -> None:
        """Terminal: publish the outcome once its checkpoint is stored, never later: hooks
        still pending then (on_finish among them) run after it.

        The supervisor stays until they are done, or given up after `hook_timeout`, to keep
        them in order; their errors can no longer reach the published outcome and are logged
        (docs/states-and-errors.md "Phases and hooks").
        """
        if self._store_error is not None and outcome.revision > self._stored:
            # What the store holds: the run's last stored revision (-1: none).
            outcome = outcome.model_copy(update={"revision": self._stored})
        self._outcome = outcome
        self._flush_events()
        self.cell.state = outcome.state
        self.cell.close_approvals()
        self._finish()

    def _finish(self) -> None:
        if self._outcome is None or self._ended is not None:
            return  # not yet, or its checkpoint is still on its way to the store
        if self._hooks_pending:
            # Counted before the outcome is published: a host that returns from result()
            # and shuts down at once must find these hooks in the drain, not miss them.
            self.services.hooks_draining.enter()
            self._draining = True
        self._publish()
        if self._hooks_pending:
            at = self.services.clock.now() + self.services.hook_timeout
            self.schedule(TimerKind.GRACE, "hooks", 0, at)
        else:
            self.actor_ref.stop(block=False)  # queued: handled after this message

    # ------------------------------------------------------------------ hooks and ending

    def _submit_hook(self) -> None:
        while self._hook_jobs and not self.services.hook_pool.submit(self._hook_jobs[0]):
            self._hook_jobs.pop(0)  # the runtime is shutting down: the hook cannot run
            self._hooks_pending -= 1

    def _hook_done(self, errors: list[AgentError]) -> None:
        self._hooks_pending -= 1
        if self._hook_jobs:
            self._hook_jobs.pop(0)
            self._submit_hook()
        for error in errors:
            if self._published:
                self._log.warning(
                    "hook_error_after_end", error=error.message, hook=error.details.get("hook")
                )
                continue
            self._log.warning("hook_error", error=error.message)
            if self._outcome is None:
                self.machine.record_error(error)
            else:  # the outcome waits for its checkpoint to be stored: it can still say so
                self._outcome = self._outcome.model_copy(
                    update={"errors": (*self._outcome.errors, error)}
                )
        if self._published and self._hooks_pending <= 0:
            self.unschedule(TimerKind.GRACE, "hooks")
            self._drained()

    def _hooks_timed_out(self) -> None:
        if not self._published:
            return
        if self._hook_jobs:
            # Only the first is on a worker; the rest never started and are dropped.
            self.services.hook_pool.abandon(self._hook_jobs[0])
        self._log.warning(
            "hooks_abandoned_after_end",
            timeout=self.services.hook_timeout,
            pending=self._hooks_pending,
        )
        self._hooks_pending = 0
        self._hook_jobs.clear()
        self._drained()

    def _drained(self) -> None:
        if self._draining:
            self._draining = False
            self.services.hooks_draining.leave()
        self.actor_ref.stop(block=False)  # queued: handled after this message

    def _publish(self) -> None:
        outcome = self._outcome
        if outcome is None or self._ended is not None:
            return
        self._outcome = None
        self._published = True
        self._flush_events()  # a host that has the outcome has every event before it
        # Leave the directory first: once result() returns, the run is no longer live.
        self.services.host.run_ended(self.cell.run_id)
        self.cell.settle(outcome)
        self.outcome_published(outcome)

    def outcome_published(self, outcome: RunOutcome) -> None:
        """The run's outcome is settled on its cell. A top-level run tells nobody else."""
