"""Persistence of the run machine: checkpoints at safe boundaries, the outcome, and the
restore/resume of a run from a stored checkpoint (R21, R3: same run id, revision + 1).

`Persistence` owns the revision and what only checkpoints and resumes use (the transcript
length already stored, the parked revision, the resume's state). It reads the run through
the machine and its parts, and acts through the machine's narrow interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from steerable.protocol import (
    CallStatus,
    DecisionEntry,
    EventKind,
    ForkOrigin,
    HostMessage,
    Phase,
    RunMetrics,
    RunOutcome,
    RunState,
    StoredRun,
    SubagentResult,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._stored import SnapshotBody, body_template, templated_body

from .base import named_error, stopped_by_deadline
from .parts import Inbox, Meter
from .restore import fresh_call, restored_call
from .stage import Stage

if TYPE_CHECKING:
    from .execute import Execution
    from .machine import RunMachine
    from .stopping import Stopping

__all__ = ["Persistence"]

_DUMPS: dict[int, tuple[Any, dict[str, Any]]] = {}


def _dumped(record: Any) -> dict[str, Any]:
    """The JSON dump of an immutable record, cached while the record lives (identity-checked)."""
    cached = _DUMPS.get(id(record))
    if cached is not None and cached[0] is record:
        return cached[1]
    dump: dict[str, Any] = record.model_dump(mode="json")
    if len(_DUMPS) >= 256:
        _DUMPS.clear()  # a bound, not an LRU: configs and tool sets are few in practice
    _DUMPS[id(record)] = (record, dump)
    return dump


class Persistence:
    """Checkpoints, outcome and resume of one run.

    Attributes:
        revision: The last revision written (-1: none).
        forked_from: Where a forked run came from.
        holding: A resume is applying stored messages; the run does not move on yet.
        parked_revision: The revision at which the run last parked (waiting, checkpointed).
    """

    __slots__ = (
        "_checkpointed_len",
        "_deadline_left",
        "_deadline_passed",
        "_exec",
        "_fork_waits",
        "_inbox",
        "_machine",
        "_meter",
        "_static",
        "_stopping",
        "_template",
        "forked_from",
        "holding",
        "parked_revision",
        "revision",
    )

    def __init__(
        self,
        machine: RunMachine,
        inbox: Inbox,
        meter: Meter,
        execution: Execution,
        stopping: Stopping,
    ) -> None:
        self._machine = machine
        self._stopping = stopping
        self._inbox = inbox
        self._meter = meter
        self._exec = execution
        self.revision = -1
        self.parked_revision = -2
        self.holding = False
        self.forked_from: ForkOrigin | None = None
        self._checkpointed_len = 0
        self._static: dict[str, Any] | None = None  # snapshot fields fixed for the run's life
        self._template: dict[str, Any] | None = None  # body_template(static), built once
        self._deadline_left: float | None = None
        self._fork_waits = False
        self._deadline_passed = False  # restored: a journaled result says the deadline fired

    # ------------------------------------------------------------------ checkpoints

    def outcome(self) -> RunOutcome:
        """The run's outcome so far (final once the run is terminal)."""
        m = self._machine
        return RunOutcome(
            run_id=m.run_id,
            state=m.state,
            output=m.output if m.state is RunState.FINISHED else None,
            errors=tuple(m.errors),
            metrics=RunMetrics(**self._meter.fields()),
            revision=self.revision,
        )

    def checkpoint(self) -> None:
        """Write the next revision: the snapshot and the transcript entries since the last."""
        self.revision += 1
        self._meter.count("checkpoints")
        transcript = self._machine.transcript
        start = self._checkpointed_len
        entries = transcript[start:]
        self._checkpointed_len = len(transcript)
        self._machine.fx.checkpoint(self.revision, self.snapshot(), start, entries)

    def park(self) -> None:
        """The run waits for a person at this revision."""
        self.parked_revision = self.revision

    def _static_fields(self) -> dict[str, Any]:
        """The snapshot fields fixed for the run's life, dumped once (they never change)."""
        static = self._static
        if static is None:
            m = self._machine
            forked = self.forked_from
            static = self._static = {
                "run_id": m.run_id,
                "trace_id": m.trace_id,
                "session_id": m.session_id,
                "task_id": m.task_id,
                "parent_run_id": m.parent_run_id,
                "depth": m.depth,
                "forked_from": None if forked is None else forked.model_dump(mode="json"),
                "task": m.task,
                "agent": m.agent,
                "created_at": m.created_at,
                "config": _dumped(m.config),
                "capabilities": _dumped(m.capabilities),
                "compatibility": _dumped(m.compatibility),
            }
        return static

    def snapshot(self) -> SnapshotBody:
        """The run's state as a `RunSnapshot` body (JSON shape), built without validation.

        Built as the per-revision part a store writes (`dynamic_part`: no static field, no
        field at its default, trimmed metrics) plus the fields fixed for the run's life, so
        that no store splits it again (docs/performance.md, "Wave 4: persist").
        """
        m = self._machine
        meter = self._meter
        metrics, trimmed = meter.snapshot_metrics()
        # str(StrEnum) is the value, and far cheaper than `.value` on this hot path. The
        # first keys are `TEMPLATE_KEYS`, in their order (`templated_body`).
        dynamic: dict[str, Any] = {
            "revision": self.revision,
            "state": str(m.state),
            "model_calls": meter.model_calls,
            "model_retries": meter.model_retries,
            "steps": meter.steps,
            "usage": {"input_tokens": meter.input_tokens, "output_tokens": meter.output_tokens},
            "decisions": meter.decisions,
            "transcript_len": len(m.transcript),
            "metrics": trimmed,
            "updated_at": m.created_at,
        }
        waiting = m.waiting_for
        if waiting is not None:
            dynamic["waiting_for"] = str(waiting)
        self._inbox.add_fields(dynamic)
        calls = self._exec.calls
        if calls:
            dynamic["plan"] = [c.snapshot() for c in calls]
        errors = m.errors
        if errors:
            dynamic["errors"] = [e.model_dump(mode="json") for e in errors]
        output = m.output
        if output is not None:
            dynamic["output"] = output
        deadline = m.deadline
        if deadline is not None:
            # Signed: an overdue deadline stays overdue on resume (its timer fires at once).
            dynamic["deadline_left"] = deadline - meter.now
        template = self._template
        if template is None:
            template = self._template = body_template(self._static_fields())
        return templated_body(template, dynamic, metrics)

    # ------------------------------------------------------------------ restore

    def restore(
        self,
        stored: StoredRun,
        *,
        fork: ForkOrigin | None = None,
        arguments: dict[str, dict[str, Any]] | None = None,
        children: dict[str, RunMetrics] | None = None,
        deadline_left: float | None = None,
    ) -> None:
        """Load a stored run into this (fresh) machine, without acting.

        For a resume (R3, R21) the run keeps its id and continues at revision + 1. For a
        fork (R23) this machine has a new run id: the origin's history is copied, calls
        without a result start afresh with this run's keys, and approvals are asked again.
        `arguments` are validated call arguments kept in memory across a passivation: they
        hold what the store holds only as references (secrets, R26). `children` are the
        metrics of children whose results were journaled after the checkpoint: their usage
        rolls up into this run again. `deadline_left` replaces the stored seconds left of the
        run's total timeout (a wake: the host kept the deadline in memory).
        """
        m = self._machine
        snap = stored.snapshot
        transcript = list(stored.transcript)
        self._checkpointed_len = 0 if fork is not None else len(transcript)
        self._meter.restore(
            model_calls=snap.model_calls,
            model_retries=snap.model_retries,
            steps=snap.steps,
            decisions=snap.decisions,
            usage=snap.usage,
            metrics=snap.metrics,
        )
        self.forked_from = fork if fork is not None else snap.forked_from
        self._static = self._template = None
        if fork is not None:
            errors: list[Any] = []
            calls = []
            for pc in snap.plan:
                call, failed = fresh_call(pc, m.run_id, m.tools)
                if failed is not None:
                    errors.append(named_error(failed))
                calls.append(call)
            m.load(transcript, errors)
            self._exec.install(calls)
            # A fork of a run that waited for its user waits for its own answer.
            self._fork_waits = (
                snap.state is RunState.WAITING
                and snap.waiting_for is WaitingFor.USER
                and not snap.plan
            )
            self._count_children(stored)
            return
        self.revision = snap.revision
        self._inbox.restore(snap.last_seq, snap.pending_messages)
        errors = list(snap.errors)
        kept = arguments or {}
        # R6: results journaled after the checkpoint bring their errors back (in step order:
        # the journal keeps results, not the order they came in); errors found on restoring
        # a call (arguments that no longer validate) come after them.
        for pc in snap.plan:
            result = stored.journal.get(pc.call_id)
            if result is not None and pc.status is not CallStatus.DONE:
                named = named_error(result)
                if named is not None:
                    errors.append(named)
        calls = []
        for pc in snap.plan:
            call, charged, failed = restored_call(
                pc, stored.journal.get(pc.call_id), kept.get(pc.call_id), m.tools
            )
            if charged:
                self._meter.step()
            if failed is not None:
                errors.append(named_error(failed))
            calls.append(call)
        m.load(transcript, errors)
        m.load_state(snap.state, snap.waiting_for, snap.output)
        self._exec.install(calls)
        self._deadline_left = snap.deadline_left if deadline_left is None else deadline_left
        # The deadline's results are journaled before its terminal checkpoint: a crash
        # between the two leaves the run's end in the journal only (docs/durability.md).
        self._deadline_passed = any(stopped_by_deadline(c.result) for c in calls)
        self._count_children(stored)
        for metrics in (children or {}).values():
            self._meter.charge(metrics)

    def _count_children(self, stored: StoredRun) -> None:
        """Children already started count toward `max_children` after a restart too."""
        done = sum(1 for e in stored.transcript if isinstance(e, SubagentResult) and e.child_run_id)
        started = sum(1 for c in self._exec.calls if c.kind == "subagent" and c.counted)
        self._meter.set_children(done + started)

    # ------------------------------------------------------------------ resume

    def resume(self, now: float, messages: Sequence[HostMessage], *, wake: bool) -> None:
        """Continue a restored run from where its checkpoint stood.

        Calls without a recorded result are re-dispatched with their original idempotency key
        when their tool is side-effect free, idempotent or honours keys; other writes give the
        agent `side_effect_unknown` (docs/contract.md, "Safe boundaries and checkpoints").
        Host messages accepted after the checkpoint are applied in seq order.

        A `wake` (the same process reviving a passivated run) announces nothing: the host's
        view of the run (events, pending approvals) never changed.
        """
        m = self._machine
        self._meter.start(now)
        if m.state.is_terminal:
            m.fx.settled(self.outcome())
            return
        self._resume_clock_and_state(now, announce=not wake)
        if self._deadline_passed:
            self._exec.requeue_running()  # they run in no process now
            self._stopping.end_by_deadline(now)
            return
        self._resume_position(now, announce=not wake)
        # Stored messages are applied as one batch before the run moves on: results already
        # journaled must not carry the plan (and a model call) past a later stored cancel.
        self.holding = True
        try:
            for message in sorted(messages, key=lambda msg: msg.seq):
                m.host(message, now)
        finally:
            self.holding = False
        stage = m.stage
        if stage is Stage.WAITING_USER:
            self.parked_revision = self.revision  # its checkpoint is the waiting one
        elif stage is Stage.EXECUTING:
            if self._exec.pending_approvals() and m.state is not RunState.WAITING:
                m.wait(WaitingFor.APPROVAL)
            self._exec.after_call(now)
        elif stage is Stage.IDLE:
            m.boundary(now)

    def _resume_clock_and_state(self, now: float, *, announce: bool) -> None:
        m = self._machine
        left = self._deadline_left
        total = m.config.total_timeout
        if total is not None:
            m.set_deadline(now + (total if left is None else left))
        if self._fork_waits:
            m.wait(WaitingFor.USER)
        elif m.state is RunState.IDLE:
            m.set_state(RunState.RUNNING)
        if announce:
            forked = self.forked_from
            m.fx.emit(
                EventKind.RUN_STARTED,
                Phase.LOAD,
                {
                    "task": m.task,
                    "agent": m.agent,
                    "depth": m.depth,
                    "resumed_from": self.revision,
                    "forked_from": None if forked is None else forked.model_dump(mode="json"),
                },
            )

    def _resume_position(self, now: float, *, announce: bool) -> None:
        m = self._machine
        if self._exec.calls:
            self._exec.resume(now, announce=announce)
        elif m.state is RunState.WAITING and m.waiting_for is WaitingFor.USER:
            m.enter(Stage.WAITING_USER)
        else:
            m.enter(Stage.IDLE)
        # Messages after the last decision were delivered but no decision answered them yet.
        unseen: list[UserMessage] = []
        for entry in reversed(m.transcript):
            if isinstance(entry, DecisionEntry):
                break
            if isinstance(entry, UserMessage):
                unseen.append(entry)
        self._inbox.restore_unseen(tuple(reversed(unseen)))
        if self.revision < 0 and m.stage is not Stage.IDLE:
            # A fork's first revision holds its copied history before anything runs (and
            # before any write starts: write-ahead).
            self.checkpoint()
