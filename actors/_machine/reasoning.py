"""The run's model call: asking the agent, its answer arriving, its timeout and retries.

`Reasoning` owns the model call's state (in flight, discarded by an interrupt, when it
started) and the view the agent decides on. What the answer means for the run (finish, ask,
plan) is the machine's; `answered` only says whether there is an answer to act on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from steerable.protocol import (
    AgentError,
    AskUser,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunState,
    ToolSpec,
    UserMessage,
)
from steerable.protocol._built import built_budgets, built_view
from steerable.protocol._view import RunView, Transcript

from .base import MODEL_KEY, jitter_unit
from .effects import TimerKind
from .members import (
    KIND_REASONING_STARTED,
    PHASE_REASON,
    STAGE_CANCELLING,
    STAGE_DONE,
    STAGE_REASONING,
    TIMER_MODEL_TIMEOUT,
)
from .parts import REASON, Meter
from .stage import Stage

if TYPE_CHECKING:
    from .machine import RunMachine

__all__ = ["Reasoning"]

_MAX_RETRY_AFTER = 3600.0
"""A provider's Retry-After beyond an hour is not waited for literally (the deadline rules)."""


class Reasoning:
    """The model call of one run.

    Attributes:
        busy: A model call is in flight.
        discarded: An interrupting message arrived during it: its answer will be dropped.
        started: When it started (monotonic seconds).
    """

    __slots__ = (
        "_caps",
        "_machine",
        "_max_model_calls",
        "_max_steps",
        "_meter",
        "_model_timeout",
        "_token_budget",
        "busy",
        "discarded",
        "started",
    )

    def __init__(self, machine: RunMachine, meter: Meter) -> None:
        self._machine = machine
        self._meter = meter
        self.busy = False
        self.discarded = False
        self.started = 0.0
        self._caps: tuple[tuple[ToolSpec, ...], tuple[str, ...]] | None = None
        # Read at every model call: plain attributes, not pydantic field reads (RunConfig is
        # frozen).
        cfg = machine.config
        self._model_timeout = cfg.model_timeout
        self._max_steps = cfg.max_steps
        self._max_model_calls = cfg.max_model_calls
        self._token_budget = cfg.token_budget

    def end(self) -> None:
        """The call answered, timed out, or was given up on."""
        self.busy = False

    def keep(self) -> None:
        """The stale answer was dealt with (dropped, or the call was given up on)."""
        self.discarded = False

    def ask(self, now: float, delivered: tuple[UserMessage, ...]) -> None:
        """Start the next model call (at a safe boundary)."""
        m = self._machine
        model_call = self._meter.next_model_call()
        m.enter(STAGE_REASONING)
        self.busy = True
        self.started = now
        deadline = now + self._model_timeout
        if m.deadline is not None:
            deadline = min(deadline, m.deadline)
        m.fx.emit(KIND_REASONING_STARTED, PHASE_REASON, {"model_call": model_call})
        m.fx.schedule(TIMER_MODEL_TIMEOUT, MODEL_KEY, model_call, deadline)
        m.fx.decide(model_call, self.view(delivered, now), deadline)

    def view(self, delivered: tuple[UserMessage, ...] = (), now: float | None = None) -> RunView:
        """What the agent sees now (O(1): the transcript is shared, not copied)."""
        m = self._machine
        meter = self._meter
        seconds_left = None
        if m.deadline is not None:
            seconds_left = max(0.0, m.deadline - (meter.now if now is None else now))
        budget = self._token_budget
        caps = self._caps
        if caps is None:
            tools = m.tools
            caps = self._caps = (
                tuple(tools[name].spec for name in sorted(tools)),
                tuple(sorted(m.subagents)),
            )
        usage = meter.usage
        model_calls = meter.model_calls
        # Built through the slots (protocol/_built.py): the frozen dataclasses' own __init__
        # costs three times as much, once per model call.
        return built_view(
            m.run_id,
            m.task,
            Transcript(m.transcript),
            delivered,
            usage,
            model_calls - 1 if m.stage is STAGE_REASONING else model_calls,
            meter.steps,
            built_budgets(
                self._max_steps - meter.steps,  # steps_left
                self._max_model_calls - model_calls + 1,  # model_calls_left
                None if budget is None else max(0, budget - usage.total),  # tokens_left
                seconds_left,
            ),
            m.depth,
            m.parent_run_id,
            m.session_id,
            m.task_id,
            caps[0],  # tools
            caps[1],  # subagents
        )

    def answered(
        self,
        model_call: int,
        decision: Plan | Finish | AskUser | None,
        error: AgentError | None,
        elapsed: float,
        now: float,
    ) -> bool:
        """The agent's `decide` returned or raised; True if there is a decision to act on."""
        m = self._machine
        meter = self._meter
        if m.stage is STAGE_DONE or not self.busy or model_call != meter.model_calls:
            meter.count("late_results_dropped")
            return False
        self.busy = False
        m.fx.unschedule(TIMER_MODEL_TIMEOUT, MODEL_KEY)
        meter.add_phase(REASON, elapsed)
        if decision is not None:
            meter.add_usage(decision.usage)
        if m.stage is STAGE_CANCELLING:
            m.maybe_finish_cancel(now)
            return False
        if self.discarded:
            # An interrupting message arrived while the model was thinking: its answer is
            # stale. Deliver the message and ask again.
            self.discarded = False
            m.fx.unschedule(TimerKind.GRACE, MODEL_KEY)
            m.note(f"model call {model_call} was interrupted by a user message")
            m.enter(Stage.IDLE)
            m.boundary(now)
            return False
        if error is None and decision is not None:
            return True
        err = error or AgentError.of(ErrorCode.INTERNAL_ERROR, "decide returned nothing")
        m.fx.emit(
            EventKind.REASONING_FINISHED,
            PHASE_REASON,
            {"model_call": model_call, "error": err.code.value},
        )
        # A retryable model-side failure (a provider's 429 or 5xx, a decide raising
        # RetryableToolError) gets a new model call under the run's RetryPolicy.
        if err.retryable:
            m.enter(Stage.IDLE)
            if self._retry(err, now):
                return False
        m.terminate(RunState.ERROR, err)
        return False

    def interrupt(self, now: float) -> bool:
        """An interrupting message: a model call in flight is cancelled (its answer will be
        stale). False when there is none to interrupt."""
        if not self.busy or self.discarded:
            return False
        m = self._machine
        self.discarded = True
        m.fx.cancel_work(MODEL_KEY, "interrupt")
        grace = now + m.config.cancel_grace
        m.fx.schedule(TimerKind.GRACE, MODEL_KEY, self._meter.model_calls, grace)
        return True

    def timed_out(self, attempt: int, now: float) -> None:
        """The model call's timer fired (R15): it is given up on, then retried or the end."""
        if not self.busy or attempt != self._meter.model_calls:
            return
        m = self._machine
        self.busy = False
        m.fx.cancel_work(MODEL_KEY, "timeout")
        m.fx.abandon_work(MODEL_KEY)
        self._meter.add_phase(REASON, now - self.started)
        if m.stage is STAGE_CANCELLING:
            self.discarded = False
            m.maybe_finish_cancel(now)  # a cancel is final: no retry, no new model call
            return
        m.enter(Stage.IDLE)
        error = AgentError.of(
            ErrorCode.PROVIDER_TIMEOUT,
            f"decide took longer than {m.config.model_timeout}s",
            model_call=self._meter.model_calls,
        )
        if self.discarded:
            self.discarded = False
            m.fx.unschedule(TimerKind.GRACE, MODEL_KEY)  # the interrupt's wait is over
            m.boundary(now)
            return
        if not self._retry(error, now):
            m.terminate(RunState.ERROR, error)

    def _retry(self, error: AgentError, now: float) -> bool:
        """Schedule a new model call after a retryable failure; False when retries ran out.

        The delay is the policy's backoff, never shorter than a provider's `retry_after`
        (seconds, in the error's details), and never past the run's deadline.
        """
        m = self._machine
        policy = m.config.retry
        retry = self._meter.next_model_retry()
        at = now + policy.delay(retry, jitter_unit(m.run_id, retry))
        retry_after = error.details.get("retry_after")
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
            at = max(at, now + min(float(retry_after), _MAX_RETRY_AFTER))
        if retry > policy.max_retries or (m.deadline is not None and at >= m.deadline):
            return False
        self._meter.count("retries")
        details = {**error.details, "retried": True, "retry": retry}
        m.record(  # R6; its event says when the retry comes
            error.model_copy(update={"details": details}),
            PHASE_REASON,
            event={"code": error.code.value, "retry": retry, "delay": at - now},
        )
        m.fx.schedule(TimerKind.MODEL_RETRY, MODEL_KEY, retry, at)
        return True
