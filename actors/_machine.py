"""The run's state machine: pure, single-threaded, driven by messages, acting through a port.

`RunMachine` owns one run's state: lifecycle state, transcript, the ordered inbox of host
messages, the current plan and its calls, budgets and errors. Each public method handles one
message and acts only through `Effects` (dispatch, timers, events, checkpoints): no threads, no
clock reads (time arrives as `now`), no I/O. The RunSupervisor actor feeds it; tests feed it
directly and record its effects.

Safe boundaries (API.md): a checkpoint is written after a decision is recorded and its calls
are keyed (before dispatch), at the boundary after a plan's results are all in (before the
next model call), when the run starts waiting, and at a terminal state. Nowhere else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import Enum
from typing import Any, Protocol

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
    HostMessage,
    Phase,
    Plan,
    RunConfig,
    RunMetrics,
    RunOutcome,
    RunState,
    SideEffect,
    SteeringMode,
    SubagentCall,
    SubagentResult,
    SystemNote,
    ToolCall,
    ToolResult,
    ToolSpec,
    TranscriptEntry,
    Usage,
    UserMessage,
    WaitingFor,
)
from steerable.protocol._ids import call_id as make_call_id
from steerable.protocol._ids import idempotency_key
from steerable.protocol._state import TRANSITIONS
from steerable.protocol._view import Budgets, RunView, Transcript

from ._effects import CallJob, Effects, TimerKind

__all__ = ["MODEL_KEY", "RunMachine", "ToolLike"]

MODEL_KEY = "model"
"""The work key of the run's model call (tool calls use their call id)."""
_RUN_KEY = "run"
_PLAN_KEY = "plan"
_RUN_TIMERS = (
    (TimerKind.RUN_DEADLINE, _RUN_KEY),
    (TimerKind.MODEL_TIMEOUT, MODEL_KEY),
    (TimerKind.MODEL_RETRY, MODEL_KEY),
    (TimerKind.GRACE, _RUN_KEY),
    (TimerKind.GRACE, _PLAN_KEY),
    (TimerKind.GRACE, MODEL_KEY),
)


class ToolLike(Protocol):
    """What the machine needs of a tool: its spec and a pure argument validator."""

    @property
    def spec(self) -> ToolSpec: ...

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]: ...


class _Stage(Enum):
    """Where the loop stands (finer than RunState)."""

    IDLE = 0
    REASONING = 1
    EXECUTING = 2
    WAITING_USER = 3
    CANCELLING = 4
    DONE = 5


class _Call:
    """One call of the current plan. Mutable: only the machine touches it."""

    __slots__ = (
        "arguments",
        "attempt",
        "call_id",
        "cancel_reason",
        "first_dispatch",
        "index",
        "key",
        "kind",
        "name",
        "needs_approval",
        "result",
        "retry_pending",
        "spec",
        "status",
    )

    def __init__(
        self,
        index: int,
        call_id: str,
        kind: str,
        name: str,
        arguments: dict[str, Any],
        key: str,
        spec: ToolSpec | None,
    ) -> None:
        self.index = index
        self.call_id = call_id
        self.kind = kind
        self.name = name
        self.arguments = arguments
        self.key = key
        self.spec = spec
        self.status = CallStatus.PENDING
        self.attempt = 0
        self.result: ToolResult | SubagentResult | None = None
        self.first_dispatch = 0.0
        self.needs_approval = spec is not None and spec.requires_approval
        self.cancel_reason: str | None = None
        self.retry_pending = False

    def snapshot(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "kind": self.kind,
            "name": self.name,
            "arguments": self.arguments,
            "idempotency_key": self.key,
            "status": self.status.value,
            "attempts": self.attempt,
            "child_run_id": None,
        }


def _jitter_unit(key: str, attempt: int) -> float:
    # Deterministic jitter: replays and tests see the same delays; distinct keys still spread.
    digest = hashlib.blake2b(f"{key}/{attempt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


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
        self.compatibility = compatibility or Compatibility()
        self.capabilities = capabilities
        # Dumped once: the checkpoint snapshot reuses these on every boundary.
        self._static = {
            "config": config.model_dump(mode="json"),
            "capabilities": capabilities.model_dump(mode="json"),
            "compatibility": self.compatibility.model_dump(mode="json"),
        }

        self.state = RunState.IDLE
        self.waiting_for: WaitingFor | None = None
        self._stage = _Stage.IDLE
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
        self.plan: list[_Call] = []
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

    # ------------------------------------------------------------------ introspection

    @property
    def is_terminal(self) -> bool:
        """Whether the run has reached a terminal state."""
        return self.state.is_terminal

    def pending_approvals(self) -> list[_Call]:
        """Calls of the current plan waiting for a person."""
        return [c for c in self.plan if c.status is CallStatus.AWAITING_APPROVAL]

    @property
    def in_flight(self) -> bool:
        """Whether a model call or a tool call is under way."""
        return self._model_in_flight or self._running > 0

    # ------------------------------------------------------------------ messages

    def start(self, now: float) -> None:
        """Begin the run: the first boundary, then the first model call."""
        if self.state is not RunState.IDLE:
            return
        self._started_at = now
        self._now = now
        if self.config.total_timeout is not None:
            self.deadline = now + self.config.total_timeout
            self.fx.schedule(TimerKind.RUN_DEADLINE, _RUN_KEY, 0, self.deadline)
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
        if not self._model_in_flight or model_call != self.model_calls:
            self._m["late_results_dropped"] += 1
            return
        self._model_in_flight = False
        self.fx.unschedule(TimerKind.MODEL_TIMEOUT, MODEL_KEY)
        self._add_phase(Phase.REASON, elapsed)
        if decision is not None:
            self.usage = self.usage + decision.usage
        if self._stage is _Stage.CANCELLING:
            self._maybe_finish_cancel(now)
            return
        if self._model_discarded:
            # An interrupting message arrived while the model was thinking: its answer is
            # stale. Deliver the message and ask again.
            self._model_discarded = False
            self.fx.unschedule(TimerKind.GRACE, MODEL_KEY)
            self._note(f"model call {model_call} was interrupted by a user message")
            self._stage = _Stage.IDLE
            self._boundary(now)
            return
        if error is not None or decision is None:
            err = error or AgentError.of(ErrorCode.INTERNAL_ERROR, "decide returned nothing")
            self.fx.emit(
                EventKind.REASONING_FINISHED,
                Phase.REASON,
                {"model_call": model_call, "error": err.code.value},
            )
            self._terminate(RunState.ERROR, err)
            return
        self._model_retries = 0
        self.decisions += 1
        self.transcript.append(DecisionEntry(model_call=model_call, decision=decision))
        self.fx.emit(
            EventKind.REASONING_FINISHED,
            Phase.REASON,
            {"model_call": model_call, "decision": decision.kind},
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
        if call is None or call.status is not CallStatus.RUNNING or call.attempt != attempt:
            self._m["late_results_dropped"] += 1
            return
        self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call_id)
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
            if self._stage is _Stage.IDLE and self.state is RunState.RUNNING:
                self._reason(now)
        elif kind is TimerKind.RUN_DEADLINE:
            self._on_deadline(now)
        elif kind is TimerKind.GRACE:
            self._on_grace(key, now)

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
        self.errors.append(error)
        self.fx.emit(EventKind.ERROR, None, {"code": error.code.value, "message": error.message})

    # ------------------------------------------------------------------ host messages

    def _on_user(self, msg: UserMessage, now: float) -> None:
        self._pending.append(msg)
        self.fx.emit(EventKind.MESSAGE_ACCEPTED, None, {"seq": msg.seq, "mode": msg.mode.value})
        if self._stage is _Stage.WAITING_USER:
            self._set_state(RunState.RUNNING)
            self._boundary(now)
        elif msg.mode is SteeringMode.INTERRUPT and self._stage is not _Stage.CANCELLING:
            self._interrupt(now)

    def _interrupt(self, now: float) -> None:
        if self._model_in_flight and not self._model_discarded:
            self._model_discarded = True
            self.fx.cancel_work(MODEL_KEY, "interrupt")
            self.fx.schedule(
                TimerKind.GRACE, MODEL_KEY, self.model_calls, now + self.config.cancel_grace
            )
        elif self._stage is _Stage.EXECUTING and not self._interrupting:
            self._interrupting = True
            for call in self.plan:
                unstarted = call.status in (CallStatus.PENDING, CallStatus.AWAITING_APPROVAL)
                if unstarted or call.retry_pending:
                    self._complete(call, None, _cancelled("interrupt", call), now, advance=False)
                elif call.status is CallStatus.RUNNING:
                    call.cancel_reason = "interrupt"
                    self.fx.cancel_work(call.call_id, "interrupt")
            if self._running:
                self.fx.schedule(TimerKind.GRACE, _PLAN_KEY, 0, now + self.config.cancel_grace)
            self._after_call(now)

    def _on_approval(self, msg: ApprovalDecision, now: float) -> None:
        call = self._find(msg.call_id)
        if call is None or call.status is not CallStatus.AWAITING_APPROVAL:
            return
        self.fx.emit(
            EventKind.APPROVAL_SETTLED,
            Phase.EXECUTE,
            {"call_id": call.call_id, "approved": msg.approved, "reason": msg.reason},
        )
        if msg.approved:
            call.status = CallStatus.PENDING
            call.needs_approval = False
        else:
            error = AgentError.of(
                ErrorCode.APPROVAL_DENIED,
                f"a person denied {call.name}: {msg.reason or 'no reason'}",
                call_id=call.call_id,
                tool=call.name,
                reason=msg.reason,
            )
            self._complete(call, None, error, now, advance=False)
        if not self.pending_approvals() and self.state is RunState.WAITING:
            self.waiting_for = None
            self._set_state(RunState.RUNNING)
        self._after_call(now)

    def _on_cancel(self, reason: str, now: float) -> None:
        if self._cancel_reason is not None:
            return
        self._cancel_reason = reason
        if self._model_in_flight:
            self.fx.cancel_work(MODEL_KEY, reason)
        for call in self.plan:
            if call.retry_pending:
                self._complete(call, None, _cancelled(reason, call), now, advance=False)
            elif call.status is CallStatus.RUNNING:
                self.fx.cancel_work(call.call_id, reason)
        if self.in_flight:
            self._stage = _Stage.CANCELLING
            self.fx.schedule(TimerKind.GRACE, _RUN_KEY, 0, now + self.config.cancel_grace)
        else:
            self._finish_cancel(now, abandoned=[])

    # ------------------------------------------------------------------ decisions

    def _on_finish(self, decision: Finish, verdict: str | None, now: float) -> None:
        if verdict is None:
            self.output = decision.output
            self._terminate(RunState.FINISHED, None)
            return
        # R9: a rejected claim goes back to the agent; the loop goes on.
        self._note(f"finish rejected: {verdict}", reason=verdict)
        self.fx.emit(EventKind.FINISH_REJECTED, Phase.OBSERVE, {"reason": verdict})
        self._stage = _Stage.IDLE
        self._boundary(now)

    def _on_ask(self, decision: AskUser, now: float) -> None:
        if any(isinstance(m, UserMessage) for m in self._pending):
            self._stage = _Stage.IDLE
            self._boundary(now)
            return
        self._stage = _Stage.WAITING_USER
        self.waiting_for = WaitingFor.USER
        self._set_state(RunState.WAITING, question=decision.question)
        self._checkpoint()

    def _on_plan(self, plan: Plan, now: float) -> None:
        if not plan.steps:
            self._terminate(
                RunState.ERROR,
                AgentError.of(
                    ErrorCode.INVALID_DECISION,
                    "the agent returned an empty plan: no progress possible (R11)",
                ),
            )
            return
        self.fx.emit(EventKind.PLANNING_STARTED, Phase.PLAN, {"steps": len(plan.steps)})
        calls: list[_Call] = []
        executable = 0
        for index, step in enumerate(plan.steps):
            cid = make_call_id(self.decisions, index)
            key = idempotency_key(self.run_id, cid)
            call, ok = self._plan_call(index, cid, key, step)
            calls.append(call)
            executable += ok
        steps_left = self.config.max_steps - self.steps
        if executable > steps_left:
            # No half-run plans (API.md "Budgets at the edge").
            self._exhaust(
                "max_steps", self.config.max_steps, planned=executable, steps_left=steps_left
            )
            return
        self.plan = calls
        self._interrupting = False
        approvals = [c for c in calls if c.status is CallStatus.AWAITING_APPROVAL]
        self.fx.emit(
            EventKind.PLANNING_FINISHED,
            Phase.PLAN,
            {"calls": [c.call_id for c in calls], "approvals": len(approvals)},
        )
        self._checkpoint()
        self._stage = _Stage.EXECUTING
        self._exec_started = now
        self.fx.emit(EventKind.EXECUTE_STARTED, Phase.EXECUTE, {"calls": len(calls)})
        for call in approvals:
            self.fx.emit(
                EventKind.APPROVAL_REQUESTED,
                Phase.EXECUTE,
                {"call_id": call.call_id, "tool": call.name, "arguments": call.arguments},
            )
        if approvals:
            self.waiting_for = WaitingFor.APPROVAL
            self._set_state(RunState.WAITING, approvals=len(approvals))
        self._after_call(now)

    def _plan_call(
        self, index: int, cid: str, key: str, step: ToolCall | SubagentCall
    ) -> tuple[_Call, bool]:
        """Turn one plan step into a call; unknown tools and bad arguments resolve at once."""
        if isinstance(step, SubagentCall):
            call = _Call(index, cid, "subagent", step.agent, {"task": step.task}, key, None)
            call.status = CallStatus.DONE
            call.result = SubagentResult(
                call_id=cid,
                agent=step.agent,
                child_run_id="",
                state=RunState.ERROR,
                ok=False,
                error=AgentError.of(
                    ErrorCode.UNKNOWN_AGENT,
                    f"no subagent named {step.agent!r} is available",
                    agent=step.agent,
                ),
            )
            return call, False
        tool = self.tools.get(step.name)
        if tool is None:
            call = _Call(index, cid, "tool", step.name, dict(step.arguments), key, None)
            self._resolve_now(
                call,
                AgentError.of(
                    ErrorCode.UNKNOWN_TOOL,
                    f"no tool named {step.name!r}",
                    tool=step.name,
                    call_id=cid,
                    available=sorted(self.tools),
                ),
            )
            return call, False
        try:
            arguments = tool.validate(step.arguments)
        except Exception as exc:  # noqa: BLE001 - any validator failure is the agent's bad input
            error = getattr(exc, "error", None)
            if not isinstance(error, AgentError):
                error = AgentError.of(ErrorCode.INVALID_ARGUMENTS, str(exc), tool=step.name)
            call = _Call(index, cid, "tool", step.name, dict(step.arguments), key, tool.spec)
            self._resolve_now(call, error)
            return call, False
        call = _Call(index, cid, "tool", step.name, arguments, key, tool.spec)
        if call.needs_approval:
            call.status = CallStatus.AWAITING_APPROVAL
        return call, True

    def _resolve_now(self, call: _Call, error: AgentError) -> None:
        call.status = CallStatus.DONE
        call.result = ToolResult(
            call_id=call.call_id, tool=call.name, ok=False, error=error, attempts=0
        )
        self._m["tool_errors"] += 1

    # ------------------------------------------------------------------ execution

    def _after_call(self, now: float) -> None:
        """Dispatch what the parallel limit allows; complete the plan when every call is done."""
        if self._stage is _Stage.CANCELLING:
            self._maybe_finish_cancel(now)
            return
        if self._stage is not _Stage.EXECUTING:
            return
        limit = self.config.max_parallel_tools
        if not self._interrupting and self._cancel_reason is None:
            for call in self.plan:
                if self._running >= limit:
                    break
                if call.status is CallStatus.PENDING:
                    call.status = CallStatus.RUNNING
                    self._running += 1
                    self.steps += 1  # R27: a validated, approved execution is one tool step
                    call.first_dispatch = now
                    self._dispatch_attempt(call, now)
        if self._running == 0 and all(c.status is CallStatus.DONE for c in self.plan):
            self._plan_complete(now)

    def _dispatch_attempt(self, call: _Call, now: float) -> None:
        call.attempt += 1
        call.retry_pending = False
        spec = call.spec
        timeout = (
            spec.timeout
            if spec is not None and spec.timeout is not None
            else self.config.step_timeout
        )
        deadline = now + timeout
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)  # R14: never past the run's remaining time
        self.fx.schedule(TimerKind.TOOL_TIMEOUT, call.call_id, call.attempt, deadline)
        if call.attempt == 1:
            self.fx.emit(
                EventKind.TOOL_STARTED, Phase.EXECUTE, {"call_id": call.call_id, "tool": call.name}
            )
        self.fx.dispatch(
            CallJob(call.call_id, call.name, call.arguments, call.key, call.attempt, deadline)
        )

    def _should_retry(self, call: _Call, error: AgentError, now: float) -> bool:
        """R16: retry retryable failures of none/idempotent tools, with backoff, in time."""
        spec = call.spec
        if not error.retryable or spec is None or spec.side_effect is SideEffect.WRITE:
            return False
        if self._interrupting or self._cancel_reason is not None or call.cancel_reason:
            return False
        retry = call.attempt  # the retry about to happen is number `attempt`
        policy = self.config.retry
        if retry > policy.max_retries:
            return False
        at = now + policy.delay(retry, _jitter_unit(call.key, retry))
        if self.deadline is not None and at >= self.deadline:
            return False
        self._m["retries"] += 1
        self.fx.emit(
            EventKind.TOOL_RETRY,
            Phase.EXECUTE,
            {
                "call_id": call.call_id,
                "tool": call.name,
                "attempt": call.attempt + 1,
                "delay": at - now,
                "error": error.code.value,
            },
        )
        self.fx.schedule(TimerKind.TOOL_RETRY, call.call_id, call.attempt + 1, at)
        call.retry_pending = True
        return True

    def _complete(
        self, call: _Call, value: Any, error: AgentError | None, now: float, *, advance: bool = True
    ) -> None:
        previous = call.status
        call.status = CallStatus.DONE
        call.retry_pending = False
        if previous is CallStatus.RUNNING:
            self._running -= 1
            self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call.call_id)
            self.fx.unschedule(TimerKind.TOOL_RETRY, call.call_id)
        elif (
            previous is CallStatus.AWAITING_APPROVAL
            and error is not None
            and error.code is not ErrorCode.APPROVAL_DENIED
        ):
            self.fx.emit(
                EventKind.APPROVAL_SETTLED,
                Phase.EXECUTE,
                {"call_id": call.call_id, "approved": False, "reason": error.message},
            )
        duration = now - call.first_dispatch if call.first_dispatch else 0.0
        result = ToolResult(
            call_id=call.call_id,
            tool=call.name,
            ok=error is None,
            value=value if error is None else None,
            error=error,
            attempts=call.attempt,
            duration=duration,
        )
        call.result = result
        if error is not None:
            self._m["tool_errors"] += 1
        self.fx.journal(result)
        self.fx.emit(
            EventKind.TOOL_FINISHED,
            Phase.EXECUTE,
            {
                "call_id": call.call_id,
                "tool": call.name,
                "ok": error is None,
                "error": None if error is None else error.code.value,
                "attempts": call.attempt,
            },
        )
        if advance:
            self._after_call(now)

    def _on_tool_timeout(self, call_id: str, attempt: int, now: float) -> None:
        call = self._find(call_id)
        if call is None or call.status is not CallStatus.RUNNING or call.attempt != attempt:
            return
        # R15: control returns at once; the thread may never return, so it is abandoned.
        self.fx.cancel_work(call_id, "timeout")
        self.fx.abandon_work(call_id)
        spec = call.spec
        write = spec is not None and spec.side_effect is SideEffect.WRITE
        if write:
            error = AgentError.of(
                ErrorCode.SIDE_EFFECT_UNKNOWN,
                f"{call.name} timed out; its side effect may or may not have happened",
                tool=call.name,
                call_id=call_id,
                side_effect="unknown",
                idempotency_key=call.key,
            )
        else:
            error = AgentError.of(
                ErrorCode.TIMEOUT,
                f"{call.name} timed out",
                retryable=True,
                tool=call.name,
                call_id=call_id,
            )
        if not write and self._should_retry(call, error, now):
            return
        self._complete(call, None, error, now)

    def _plan_complete(self, now: float) -> None:
        self.fx.unschedule(TimerKind.GRACE, _PLAN_KEY)
        for call in self.plan:
            if call.result is not None:
                self.transcript.append(call.result)
        self._add_phase(Phase.EXECUTE, now - self._exec_started)
        self.fx.emit(
            EventKind.EXECUTE_FINISHED,
            Phase.EXECUTE,
            {"calls": len(self.plan), "interrupted": self._interrupting},
        )
        self.plan = []
        self._interrupting = False
        self._stage = _Stage.IDLE
        if self.state is RunState.WAITING:
            self.waiting_for = None
            self._set_state(RunState.RUNNING)
        self._boundary(now)

    # ------------------------------------------------------------------ boundaries

    def _boundary(self, now: float) -> None:
        """A safe boundary: apply the inbox, check budgets, checkpoint, then reason."""
        delivered: list[UserMessage] = []
        while self._pending:
            msg = self._pending.pop(0)
            if isinstance(msg, UserMessage):
                self.transcript.append(msg)
                delivered.append(msg)
                self._m["messages_delivered"] += 1
                self.fx.emit(EventKind.MESSAGE_DELIVERED, Phase.OBSERVE, {"seq": msg.seq})
        if self.model_calls >= self.config.max_model_calls:
            self._exhaust("max_model_calls", self.config.max_model_calls)
            return
        budget = self.config.token_budget
        if budget is not None and self.usage.total >= budget:
            self._exhaust("token_budget", budget)
            return
        self._checkpoint()
        self._reason(now, tuple(delivered))

    def _reason(self, now: float, delivered: tuple[UserMessage, ...] = ()) -> None:
        if self.model_calls >= self.config.max_model_calls:
            self._exhaust("max_model_calls", self.config.max_model_calls)
            return
        self.model_calls += 1
        self._stage = _Stage.REASONING
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
        return RunView(
            run_id=self.run_id,
            task=self.task,
            transcript=Transcript(self.transcript),
            delivered=delivered,
            usage=self.usage,
            model_calls=self.model_calls - 1
            if self._stage is _Stage.REASONING
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
        )

    def _on_model_timeout(self, now: float) -> None:
        self._model_in_flight = False
        self.fx.cancel_work(MODEL_KEY, "timeout")
        self.fx.abandon_work(MODEL_KEY)
        self._add_phase(Phase.REASON, now - self._reason_started)
        self._stage = _Stage.IDLE
        error = AgentError.of(
            ErrorCode.PROVIDER_TIMEOUT,
            f"decide took longer than {self.config.model_timeout}s",
            model_call=self.model_calls,
        )
        if self._model_discarded:
            self._model_discarded = False
            self._boundary(now)
            return
        policy = self.config.retry
        self._model_retries += 1
        at = now + policy.delay(self._model_retries, _jitter_unit(self.run_id, self._model_retries))
        if self._model_retries > policy.max_retries or (
            self.deadline is not None and at >= self.deadline
        ):
            self._terminate(RunState.ERROR, error)
            return
        self._m["retries"] += 1
        self.fx.emit(
            EventKind.ERROR,
            Phase.REASON,
            {"code": error.code.value, "retry": self._model_retries, "delay": at - now},
        )
        self.fx.schedule(TimerKind.MODEL_RETRY, MODEL_KEY, self._model_retries, at)

    def _on_deadline(self, now: float) -> None:
        for key in self._work_in_flight():
            self.fx.cancel_work(key, "timeout")
            self.fx.abandon_work(key)
        self._model_in_flight = False
        for call in self.plan:
            if call.status is not CallStatus.DONE:
                self._complete(
                    call,
                    None,
                    AgentError.of(
                        ErrorCode.TIMEOUT,
                        f"{call.name} was stopped by the run's deadline",
                        tool=call.name,
                        call_id=call.call_id,
                        scope="run",
                    ),
                    now,
                    advance=False,
                )
        self._terminate(
            RunState.ERROR,
            AgentError.of(
                ErrorCode.TIMEOUT,
                f"the run took longer than {self.config.total_timeout}s",
                scope="run",
                total_timeout=self.config.total_timeout,
            ),
        )

    def _on_grace(self, key: str, now: float) -> None:
        if key == MODEL_KEY and self._model_discarded and self._model_in_flight:
            self.fx.abandon_work(MODEL_KEY)
            self._model_in_flight = False
            self._model_discarded = False
            self.fx.unschedule(TimerKind.MODEL_TIMEOUT, MODEL_KEY)
            self._stage = _Stage.IDLE
            self._note(f"model call {self.model_calls} was interrupted by a user message")
            self._boundary(now)
        elif key == _PLAN_KEY and self._interrupting and self._stage is _Stage.EXECUTING:
            for call in self.plan:
                if call.status is CallStatus.RUNNING:
                    self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call.call_id)
                    self.fx.abandon_work(call.call_id)
                    self._complete(
                        call,
                        None,
                        _cancelled("interrupt", call, abandoned=True),
                        now,
                        advance=False,
                    )
            self._after_call(now)
        elif key == _RUN_KEY and self._stage is _Stage.CANCELLING:
            abandoned = self._work_in_flight()
            for work in abandoned:
                self.fx.abandon_work(work)
            self._model_in_flight = False
            self._finish_cancel(now, abandoned=abandoned)

    def _maybe_finish_cancel(self, now: float) -> None:
        if not self.in_flight:
            self._finish_cancel(now, abandoned=[])

    def _finish_cancel(self, now: float, abandoned: list[str]) -> None:
        reason = self._cancel_reason or "cancelled"
        self.fx.unschedule(TimerKind.GRACE, _RUN_KEY)
        for call in self.plan:
            if call.status is not CallStatus.DONE:
                self._complete(
                    call,
                    None,
                    _cancelled(reason, call, abandoned=call.call_id in abandoned),
                    now,
                    advance=False,
                )
        self.fx.emit(EventKind.RUN_CANCELLED, None, {"reason": reason, "abandoned": abandoned})
        self._terminate(
            RunState.CANCELLED,
            AgentError.of(
                ErrorCode.CANCELLED, f"run cancelled: {reason}", reason=reason, abandoned=abandoned
            ),
        )

    def _work_in_flight(self) -> list[str]:
        keys = [
            c.call_id for c in self.plan if c.status is CallStatus.RUNNING and not c.retry_pending
        ]
        if self._model_in_flight:
            keys.append(MODEL_KEY)
        return keys

    # ------------------------------------------------------------------ endings

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
            self.errors.append(error)
            self.fx.emit(
                EventKind.ERROR, None, {"code": error.code.value, "message": error.message}
            )
        for kind, key in _RUN_TIMERS:
            self.fx.unschedule(kind, key)
        for call in self.plan:
            if call.status is CallStatus.RUNNING:
                self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call.call_id)
                self.fx.unschedule(TimerKind.TOOL_RETRY, call.call_id)
        self._stage = _Stage.DONE
        self.waiting_for = None
        self._set_state(state)
        self._checkpoint()
        outcome = self.outcome()
        self.fx.emit(
            EventKind.RUN_ENDED,
            None,
            {"state": state.value, "error": None if error is None else error.code.value},
        )
        self.fx.settled(outcome)

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

    # ------------------------------------------------------------------ helpers

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

    def _find(self, call_id: str) -> _Call | None:
        for call in self.plan:
            if call.call_id == call_id:
                return call
        return None

    def _over_token_budget(self) -> bool:
        budget = self.config.token_budget
        return budget is not None and self.usage.total > budget

    def _add_phase(self, phase: Phase, seconds: float) -> None:
        self._phase_seconds[phase.value] = self._phase_seconds.get(phase.value, 0.0) + seconds

    def _checkpoint(self) -> None:
        self.revision += 1
        self._m["checkpoints"] += 1
        start = self._checkpointed_len
        entries = self.transcript[start:]
        self._checkpointed_len = len(self.transcript)
        self.fx.checkpoint(self.revision, self.snapshot(), start, entries)

    def snapshot(self) -> dict[str, Any]:
        """The run's state as a `RunSnapshot` body (JSON shape), built without validation."""
        return {
            "run_id": self.run_id,
            "revision": self.revision,
            "trace_id": self.trace_id,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "parent_run_id": self.parent_run_id,
            "depth": self.depth,
            "forked_from": None,
            "task": self.task,
            "agent": self.agent,
            "state": self.state.value,
            "waiting_for": None if self.waiting_for is None else self.waiting_for.value,
            **self._static,
            "model_calls": self.model_calls,
            "steps": self.steps,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            },
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
            "deadline_left": None if self.deadline is None else max(0.0, self.deadline - self._now),
            "created_at": self.created_at,
            "updated_at": self.created_at,
        }


def _cancelled(reason: str, call: _Call, *, abandoned: bool = False) -> AgentError:
    return AgentError.of(
        ErrorCode.CANCELLED,
        f"{call.name} was cancelled ({reason})",
        call_id=call.call_id,
        tool=call.name,
        reason=reason,
        abandoned=abandoned,
    )
