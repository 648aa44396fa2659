"""The run's state machine: pure, single-threaded, driven by messages, acting through a port.

`RunMachine` owns one run's state (lifecycle, transcript, inbox, plan, budgets, errors). Each
public method handles one message and acts only through `Effects`: no threads, no clock reads
(time arrives as `now`), no I/O. The RunSupervisor feeds it; tests feed it and record effects.

Safe boundaries (docs/contract.md): a checkpoint is written after a decision is recorded and its
calls are keyed (before dispatch), at the boundary after a plan's results are all in (before the
next model call), when the run starts waiting, and at a terminal state. Nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from steerable.protocol import (
    AgentError,
    ApprovalDecision,
    AskUser,
    CallStatus,
    CancelRequest,
    CapabilitySnapshot,
    Compatibility,
    DecisionEntry,
    ErrorCode,
    EventKind,
    Finish,
    ForkOrigin,
    HostMessage,
    Phase,
    Plan,
    RunConfig,
    RunState,
    SteeringMode,
    SystemNote,
    ToolSpec,
    TranscriptEntry,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._state import TRANSITIONS
from steerable.protocol._view import Budgets, RunView, Transcript

from .base import (
    MODEL_KEY,
    PLAN_KEY,
    RUN_KEY,
    Call,
    ToolLike,
    cancelled,
)
from .effects import Effects, TimerKind
from .execute import ExecutionMixin
from .persist import PersistenceMixin
from .preview import decision_preview, preview
from .stage import Stage, check_stage
from .stopping import StoppingMixin

__all__ = ["MODEL_KEY", "RunMachine", "ToolLike"]

_NO_COMPATIBILITY = Compatibility()
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


RUN_TIMERS = (
    (TimerKind.RUN_DEADLINE, RUN_KEY),
    (TimerKind.MODEL_TIMEOUT, MODEL_KEY),
    (TimerKind.MODEL_RETRY, MODEL_KEY),
    (TimerKind.GRACE, RUN_KEY),
    (TimerKind.GRACE, PLAN_KEY),
    (TimerKind.GRACE, MODEL_KEY),
)


class RunMachine(ExecutionMixin, StoppingMixin, PersistenceMixin):
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

    def __init__(  # noqa: PLR0915 - one assignment per field of the run's state
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
        self.tools = tools
        self.session_id = session_id
        self.task_id = task_id
        self.parent_run_id = parent_run_id
        self.depth = depth
        self.created_at = created_at
        self.compatibility = compatibility or _NO_COMPATIBILITY
        self.capabilities = capabilities
        # Dumped once (and shared by the runs that share the record): the checkpoint snapshot
        # reuses these on every boundary.
        self._static = {
            "config": _dumped(config),
            "capabilities": _dumped(capabilities),
            "compatibility": _dumped(self.compatibility),
        }
        self._static_cache: dict[str, Any] | None = None

        self.state = RunState.IDLE
        self.waiting_for: WaitingFor | None = None
        self._stage = Stage.IDLE  # written by _enter only, checked against STAGE_TRANSITIONS
        self.transcript: list[TranscriptEntry] = []
        self.errors: list[AgentError] = []
        self.output: Any = None
        self.revision = -1
        self._checkpointed_len = 0

        self.model_calls = 0
        self.steps = 0
        self.decisions = 0
        self.usage = Usage()
        self._model_retries = 0
        self._model_in_flight = False
        self._model_discarded = False
        self._reason_started = 0.0
        self._exec_started = 0.0

        self.last_seq = -1
        self._pending: list[HostMessage] = []  # accepted, not yet applied, in seq order
        self.plan: list[Call] = []
        self._running = 0
        self._interrupting = False
        self._cancel_reason: str | None = None
        self.deadline: float | None = None

        self._m: dict[str, Any] = {
            "retries": 0,
            "tool_errors": 0,
            "messages_delivered": 0,
            "checkpoints": 0,
            "late_results_dropped": 0,
        }
        self._phase_seconds: dict[str, float] = {}
        self._started_at = 0.0
        self._now = 0.0
        self._deadline_left: float | None = None
        self._parked_revision = -2
        self._holding = False
        self._unseen: tuple[UserMessage, ...] = ()
        self._fork_waits = False
        self._deadline_passed = False  # restored: a journaled result says the deadline fired
        self.subagents = frozenset(subagents)
        self.children_started = 0
        self.forked_from: ForkOrigin | None = None
        self._call_ids: set[str] | None = None  # every call id used; see _taken_call_ids
        self._view_caps: tuple[tuple[ToolSpec, ...], tuple[str, ...]] | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the run has reached a terminal state."""
        return self.state.is_terminal

    @property
    def model_in_flight(self) -> int | None:
        """The number of the model call in flight, or None."""
        return self.model_calls if self._model_in_flight else None

    def _stage_done(self) -> bool:
        return self._stage is Stage.DONE

    @property
    def parked(self) -> bool:
        """Waiting for a person with nothing in flight, and checkpointed as such.

        A parked run can be passivated: its supervisor stops and its next message wakes it
        from the checkpoint (docs/requirements.md "Passivation").
        """
        return (
            self.state is RunState.WAITING
            and not self.in_flight
            and self._parked_revision == self.revision
        )

    def start(self, now: float) -> None:
        """Begin the run: the first boundary, then the first model call."""
        if self.state is not RunState.IDLE:
            return
        self._started_at = now
        self._now = now
        if self.config.total_timeout is not None:
            self.deadline = now + self.config.total_timeout
            self.fx.schedule(TimerKind.RUN_DEADLINE, RUN_KEY, 0, self.deadline)
        self._set_state(RunState.RUNNING)
        self.fx.emit(
            EventKind.RUN_STARTED,
            Phase.LOAD,
            {"task": self.task, "agent": self.agent, "depth": self.depth},
        )
        self._boundary(now)

    def host(self, msg: HostMessage, now: float) -> None:
        """A host message accepted into the inbox (already stored if the store is durable)."""
        self._now = now
        if msg.seq <= self.last_seq:
            return  # a duplicate wake-up of a message already applied (exactly once)
        self.last_seq = msg.seq
        if self.state.is_terminal:
            return
        if isinstance(msg, CancelRequest):
            self._on_cancel(msg.reason, now)
        elif isinstance(msg, ApprovalDecision):
            self._on_approval(msg, now)
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
        self._now = now
        if self._stage is Stage.DONE or not self._model_in_flight or model_call != self.model_calls:
            self._m["late_results_dropped"] += 1
            return
        self._model_in_flight = False
        self.fx.unschedule(TimerKind.MODEL_TIMEOUT, MODEL_KEY)
        self._add_phase(Phase.REASON, elapsed)
        if decision is not None and (decision.usage.input_tokens or decision.usage.output_tokens):
            self.usage = self.usage + decision.usage
        if self._stage is Stage.CANCELLING:
            self._maybe_finish_cancel(now)
            return
        if self._model_discarded:
            # An interrupting message arrived while the model was thinking: its answer is
            # stale. Deliver the message and ask again.
            self._model_discarded = False
            self.fx.unschedule(TimerKind.GRACE, MODEL_KEY)
            self._note(f"model call {model_call} was interrupted by a user message")
            self._enter(Stage.IDLE)
            self._boundary(now)
            return
        if error is not None or decision is None:
            err = error or AgentError.of(ErrorCode.INTERNAL_ERROR, "decide returned nothing")
            self.fx.emit(
                EventKind.REASONING_FINISHED,
                Phase.REASON,
                {"model_call": model_call, "error": err.code.value},
            )
            # A retryable model-side failure (a provider's 429 or 5xx, a decide raising
            # RetryableToolError) gets a new model call under the run's RetryPolicy.
            if err.retryable:
                self._enter(Stage.IDLE)
                if self._retry_model(err, now):
                    return
            self._terminate(RunState.ERROR, err)
            return
        self._model_retries = 0
        self.decisions += 1
        self.transcript.append(DecisionEntry(model_call=model_call, decision=decision))
        self._unseen = ()  # the agent has decided with them
        self.fx.emit(
            EventKind.REASONING_FINISHED,
            Phase.REASON,
            {
                "model_call": model_call,
                **decision_preview(decision, self.tools),
                "input_tokens": decision.usage.input_tokens,
                "output_tokens": decision.usage.output_tokens,
            },
        )
        if isinstance(decision, Finish):
            self._on_finish(decision, verdict, now)
        elif self._over_token_budget():
            self._exhaust("token_budget", self.config.token_budget)
        elif isinstance(decision, AskUser):
            self._on_ask(decision, now)
        else:
            self._on_plan(decision, now)

    def tool_done(
        self, call_id: str, attempt: int, value: Any, error: AgentError | None, now: float
    ) -> None:
        """A worker finished attempt `attempt` of call `call_id` (value, or error)."""
        self._now = now
        call = self._find(call_id)
        if (
            self._stage is Stage.DONE
            or call is None
            or call.status is not CallStatus.RUNNING
            or call.attempt != attempt
            or call.retry_pending  # this attempt already ended (timed out or failed)
        ):
            self._m["late_results_dropped"] += 1
            return
        self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call_id)
        reason = call.cancel_reason or self._cancel_reason
        if error is None and reason is not None:
            # It saw the interrupt or cancel and returned: still cancelled (docs/steering.md).
            error = cancelled(reason, call, value=value)
            value = None
        if error is not None and self._should_retry(call, error, now):
            return
        self._complete(call, value, error, now)

    def timer(self, kind: TimerKind, key: str, attempt: int, now: float) -> None:
        """A timer fired."""
        self._now = now
        if self.state.is_terminal:
            return
        if kind is TimerKind.TOOL_TIMEOUT:
            self._on_tool_timeout(key, attempt, now)
        elif kind is TimerKind.TOOL_RETRY:
            call = self._find(key)
            if call is not None and call.retry_pending and call.attempt == attempt - 1:
                call.retry_pending = False
                self._dispatch_attempt(call, now)
        elif kind is TimerKind.MODEL_TIMEOUT:
            if self._model_in_flight and attempt == self.model_calls:
                self._on_model_timeout(now)
        elif kind is TimerKind.MODEL_RETRY:
            if self._stage is Stage.IDLE and self.state is RunState.RUNNING:
                # No model call in flight: a safe boundary (messages, budgets, checkpoint).
                self._boundary(now)
        elif kind is TimerKind.RUN_DEADLINE:
            self._on_deadline(now)
        elif kind is TimerKind.GRACE:
            self._on_grace(key, now)

    def cancel_now(self, reason: str, now: float) -> None:
        """The host cancelled: act before any result its cancellation provokes arrives.

        `RunHandle.cancel` tells this ahead of cancelling the run's scope, so a tool that
        stops on the signal reports after it; the stored `CancelRequest` follows with its seq.
        """
        self._now = now
        if self._stage is not Stage.DONE:
            self._on_cancel(reason, now)

    def abort(self, error: AgentError) -> None:
        """End the run in ERROR at once (a defect in the runtime): all work is abandoned."""
        for key in self._work_in_flight():
            self.fx.cancel_work(key, "aborted")
            self.fx.abandon_work(key)
        self._model_in_flight = False
        self._running = 0
        self._terminate(RunState.ERROR, error)

    def record_error(self, error: AgentError) -> None:
        """Record an error that does not change the run's course (a hook that raised, R13)."""
        self._record(error)

    def _on_user(self, msg: UserMessage, now: float) -> None:
        self._pending.append(msg)
        self.fx.emit(EventKind.MESSAGE_ACCEPTED, None, {"seq": msg.seq, "mode": msg.mode.value})
        if self._stage is Stage.WAITING_USER:
            self.waiting_for = None
            self._enter(Stage.IDLE)
            self._set_state(RunState.RUNNING)
            self._boundary(now)
        elif msg.mode is SteeringMode.INTERRUPT and self._stage is not Stage.CANCELLING:
            self._interrupt(now)

    def _on_finish(self, decision: Finish, verdict: str | None, now: float) -> None:
        if (
            verdict is None
            and any(isinstance(m, UserMessage) for m in self._pending)
            and self.model_calls < self.config.max_model_calls
        ):
            # A person spoke while the agent was concluding: the claim is made without their
            # message, which must not be lost (R20). The agent decides again with it.
            verdict = "new user messages arrived while the agent was finishing"
        if verdict is None:
            self.output = decision.output
            self._terminate(RunState.FINISHED, None)
            return
        # R9: a rejected claim goes back to the agent; the loop goes on.
        self._note(f"finish rejected: {verdict}", reason=verdict)
        self.fx.emit(EventKind.FINISH_REJECTED, Phase.OBSERVE, {"reason": verdict})
        self._enter(Stage.IDLE)
        self._boundary(now)

    def _on_ask(self, decision: AskUser, now: float) -> None:
        if any(isinstance(m, UserMessage) for m in self._pending):
            self._enter(Stage.IDLE)
            self._boundary(now)
            return
        self._enter(Stage.WAITING_USER)
        self.waiting_for = WaitingFor.USER
        self._set_state(RunState.WAITING, question=decision.question)
        self._checkpoint()
        self._parked_revision = self.revision

    def _boundary(self, now: float) -> None:
        """A safe boundary: apply the inbox, check budgets, checkpoint, then reason."""
        if self._holding:
            return  # a resume is still applying stored messages; it moves on after them
        # `delivered` is what no decision has answered yet: messages delivered at earlier
        # boundaries whose model call timed out or was interrupted, or that a resume found
        # after the last decision, stay news to the agent.
        delivered: list[UserMessage] = list(self._unseen)
        while self._pending:
            msg = self._pending.pop(0)
            if isinstance(msg, UserMessage):
                self.transcript.append(msg)
                delivered.append(msg)
                self._m["messages_delivered"] += 1
                self.fx.emit(
                    EventKind.MESSAGE_DELIVERED,
                    Phase.OBSERVE,
                    {"seq": msg.seq, "content": msg.content, "mode": msg.mode.value},
                )
        if self.model_calls >= self.config.max_model_calls:
            self._exhaust("max_model_calls", self.config.max_model_calls)
            return
        budget = self.config.token_budget
        if budget is not None and self.usage.total >= budget:
            self._exhaust("token_budget", budget)
            return
        self._unseen = tuple(delivered)
        self._checkpoint()
        self._reason(now, self._unseen)

    def _reason(self, now: float, delivered: tuple[UserMessage, ...] = ()) -> None:
        if self.model_calls >= self.config.max_model_calls:
            self._exhaust("max_model_calls", self.config.max_model_calls)
            return
        self.model_calls += 1
        self._enter(Stage.REASONING)
        self._model_in_flight = True
        self._reason_started = now
        deadline = now + self.config.model_timeout
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        self.fx.emit(EventKind.REASONING_STARTED, Phase.REASON, {"model_call": self.model_calls})
        self.fx.schedule(TimerKind.MODEL_TIMEOUT, MODEL_KEY, self.model_calls, deadline)
        self.fx.decide(self.model_calls, self.view(delivered, now), deadline)

    def view(self, delivered: tuple[UserMessage, ...] = (), now: float | None = None) -> RunView:
        """What the agent sees now (O(1): the transcript is shared, not copied)."""
        cfg = self.config
        seconds_left = None
        if self.deadline is not None:
            seconds_left = max(0.0, self.deadline - (self._now if now is None else now))
        budget = cfg.token_budget
        caps = self._view_caps
        if caps is None:
            tools = self.tools
            caps = self._view_caps = (
                tuple(tools[name].spec for name in sorted(tools)),
                tuple(sorted(self.subagents)),
            )
        return RunView(
            run_id=self.run_id,
            task=self.task,
            transcript=Transcript(self.transcript),
            delivered=delivered,
            usage=self.usage,
            model_calls=self.model_calls - 1
            if self._stage is Stage.REASONING
            else self.model_calls,
            steps=self.steps,
            budgets=Budgets(
                steps_left=cfg.max_steps - self.steps,
                model_calls_left=cfg.max_model_calls - self.model_calls + 1,
                tokens_left=None if budget is None else max(0, budget - self.usage.total),
                seconds_left=seconds_left,
            ),
            depth=self.depth,
            parent_run_id=self.parent_run_id,
            session_id=self.session_id,
            task_id=self.task_id,
            tools=caps[0],
            subagents=caps[1],
        )

    def _exhaust(self, budget: str, limit: int | None, **details: Any) -> None:
        self._terminate(
            RunState.EXHAUSTED,
            AgentError.of(
                ErrorCode.BUDGET_EXHAUSTED,
                f"budget {budget} used up (limit {limit})",
                budget=budget,
                limit=limit,
                **details,
            ),
        )

    def _terminate(self, state: RunState, error: AgentError | None) -> None:
        if self.state.is_terminal:
            return  # R8: terminal states are never overwritten
        if error is not None:
            self._record(error)
        for kind, key in RUN_TIMERS:
            self.fx.unschedule(kind, key)
        for call in self.plan:
            if call.status is CallStatus.RUNNING:
                self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call.call_id)
                self.fx.unschedule(TimerKind.TOOL_RETRY, call.call_id)
        self._enter(Stage.DONE)
        self.waiting_for = None
        self._set_state(state)
        self._checkpoint()
        outcome = self.outcome()
        self.fx.emit(
            EventKind.RUN_ENDED,
            None,
            {
                "state": state.value,
                "error": None if error is None else error.code.value,
                "message": None if error is None else preview(error.message),
                "output": preview(outcome.output),
                "revision": outcome.revision,
            },
        )
        self.fx.settled(outcome)

    def _enter(self, stage: Stage) -> None:
        """The one writer of the stage: every move is checked against STAGE_TRANSITIONS."""
        check_stage(self._stage, stage)
        self._stage = stage

    def _set_state(self, state: RunState, **data: Any) -> None:
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal transition {self.state} -> {state}")
        previous = self.state
        self.state = state
        self.fx.emit(
            EventKind.STATE_CHANGED,
            None,
            {
                "from": previous.value,
                "to": state.value,
                "waiting_for": None if self.waiting_for is None else self.waiting_for.value,
                **data,
            },
        )

    def _note(self, text: str, **data: Any) -> None:
        self.transcript.append(SystemNote(text=text, data=data))

    def _over_token_budget(self) -> bool:
        budget = self.config.token_budget
        return budget is not None and self.usage.total > budget

    def _add_phase(self, phase: Phase, seconds: float) -> None:
        self._phase_seconds[phase.value] = self._phase_seconds.get(phase.value, 0.0) + seconds
