"""Stopping work in the run machine: cancellation (R18), the grace period, model and run
timeouts (R14, R15), and abandoning work that does not stop (T3)."""

from __future__ import annotations

from typing import Any

from steerable.protocol import (
    AgentError,
    CallStatus,
    ErrorCode,
    EventKind,
    Phase,
    RunState,
)

from .base import (
    MODEL_KEY,
    PLAN_KEY,
    RUN_KEY,
    MachineBase,
    Stage,
    cancelled,
    jitter_unit,
)
from .effects import TimerKind

__all__ = ["StoppingMixin"]

_MAX_RETRY_AFTER = 3600.0
"""A provider's Retry-After beyond an hour is not waited for literally (the deadline rules)."""


class StoppingMixin(MachineBase):
    """The run machine's cancellation and timeouts (see `RunMachine`)."""

    def _on_cancel(self, reason: str, now: float) -> None:
        if self._cancel_reason is not None:
            return
        self._cancel_reason = reason
        if self._model_in_flight:
            self.fx.cancel_work(MODEL_KEY, reason)
        for call in self.plan:
            if call.retry_pending:
                self._complete(call, None, cancelled(reason, call), now, advance=False)
            elif call.status is CallStatus.RUNNING:
                self.fx.cancel_work(call.call_id, reason)
        if self.in_flight:
            self._enter(Stage.CANCELLING)
            self.fx.schedule(TimerKind.GRACE, RUN_KEY, 0, now + self.config.cancel_grace)
        else:
            self._finish_cancel(now, abandoned=[])

    def _on_model_timeout(self, now: float) -> None:
        self._model_in_flight = False
        self.fx.cancel_work(MODEL_KEY, "timeout")
        self.fx.abandon_work(MODEL_KEY)
        self._add_phase(Phase.REASON, now - self._reason_started)
        if self._stage is Stage.CANCELLING:
            self._model_discarded = False
            self._maybe_finish_cancel(now)  # a cancel is final: no retry, no new model call
            return
        self._enter(Stage.IDLE)
        error = AgentError.of(
            ErrorCode.PROVIDER_TIMEOUT,
            f"decide took longer than {self.config.model_timeout}s",
            model_call=self.model_calls,
        )
        if self._model_discarded:
            self._model_discarded = False
            self.fx.unschedule(TimerKind.GRACE, MODEL_KEY)  # the interrupt's wait is over
            self._boundary(now)
            return
        if not self._retry_model(error, now):
            self._terminate(RunState.ERROR, error)

    def _retry_model(self, error: AgentError, now: float) -> bool:
        """Schedule a new model call after a retryable failure; False when retries ran out.

        The delay is the policy's backoff, never shorter than a provider's `retry_after`
        (seconds, in the error's details), and never past the run's deadline.
        """
        policy = self.config.retry
        self._model_retries = retry = self._model_retries + 1
        at = now + policy.delay(retry, jitter_unit(self.run_id, retry))
        retry_after = error.details.get("retry_after")
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
            at = max(at, now + min(float(retry_after), _MAX_RETRY_AFTER))
        if retry > policy.max_retries or (self.deadline is not None and at >= self.deadline):
            return False
        self._m["retries"] += 1
        retried = error.model_copy(
            update={"details": {**error.details, "retried": True, "retry": retry}}
        )
        self.errors.append(retried)  # R6; its event says when the retry comes
        self.fx.emit(
            EventKind.ERROR,
            Phase.REASON,
            {"code": error.code.value, "retry": retry, "delay": at - now},
        )
        self.fx.schedule(TimerKind.MODEL_RETRY, MODEL_KEY, retry, at)
        return True

    def _on_deadline(self, now: float) -> None:
        killed: set[str] = set()
        for key in self._work_in_flight():
            self.fx.cancel_work(key, "timeout")
            if self.fx.abandon_work(key):
                killed.add(key)
        self._model_in_flight = False
        self._end_by_deadline(now, killed)

    def _end_by_deadline(self, now: float, killed: set[str] | frozenset[str] = frozenset()) -> None:
        """End the run in ERROR `timeout`: every call without a result is stopped by it.

        Its calls' results are journaled before the terminal checkpoint: a resume that finds
        one (`stopped_by_deadline`) ends the run here too, as the crashed process did.
        """
        for call in self.plan:
            if call.status is not CallStatus.DONE:
                error = AgentError.of(
                    ErrorCode.TIMEOUT,
                    f"{call.name} was stopped by the run's deadline",
                    tool=call.name,
                    call_id=call.call_id,
                    scope="run",
                    **({"killed": True} if call.call_id in killed else {}),
                )
                self._complete(call, None, error, now, advance=False)
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
            if self._stage is Stage.CANCELLING:
                self._finish_cancel(now, abandoned=[MODEL_KEY])  # the model never answered
                return
            self._enter(Stage.IDLE)
            self._note(f"model call {self.model_calls} was interrupted by a user message")
            self._boundary(now)
        elif key == PLAN_KEY and self._interrupting and self._stage is Stage.EXECUTING:
            for call in self.plan:
                if call.status is CallStatus.RUNNING:
                    self.fx.unschedule(TimerKind.TOOL_TIMEOUT, call.call_id)
                    was_killed = bool(self.fx.abandon_work(call.call_id))
                    self._complete(
                        call,
                        None,
                        cancelled("interrupt", call, abandoned=True, killed=was_killed),
                        now,
                        advance=False,
                    )
            self._after_call(now)
        elif key == RUN_KEY and self._stage is Stage.CANCELLING:
            abandoned: list[str] = []
            stopped: list[str] = []
            for work in self._work_in_flight():
                (stopped if self.fx.abandon_work(work) else abandoned).append(work)
            self._model_in_flight = False
            self._finish_cancel(now, abandoned=abandoned, killed=stopped)

    def _maybe_finish_cancel(self, now: float) -> None:
        if not self.in_flight:
            self._finish_cancel(now, abandoned=[])

    def _finish_cancel(
        self, now: float, abandoned: list[str], killed: list[str] | None = None
    ) -> None:
        reason = self._cancel_reason or "cancelled"
        self.fx.unschedule(TimerKind.GRACE, RUN_KEY)
        for call in self.plan:
            if call.status is not CallStatus.DONE:
                self._complete(
                    call,
                    None,
                    cancelled(
                        reason,
                        call,
                        abandoned=call.call_id in abandoned,
                        killed=killed is not None and call.call_id in killed,
                    ),
                    now,
                    advance=False,
                )
        data: dict[str, Any] = {"reason": reason, "abandoned": abandoned}
        details: dict[str, Any] = {"reason": reason, "abandoned": abandoned}
        if killed:  # only when a call was killed: thread-only runs record what they always did
            data["killed"] = details["killed"] = killed
        self.fx.emit(EventKind.RUN_CANCELLED, None, data)
        self._terminate(
            RunState.CANCELLED,
            AgentError.of(ErrorCode.CANCELLED, f"run cancelled: {reason}", **details),
        )

    def _work_in_flight(self) -> list[str]:
        keys = [
            c.call_id for c in self.plan if c.status is CallStatus.RUNNING and not c.retry_pending
        ]
        if self._model_in_flight:
            keys.append(MODEL_KEY)
        return keys
