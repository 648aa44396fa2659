"""Persistence of the run machine: snapshots at safe boundaries, outcome and metrics, and the
restore/resume of a run from a stored checkpoint (R21, R3: same run id, revision + 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from steerable.protocol import (
    AgentError,
    CallStatus,
    DecisionEntry,
    ErrorCode,
    EventKind,
    ForkOrigin,
    HostMessage,
    Phase,
    PlannedCall,
    RunMetrics,
    RunOutcome,
    RunState,
    StoredRun,
    SubagentResult,
    ToolResult,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._ids import idempotency_key

from .base import RUN_KEY, Call, MachineBase, Stage, ToolLike, stopped_by_deadline
from .effects import TimerKind

SECRET_REF = "secret:sha256:"
"""How the codec stores a secret (R26); such an argument cannot be restored."""

__all__ = ["PersistenceMixin"]


class PersistenceMixin(MachineBase):
    """The run machine's checkpoints and restore (see `RunMachine`)."""

    def outcome(self) -> RunOutcome:
        """The run's outcome so far (final once the run is terminal)."""
        return RunOutcome(
            run_id=self.run_id,
            state=self.state,
            output=self.output if self.state is RunState.FINISHED else None,
            errors=tuple(self.errors),
            metrics=self.metrics(),
            revision=self.revision,
        )

    def metrics(self) -> RunMetrics:
        """The run's counters."""
        return RunMetrics(**self._metrics())

    def _metrics(self) -> dict[str, Any]:
        # Plain data: the checkpoint path builds this twice per iteration (W4).
        return {
            "steps": self.steps,
            "model_calls": self.model_calls,
            "input_tokens": self.usage.input_tokens,
            "output_tokens": self.usage.output_tokens,
            "duration_seconds": max(0.0, self._now - self._started_at),
            "phase_seconds": dict(self._phase_seconds),
            **self._m,
        }

    def _checkpoint(self) -> None:
        self.revision += 1
        self._m["checkpoints"] += 1
        start = self._checkpointed_len
        entries = self.transcript[start:]
        self._checkpointed_len = len(self.transcript)
        self.fx.checkpoint(self.revision, self.snapshot(), start, entries)

    def _static_fields(self) -> dict[str, Any]:
        """The snapshot fields fixed for the run's life, dumped once (they never change)."""
        static = self._static_cache
        if static is None:
            static = self._static_cache = {
                "trace_id": self.trace_id,
                "session_id": self.session_id,
                "task_id": self.task_id,
                "parent_run_id": self.parent_run_id,
                "depth": self.depth,
                "forked_from": None
                if self.forked_from is None
                else self.forked_from.model_dump(mode="json"),
                "task": self.task,
                "agent": self.agent,
                "created_at": self.created_at,
                **self._static,
            }
        return static

    def snapshot(self) -> dict[str, Any]:
        """The run's state as a `RunSnapshot` body (JSON shape), built without validation."""
        waiting = self.waiting_for
        usage = self.usage
        # str(StrEnum) is the value, and far cheaper than `.value` on this hot path.
        return {
            **self._static_fields(),
            "run_id": self.run_id,
            "revision": self.revision,
            "state": str(self.state),
            "waiting_for": None if waiting is None else str(waiting),
            "model_calls": self.model_calls,
            "model_retries": self._model_retries,
            "steps": self.steps,
            "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
            "decisions": self.decisions,
            "transcript_len": len(self.transcript),
            "last_seq": self.last_seq,
            "delivered_seq": self.last_seq - len(self._pending),
            "pending_messages": [m.model_dump(mode="json") for m in self._pending]
            if self._pending
            else [],
            "plan": [c.snapshot() for c in self.plan],
            "errors": [e.model_dump(mode="json") for e in self.errors] if self.errors else [],
            "output": self.output,
            "metrics": self._metrics(),
            # Signed: an overdue deadline stays overdue on resume (its timer fires at once).
            "deadline_left": None if self.deadline is None else self.deadline - self._now,
            "updated_at": self.created_at,
        }

    # ------------------------------------------------------------------ restore

    def restore(
        self,
        stored: StoredRun,
        *,
        fork: ForkOrigin | None = None,
        arguments: dict[str, dict[str, Any]] | None = None,
        children: dict[str, RunMetrics] | None = None,
    ) -> None:
        """Load a stored run into this (fresh) machine, without acting.

        For a resume (R3, R21) the run keeps its id and continues at revision + 1. For a
        fork (R23) this machine has a new run id: the origin's history is copied, calls
        without a result start afresh with this run's keys, and approvals are asked again.
        `arguments` are validated call arguments kept in memory across a passivation: they
        hold what the store holds only as references (secrets, R26). `children` are the
        metrics of children whose results were journaled after the checkpoint: their usage
        rolls up into this run again.
        """
        snap = stored.snapshot
        self.transcript = list(stored.transcript)
        self._checkpointed_len = 0 if fork is not None else len(self.transcript)
        self.model_calls = snap.model_calls
        self._model_retries = snap.model_retries
        self.steps = snap.steps
        self.decisions = snap.decisions
        self.usage = snap.usage
        metrics = snap.metrics
        for key in self._m:
            self._m[key] = getattr(metrics, key)
        self._phase_seconds = dict(metrics.phase_seconds)
        self.forked_from = fork if fork is not None else snap.forked_from
        self._static_cache = None
        if fork is not None:
            self.plan = [self._fresh_call(pc) for pc in snap.plan]
            # A fork of a run that waited for its user waits for its own answer.
            self._fork_waits = (
                snap.state is RunState.WAITING
                and snap.waiting_for is WaitingFor.USER
                and not snap.plan
            )
            self._count_children(stored)
            return
        self.state = snap.state
        self.waiting_for = snap.waiting_for
        self.errors = list(snap.errors)
        self.output = snap.output
        self.revision = snap.revision
        self.last_seq = snap.last_seq
        self._pending = list(snap.pending_messages)
        kept = arguments or {}
        # R6: results journaled after the checkpoint bring their errors back (in step order:
        # the journal keeps results, not the order they came in); errors found on restoring
        # a call (arguments that no longer validate) come after them.
        for pc in snap.plan:
            result = stored.journal.get(pc.call_id)
            if result is not None and pc.status is not CallStatus.DONE:
                self._record_result(result, None, silent=True)  # restore does not act
        self.plan = [
            self._restored_call(pc, stored.journal.get(pc.call_id), kept.get(pc.call_id))
            for pc in snap.plan
        ]
        self._deadline_left = snap.deadline_left
        # The deadline's results are journaled before its terminal checkpoint: a crash
        # between the two leaves the run's end in the journal only (docs/durability.md).
        self._deadline_passed = any(stopped_by_deadline(c.result) for c in self.plan)
        self._count_children(stored)
        for metrics in (children or {}).values():
            self.steps += metrics.steps
            self.model_calls += metrics.model_calls
            self.usage = self.usage + Usage(
                input_tokens=metrics.input_tokens, output_tokens=metrics.output_tokens
            )

    def _count_children(self, stored: StoredRun) -> None:
        """Children already started count toward `max_children` after a restart too."""
        done = sum(1 for e in stored.transcript if isinstance(e, SubagentResult) and e.child_run_id)
        started = sum(1 for c in self.plan if c.kind == "subagent" and c.counted)
        self.children_started = done + started

    def _restored_call(
        self,
        pc: PlannedCall,
        result: ToolResult | SubagentResult | None,
        kept: dict[str, Any] | None = None,
    ) -> Call:
        tool = self.tools.get(pc.name) if pc.kind == "tool" else None
        call = Call(
            len(self.plan),
            pc.call_id,
            pc.kind,
            pc.name,
            dict(pc.arguments),
            pc.idempotency_key,
            None if tool is None else tool.spec,
        )
        call.status = pc.status
        call.attempt = pc.attempts
        call.child = pc.child_run_id
        if pc.kind == "subagent":  # started: dispatched, or finished with its child's result
            call.counted = pc.status is not CallStatus.PENDING or bool(
                getattr(result, "child_run_id", "")
            )
        else:
            call.counted = pc.status in (CallStatus.RUNNING, CallStatus.DONE) and pc.attempts > 0
        if result is not None:
            call.status = CallStatus.DONE
            call.result = result
            attempts = result.attempts if isinstance(result, ToolResult) else 0
            if attempts and not call.counted:
                # It ran after the checkpoint (which predates its dispatch): charge its step.
                call.counted = True
                call.attempt = attempts
                self.steps += 1
        elif kept is not None:
            call.arguments = kept
        elif tool is not None and call.status is not CallStatus.DONE:
            self._revalidate(call, tool)
        return call

    def _revalidate(self, call: Call, tool: ToolLike) -> None:
        """Stored arguments are their JSON form: validate them again for the tool (R21).

        A secret argument is stored only as its reference (R26) and cannot be restored: the
        call ends `invalid_arguments`, and the agent must supply the secret again.
        """
        error = None
        if any(isinstance(v, str) and v.startswith(SECRET_REF) for v in call.arguments.values()):
            error = AgentError.of(
                ErrorCode.INVALID_ARGUMENTS,
                f"a secret argument of {call.name} is stored only as a reference and cannot "
                "be restored; call the tool again with the secret",
                tool=call.name,
                call_id=call.call_id,
            )
        else:
            try:
                call.arguments = tool.validate(call.arguments)
            except Exception as exc:  # noqa: BLE001 - the tool changed; reported to the agent
                details = getattr(exc, "error", None)
                error = (
                    details
                    if isinstance(details, AgentError)
                    else AgentError.of(ErrorCode.INVALID_ARGUMENTS, str(exc), tool=call.name)
                )
        if error is not None:
            call.status = CallStatus.DONE
            call.result = result = ToolResult(
                call_id=call.call_id, tool=call.name, ok=False, error=error, attempts=call.attempt
            )
            self._record_result(result, None, silent=True)

    def _fresh_call(self, pc: PlannedCall) -> Call:
        tool = self.tools.get(pc.name) if pc.kind == "tool" else None
        key = idempotency_key(self.run_id, pc.call_id)
        call = Call(
            0,
            pc.call_id,
            pc.kind,
            pc.name,
            dict(pc.arguments),
            key,
            None if tool is None else tool.spec,
        )
        if call.needs_approval:
            call.status = CallStatus.AWAITING_APPROVAL  # R23: approvals are not carried over
        if tool is not None:
            self._revalidate(call, tool)
        return call

    def resume(
        self, now: float, messages: Sequence[HostMessage] = (), *, wake: bool = False
    ) -> None:
        """Continue a restored run from where its checkpoint stood.

        Calls without a recorded result are re-dispatched with their original idempotency key
        when their tool is side-effect free, idempotent or honours keys; other writes give the
        agent `side_effect_unknown` (docs/contract.md, "Safe boundaries and checkpoints"). Host
        messages
        accepted after the checkpoint are applied in seq order.

        A `wake` (the same process reviving a passivated run) announces nothing: the host's
        view of the run (events, pending approvals) never changed.
        """
        self._started_at = now
        self._now = now
        if self.state.is_terminal:
            self.fx.settled(self.outcome())
            return
        self._resume_clock_and_state(now, announce=not wake)
        if self._deadline_passed:
            for call in self.plan:
                if call.status is CallStatus.RUNNING:
                    call.status = CallStatus.PENDING  # it runs in no process now
            self._end_by_deadline(now)
            return
        self._resume_position(now, announce=not wake)
        # Stored messages are applied as one batch before the run moves on: results already
        # journaled must not carry the plan (and a model call) past a later stored cancel.
        self._holding = True
        try:
            for message in sorted(messages, key=lambda m: m.seq):
                self.host(message, now)
        finally:
            self._holding = False
        if self._stage is Stage.WAITING_USER:
            self._parked_revision = self.revision  # its checkpoint is the waiting one
        elif self._stage is Stage.EXECUTING:
            if self.pending_approvals() and self.state is not RunState.WAITING:
                self.waiting_for = WaitingFor.APPROVAL
                self._set_state(RunState.WAITING)
            self._after_call(now)
        elif self._stage is Stage.IDLE:
            self._boundary(now)

    def _resume_clock_and_state(self, now: float, *, announce: bool) -> None:
        left = self._deadline_left
        if self.config.total_timeout is not None:
            self.deadline = now + (self.config.total_timeout if left is None else left)
            self.fx.schedule(TimerKind.RUN_DEADLINE, RUN_KEY, 0, self.deadline)
        if self._fork_waits:
            self.waiting_for = WaitingFor.USER
            self._set_state(RunState.WAITING)
        elif self.state is RunState.IDLE:
            self._set_state(RunState.RUNNING)
        if announce:
            forked = self.forked_from
            self.fx.emit(
                EventKind.RUN_STARTED,
                Phase.LOAD,
                {
                    "task": self.task,
                    "agent": self.agent,
                    "depth": self.depth,
                    "resumed_from": self.revision,
                    "forked_from": None if forked is None else forked.model_dump(mode="json"),
                },
            )

    def _resume_position(self, now: float, *, announce: bool) -> None:
        if self.plan:
            self._enter(Stage.EXECUTING)
            self._exec_started = now
            for call in self.plan:
                self._settle_restored(call, now, announce=announce)
        elif self.state is RunState.WAITING and self.waiting_for is WaitingFor.USER:
            self._enter(Stage.WAITING_USER)
        else:
            self._enter(Stage.IDLE)
        # Messages after the last decision were delivered but no decision answered them yet.
        unseen: list[UserMessage] = []
        for entry in reversed(self.transcript):
            if isinstance(entry, DecisionEntry):
                break
            if isinstance(entry, UserMessage):
                unseen.append(entry)
        self._unseen = tuple(reversed(unseen))
        if self.revision < 0 and self._stage is not Stage.IDLE:
            # A fork's first revision holds its copied history before anything runs (and
            # before any write starts: write-ahead).
            self._checkpoint()

    def _settle_restored(self, call: Call, now: float, *, announce: bool) -> None:
        """Decide what happens to one call of a restored plan."""
        if call.status is CallStatus.AWAITING_APPROVAL:
            if not announce:
                return
            self.fx.emit(
                EventKind.APPROVAL_REQUESTED,
                Phase.EXECUTE,
                {"call_id": call.call_id, "tool": call.name, "arguments": call.arguments},
            )
            return
        resumed = self.revision >= 0  # a fork (no revision yet) starts its calls afresh
        unknown_write = (
            call.kind == "tool"
            and call.status is CallStatus.PENDING
            and resumed
            and announce
            and call.spec is not None
            and not call.spec.redispatch_safe
        )
        if unknown_write:
            # Its checkpoint was stored, so it may have started before the process stopped:
            # the runtime cannot tell, and never guesses (R15).
            call.status = CallStatus.RUNNING
        if call.status is not CallStatus.RUNNING:
            return
        if call.kind == "subagent":
            call.status = CallStatus.PENDING  # the same child id: resumed, not started twice
            return
        spec = call.spec
        if spec is not None and spec.redispatch_safe:
            call.status = CallStatus.PENDING  # re-dispatched with the same key, same step
            return
        self._running += 1  # _complete counts it back down
        if spec is None:
            error = AgentError.of(
                ErrorCode.UNKNOWN_TOOL,
                f"no tool named {call.name!r} after resume",
                tool=call.name,
                call_id=call.call_id,
            )
        else:
            error = AgentError.of(
                ErrorCode.SIDE_EFFECT_UNKNOWN,
                f"{call.name} was running when the process stopped; its side effect may or "
                "may not have happened",
                tool=call.name,
                call_id=call.call_id,
                idempotency_key=call.key,
                side_effect="unknown",
            )
        self._complete(call, None, error, now, advance=False)
