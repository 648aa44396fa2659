"""The run's state machine: pure, single-threaded, driven by messages, acting through a port.

`RunMachine` is one run's policy: what each message means, what comes next. It composes
parts, each the one writer of its attributes (docs/architecture.md, "The run machine"):
`Inbox` and `Meter` (parts.py), `Reasoning` (the model call), `Execution` (plans, over a
`PlanState`), `Stopping` (cancel, deadline) and `Persistence` (checkpoints, resume). Each
public method handles one message and acts only through `Effects`: no threads, no clock reads
(time arrives as `now`), no I/O. The RunSupervisor feeds it; tests feed it and record effects.

Safe boundaries (docs/contract.md): a checkpoint is written after a decision is recorded and its
calls are keyed (before dispatch), at the boundary after a plan's results are all in (before the
next model call), when the run starts waiting, and at a terminal state. Nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    AskUser,
    CancelRequest,
    CapabilitySnapshot,
    Compatibility,
    ErrorCode,
    EventKind,
    Finish,
    ForkOrigin,
    HostMessage,
    Phase,
    Plan,
    RunConfig,
    RunMetrics,
    RunOutcome,
    RunState,
    SteeringMode,
    StoredRun,
    SubagentResult,
    SystemNote,
    ToolResult,
    TranscriptEntry,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._built import built_decision_entry
from steerable.protocol._state import TRANSITIONS

from . import events
from .base import MODEL_KEY, PLAN_KEY, RUN_KEY, Call, ToolLike, named_error
from .effects import Effects, TimerKind
from .execute import Execution
from .members import KIND_REASONING_FINISHED, PHASE_REASON, STATE_WAITING
from .parts import Inbox, Meter
from .persist import Persistence
from .preview import decision_preview
from .reasoning import Reasoning
from .stage import STAGE_SUCCESSORS, Stage, check_stage
from .stopping import Stopping

__all__ = ["MODEL_KEY", "RunMachine", "ToolLike"]

_NO_COMPATIBILITY = Compatibility()
_MAX_RETRY_AFTER = 3600.0
"""A provider's Retry-After beyond an hour is not waited for literally (the deadline rules)."""
RUN_TIMERS = (
    (TimerKind.RUN_DEADLINE, RUN_KEY),
    (TimerKind.MODEL_TIMEOUT, MODEL_KEY),
    (TimerKind.MODEL_RETRY, MODEL_KEY),
    (TimerKind.GRACE, RUN_KEY),
    (TimerKind.GRACE, PLAN_KEY),
    (TimerKind.GRACE, MODEL_KEY),
)


class RunMachine:
    """The state machine of one run. Not thread-safe: one owner (the supervisor) drives it.

    Args:
        fx: The effects port.
        run_id: The run's id.
        trace_id: The trace the run belongs to.
        task: The task text.
        agent: The agent's name.
        config: The run's limits and policies.
        tools: The tools the run may call, by name.
        capabilities: The snapshot of tools and agents, stored in checkpoints (R22).
        compatibility: The host's fingerprints (R22).
        session_id: The host's session id.
        task_id: The host's task id.
        parent_run_id: The parent run of a subagent.
        depth: 0 for a top-level run.
        created_at: Wall-clock seconds at creation.
        subagents: Names of the agents this run may start as subagents.
    """

    def __init__(
        self,
        fx: Effects,
        *,
        run_id: str,
        trace_id: str,
        task: str,
        agent: str,
        config: RunConfig,
        tools: Mapping[str, ToolLike],
        capabilities: CapabilitySnapshot,
        compatibility: Compatibility | None = None,
        session_id: str | None = None,
        task_id: str | None = None,
        parent_run_id: str | None = None,
        depth: int = 0,
        created_at: float = 0.0,
        subagents: Iterable[str] = (),
    ) -> None:
        self.fx = fx
        self.run_id = run_id
        self.trace_id = trace_id
        self.task = task
        self.agent = agent
        self.config = config
        self._max_model_calls = config.max_model_calls  # per step: slots, not pydantic reads
        self._token_budget = config.token_budget
        self.tools = tools
        self.session_id = session_id
        self.task_id = task_id
        self.parent_run_id = parent_run_id
        self.depth = depth
        self.created_at = created_at
        self.compatibility = compatibility or _NO_COMPATIBILITY
        self.capabilities = capabilities
        self.subagents = frozenset(subagents)

        self._inbox = Inbox()
        self._meter = Meter()
        self._reasoning = Reasoning(self, self._meter)
        self._exec = Execution(self, self._meter)
        self._stopping = Stopping(self, self._reasoning, self._exec)
        self._persist = Persistence(self, self._inbox, self._meter, self._exec, self._stopping)

        self.state = RunState.IDLE
        self.waiting_for: WaitingFor | None = None
        self.stage = Stage.IDLE  # written by `enter` only, checked against STAGE_TRANSITIONS
        self.transcript: list[TranscriptEntry] = []
        self.errors: list[AgentError] = []
        self.output: Any = None
        self.deadline: float | None = None

    # ------------------------------------------------------------------ what hosts read

    @property
    def is_terminal(self) -> bool:
        """Whether the run has reached a terminal state."""
        return self.state.is_terminal

    @property
    def model_in_flight(self) -> int | None:
        """The number of the model call in flight, or None."""
        return self._meter.model_calls if self._reasoning.busy else None

    @property
    def in_flight(self) -> bool:
        """Whether a model call or a tool call is under way."""
        return self._reasoning.busy or self._exec.running > 0

    @property
    def parked(self) -> bool:
        """Waiting for a person with nothing in flight, and checkpointed as such.

        A parked run can be passivated: its supervisor stops, its next message wakes it from
        the checkpoint (docs/requirements.md "Passivation")."""
        return (
            self.state is STATE_WAITING
            and not self.in_flight
            and self._persist.parked_revision == self._persist.revision
        )

    @property
    def plan(self) -> list[Call]:
        """The calls of the current plan (empty between plans); read-only."""
        return self._exec.calls

    @property
    def steps(self) -> int:
        """Tool steps executed (subagents' included)."""
        return self._meter.steps

    @property
    def model_calls(self) -> int:
        """Model calls made (retries and subagents' included)."""
        return self._meter.model_calls

    @property
    def last_seq(self) -> int:
        """The seq of the last host message accepted."""
        return self._inbox.last_seq

    def pending_approvals(self) -> list[Call]:
        """Calls of the current plan waiting for a person."""
        return self._exec.pending_approvals()

    # ------------------------------------------------------------------ messages

    def start(self, now: float) -> None:
        """Begin the run: the first boundary, then the first model call."""
        if self.state is not RunState.IDLE:
            return
        self._meter.start(now)
        if self.config.total_timeout is not None:
            self.set_deadline(now + self.config.total_timeout)
        self.set_state(RunState.RUNNING)
        self.fx.emit(
            EventKind.RUN_STARTED,
            Phase.LOAD,
            {"task": self.task, "agent": self.agent, "depth": self.depth},
        )
        self.boundary(now)

    def host(self, msg: HostMessage, now: float) -> None:
        """A host message accepted into the inbox (already stored if the store is durable)."""
        self._meter.at(now)
        if not self._inbox.accept(msg) or self.state.is_terminal:
            return
        if isinstance(msg, CancelRequest):
            self._stopping.cancel(msg.reason, now)
        elif isinstance(msg, ApprovalDecision):
            self._exec.approval(msg, now)
        else:
            self._on_user(msg, now)

    def decided(
        self,
        model_call: int,
        decision: Plan | Finish | AskUser | None,
        verdict: str | None,
        error: AgentError | None,
        elapsed: float,
        now: float,
    ) -> None:
        """The agent's `decide` returned (or raised) for model call `model_call`.

        Args:
            model_call: Which model call this answers.
            decision: The decision, or None when `error` is set.
            verdict: For a Finish: None if `accept` accepted it, else what is missing.
            error: Set when the agent raised or returned something that is not a decision.
            elapsed: Seconds the call took.
            now: Monotonic time.
        """
        meter = self._meter
        meter.at(now)
        if not self._reasoning.answered(model_call, decision, error, elapsed, now):
            return
        assert decision is not None  # answered: a decision to act on
        meter.decided()
        usage = decision.usage
        planned = isinstance(decision, Plan) and bool(decision.steps)
        if not planned:
            self.transcript.append(built_decision_entry(model_call, decision))
        self._inbox.seen()  # the agent has decided with them
        self.fx.emit(
            KIND_REASONING_FINISHED,
            PHASE_REASON,
            {
                "model_call": model_call,
                **decision_preview(decision, self.tools),
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
            },
        )
        if isinstance(decision, Finish):
            self._on_finish(decision, verdict, now)
        elif (budget := self._token_budget) is not None and meter.usage.total > budget:
            if planned:
                self.transcript.append(built_decision_entry(model_call, decision))
            self.exhaust("token_budget", self.config.token_budget)
        elif isinstance(decision, AskUser):
            self._on_ask(decision, now)
        elif planned:
            self._exec.plan(model_call, decision, now)
        else:
            self.terminate(
                RunState.ERROR,
                AgentError.of(
                    ErrorCode.INVALID_DECISION,
                    "the agent returned an empty plan: no progress possible (R11)",
                ),
            )

    def tool_done(
        self, call_id: str, attempt: int, value: Any, error: AgentError | None, now: float
    ) -> None:
        """A worker finished attempt `attempt` of call `call_id` (value, or error)."""
        self._meter.at(now)
        self._exec.tool_done(call_id, attempt, value, error, now)

    def child_done(self, call_id: str, outcome: RunOutcome, now: float) -> None:
        """A child run reached its terminal state: its result enters the parent (R7)."""
        self._meter.at(now)
        self._exec.child_done(call_id, outcome, now)

    def timer(self, kind: TimerKind, key: str, attempt: int, now: float) -> None:
        """A timer fired."""
        self._meter.at(now)
        if self.state.is_terminal:
            return
        if kind is TimerKind.TOOL_TIMEOUT:
            self._exec.tool_timeout(key, attempt, now)
        elif kind is TimerKind.TOOL_RETRY:
            self._exec.retry_due(key, attempt, now)
        elif kind is TimerKind.MODEL_TIMEOUT:
            self._reasoning.timed_out(attempt, now)
        elif kind is TimerKind.MODEL_RETRY:
            if self.stage is Stage.IDLE and self.state is RunState.RUNNING:
                # No model call in flight: a safe boundary (messages, budgets, checkpoint).
                self.boundary(now)
        elif kind is TimerKind.RUN_DEADLINE:
            self._stopping.deadline(now)
        elif kind is TimerKind.GRACE:
            self._stopping.grace(key, now)

    def cancel_now(self, reason: str, now: float) -> None:
        """The host cancelled: act before any result its cancellation provokes arrives.

        `RunHandle.cancel` tells this ahead of cancelling the run's scope, so a tool that
        stops on the signal reports after it; the stored `CancelRequest` follows with its seq.
        """
        self._meter.at(now)
        if self.stage is not Stage.DONE:
            self._stopping.cancel(reason, now)

    def abort(self, error: AgentError) -> None:
        """End the run in ERROR at once (a defect in the runtime): all work is abandoned."""
        self._stopping.abandon_all()
        self.terminate(RunState.ERROR, error)

    def record_error(self, error: AgentError) -> None:
        """Record an error that does not change the run's course (a hook that raised, R13)."""
        self.record(error)

    # ------------------------------------------------------------------ the loop

    def _on_user(self, msg: UserMessage, now: float) -> None:
        self._inbox.hold(msg)
        self.fx.emit(EventKind.MESSAGE_ACCEPTED, None, {"seq": msg.seq, "mode": msg.mode.value})
        if self.stage is Stage.WAITING_USER:
            self.enter(Stage.IDLE)
            self.stop_waiting()
            self.boundary(now)
        elif (
            msg.mode is SteeringMode.INTERRUPT
            and self.stage is not Stage.CANCELLING
            and not self._reasoning.interrupt(now)  # no model call to interrupt: the plan
        ):
            self._exec.interrupt(now)

    def _on_finish(self, decision: Finish, verdict: str | None, now: float) -> None:
        if (
            verdict is None
            and self._inbox.has_user_message
            and self._meter.model_calls < self.config.max_model_calls
        ):
            # A person spoke while the agent was concluding: the claim is made without their
            # message, which must not be lost (R20). The agent decides again with it.
            verdict = "new user messages arrived while the agent was finishing"
        if verdict is None:
            self.output = decision.output
            self.terminate(RunState.FINISHED, None)
            return
        # R9: a rejected claim goes back to the agent; the loop goes on.
        self.note(f"finish rejected: {verdict}", reason=verdict)
        self.fx.emit(EventKind.FINISH_REJECTED, Phase.OBSERVE, {"reason": verdict})
        self.enter(Stage.IDLE)
        self.boundary(now)

    def _on_ask(self, decision: AskUser, now: float) -> None:
        if self._inbox.has_user_message:
            self.enter(Stage.IDLE)
            self.boundary(now)
            return
        self.enter(Stage.WAITING_USER)
        self.wait(WaitingFor.USER, question=decision.question)
        self.checkpoint()
        self._persist.park()

    def boundary(self, now: float) -> None:
        """A safe boundary: apply the inbox, check budgets, checkpoint, then reason."""
        if self._persist.holding:
            return  # a resume is still applying stored messages; it moves on after them
        # What no decision has answered yet stays news to the agent: messages delivered at
        # earlier boundaries whose model call timed out or was interrupted, or that a resume
        # found after the last decision.
        inbox = self._inbox
        fresh = inbox.deliver()
        for msg in fresh:
            self.transcript.append(msg)
            self._meter.count("messages_delivered")
            self.fx.emit(
                EventKind.MESSAGE_DELIVERED,
                Phase.OBSERVE,
                {"seq": msg.seq, "content": msg.content, "mode": msg.mode.value},
            )
        if self._meter.model_calls >= self._max_model_calls:
            self.exhaust("max_model_calls", self._max_model_calls)
            return
        budget = self._token_budget
        if budget is not None and self._meter.usage.total >= budget:
            self.exhaust("token_budget", budget)
            return
        if fresh:
            inbox.mark_unseen((*inbox.unseen, *fresh))
        self.checkpoint()
        self._reasoning.ask(now, inbox.unseen)

    # ------------------------------------------------------------------ for the parts
    # `Execution` and `Stopping` act on the run as a whole through these (and nothing else).

    @property
    def cancel_reason(self) -> str | None:
        """Why the run is being cancelled (None: it is not)."""
        return self._stopping.reason

    @property
    def holding(self) -> bool:
        """A resume is still applying stored messages: the run does not move on yet."""
        return self._persist.holding

    def enter(self, stage: Stage) -> None:
        """The one writer of the stage: every move is checked against STAGE_TRANSITIONS
        (`check_stage`'s test in line, a few moves per step; it raises on an illegal one)."""
        current = self.stage
        if stage is not current and stage not in STAGE_SUCCESSORS[current._value_]:
            check_stage(current, stage)
        self.stage = stage

    def set_state(self, state: RunState, **data: Any) -> None:
        """Move the run's state (checked against `TRANSITIONS`), with a `state_changed`."""
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal transition {self.state} -> {state}")
        previous = self.state
        self.state = state
        waiting = self.waiting_for
        self.fx.emit(
            EventKind.STATE_CHANGED,
            None,
            {
                "from": previous.value,
                "to": state.value,
                "waiting_for": None if waiting is None else waiting.value,
                **data,
            },
        )

    def wait(self, reason: WaitingFor, **data: Any) -> None:
        """The run waits for a person."""
        self.waiting_for = reason
        self.set_state(STATE_WAITING, **data)

    def stop_waiting(self) -> None:
        """Nothing is waited for any more: the run runs."""
        self.waiting_for = None
        self.set_state(RunState.RUNNING)

    def park(self) -> None:
        """A safe boundary where the run waits for approvals: checkpointed once."""
        persist = self._persist
        if persist.parked_revision != persist.revision:
            self.checkpoint()
            persist.park()

    def add_entry(self, entry: TranscriptEntry) -> None:
        """Append to the transcript (append-only)."""
        self.transcript.append(entry)

    def note(self, text: str, **data: Any) -> None:
        """A note from the runtime to the agent, in the transcript."""
        self.transcript.append(SystemNote(text=text, data=data))

    def record(
        self,
        error: AgentError,
        phase: Phase | None = None,
        *,
        event: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """R6: every error is recorded on the run, in order, and is an `error` event (its
        payload `event`, or the error's code and message with `fields`)."""
        self.errors.append(error)
        if event is None:
            event = {"code": error.code.value, "message": error.message, **fields}
        self.fx.emit(EventKind.ERROR, phase, event)

    def record_result(self, result: ToolResult | SubagentResult, phase: Phase | None) -> None:
        """Record the error of a call's result (if it failed), naming the call."""
        error = named_error(result)
        if error is not None:
            self.record(error, phase, call_id=result.call_id)

    def maybe_finish_cancel(self, now: float) -> None:
        """End a cancelled run once nothing is in flight."""
        self._stopping.maybe_finish(now)

    def exhaust(self, budget: str, limit: int | None, **details: Any) -> None:
        """End the run EXHAUSTED: `budget` is used up."""
        self.terminate(
            RunState.EXHAUSTED,
            AgentError.of(
                ErrorCode.BUDGET_EXHAUSTED,
                f"budget {budget} used up (limit {limit})",
                budget=budget,
                limit=limit,
                **details,
            ),
        )

    def terminate(self, state: RunState, error: AgentError | None) -> None:
        """End the run in `state`: the last checkpoint, `run_ended`, the outcome."""
        if self.state.is_terminal:
            return  # R8: terminal states are never overwritten
        if error is not None:
            self.record(error)
        for kind, key in RUN_TIMERS:
            self.fx.unschedule(kind, key)
        self._exec.unschedule_running()
        self.enter(Stage.DONE)
        self.waiting_for = None
        self.set_state(state)
        self.checkpoint()
        outcome = self.outcome()
        self.fx.emit(EventKind.RUN_ENDED, None, events.run_ended(state, error, outcome))
        self.fx.settled(outcome)

    def set_deadline(self, at: float) -> None:
        """The run's total timeout falls at `at` (monotonic seconds)."""
        self.deadline = at
        self.fx.schedule(TimerKind.RUN_DEADLINE, RUN_KEY, 0, at)

    def load(self, transcript: list[TranscriptEntry], errors: list[AgentError]) -> None:
        """For `Persistence.restore`: the history a checkpoint stored."""
        self.transcript = transcript
        self.errors = errors

    def load_state(self, state: RunState, waiting_for: WaitingFor | None, output: Any) -> None:
        """For `Persistence.restore` (a resume): where the run stood."""
        self.state, self.waiting_for, self.output = state, waiting_for, output

    # ------------------------------------------------------------------ checkpoints

    @property
    def revision(self) -> int:
        """The last revision written (-1: none)."""
        return self._persist.revision

    def outcome(self) -> RunOutcome:
        """The run's outcome so far (final once the run is terminal)."""
        return self._persist.outcome()

    def metrics(self) -> RunMetrics:
        """The run's counters."""
        return RunMetrics(**self._meter.fields())

    def checkpoint(self) -> None:
        """Write the next revision (at a safe boundary only)."""
        self._persist.checkpoint()

    def snapshot(self) -> dict[str, Any]:
        """The run's state as a `RunSnapshot` body (JSON shape), built without validation."""
        return self._persist.snapshot()

    def release(self) -> None:
        """Let go of the parts, which refer back to the machine (its actor stopped): a finished
        run's machine and transcript are then freed by reference counting, not left to a full
        collection (docs/performance.md, "A finished run is not a cycle"). Nothing may call the
        machine afterwards."""
        del self._reasoning, self._exec, self._stopping, self._persist

    def restore(
        self,
        stored: StoredRun,
        *,
        fork: ForkOrigin | None = None,
        arguments: dict[str, dict[str, Any]] | None = None,
        children: dict[str, RunMetrics] | None = None,
        deadline_left: float | None = None,
    ) -> None:
        """Load a stored run into this (fresh) machine, without acting (`Persistence.restore`)."""
        self._persist.restore(
            stored, fork=fork, arguments=arguments, children=children, deadline_left=deadline_left
        )

    def resume(
        self, now: float, messages: Sequence[HostMessage] = (), *, wake: bool = False
    ) -> None:
        """Continue a restored run from where its checkpoint stood (`Persistence.resume`)."""
        self._persist.resume(now, messages, wake=wake)
