"""Stopping a run: cancellation (R18), the grace periods, and the run's deadline (R14, R15).

`Stopping` owns the run's cancel reason; it stops the model call (`Reasoning`) and the plan's
calls (`Execution`) and ends the run through the machine (docs/steering.md, "Cancel").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from steerable.protocol import AgentError, ErrorCode, EventKind, RunState

from .base import MODEL_KEY, PLAN_KEY, RUN_KEY
from .effects import TimerKind
from .stage import Stage

if TYPE_CHECKING:
    from .execute import Execution
    from .machine import RunMachine
    from .reasoning import Reasoning

__all__ = ["Stopping"]


class Stopping:
    """Cancellation, grace periods and the deadline of one run.

    Attributes:
        reason: Why the run is being cancelled (None: it is not).
    """

    __slots__ = ("_exec", "_machine", "_model", "reason")

    def __init__(self, machine: RunMachine, model: Reasoning, execution: Execution) -> None:
        self._machine = machine
        self._model = model
        self._exec = execution
        self.reason: str | None = None

    def work_in_flight(self) -> list[str]:
        """Work keys of everything running: calls on workers, and the model call."""
        keys = self._exec.work_in_flight()
        if self._model.busy:
            keys.append(MODEL_KEY)
        return keys

    def abandon_all(self) -> None:
        """A defect ends the run at once: all work is signalled and abandoned."""
        fx = self._machine.fx
        for key in self.work_in_flight():
            fx.cancel_work(key, "aborted")
            fx.abandon_work(key)
        self._model.end()

    def cancel(self, reason: str, now: float) -> None:
        """The host cancelled: signal everything, wait `cancel_grace`, then end the run."""
        if self.reason is not None:
            return
        self.reason = reason
        m = self._machine
        if self._model.busy:
            m.fx.cancel_work(MODEL_KEY, reason)
        self._exec.cancel(reason, now)
        if m.in_flight:
            m.enter(Stage.CANCELLING)
            m.fx.schedule(TimerKind.GRACE, RUN_KEY, 0, now + m.config.cancel_grace)
        else:
            self.finish(now, abandoned=[])

    def deadline(self, now: float) -> None:
        """The run's total timeout fired: everything in flight is given up on."""
        fx = self._machine.fx
        killed: set[str] = set()
        for key in self.work_in_flight():
            fx.cancel_work(key, "timeout")
            if fx.abandon_work(key):
                killed.add(key)
        self._model.end()
        self.end_by_deadline(now, killed)

    def end_by_deadline(self, now: float, killed: set[str] | frozenset[str] = frozenset()) -> None:
        """End the run in ERROR `timeout`; its calls without a result are stopped by it."""
        self._exec.stop_by_deadline(now, killed)
        timeout = self._machine.config.total_timeout
        self._machine.terminate(
            RunState.ERROR,
            AgentError.of(
                ErrorCode.TIMEOUT,
                f"the run took longer than {timeout}s",
                scope="run",
                total_timeout=timeout,
            ),
        )

    def grace(self, key: str, now: float) -> None:
        """A grace period ended: what did not stop is abandoned (or killed)."""
        m = self._machine
        model = self._model
        if key == MODEL_KEY and model.discarded and model.busy:
            m.fx.abandon_work(MODEL_KEY)
            model.end()
            model.keep()
            m.fx.unschedule(TimerKind.MODEL_TIMEOUT, MODEL_KEY)
            if m.stage is Stage.CANCELLING:
                self.finish(now, abandoned=[MODEL_KEY])  # the model never answered
                return
            m.enter(Stage.IDLE)
            m.note(f"model call {m.model_calls} was interrupted by a user message")
            m.boundary(now)
        elif key == PLAN_KEY:
            self._exec.interrupt_grace(now)
        elif key == RUN_KEY and m.stage is Stage.CANCELLING:
            abandoned: list[str] = []
            stopped: list[str] = []
            for work in self.work_in_flight():
                (stopped if m.fx.abandon_work(work) else abandoned).append(work)
            model.end()
            self.finish(now, abandoned=abandoned, killed=stopped)

    def maybe_finish(self, now: float) -> None:
        """End a cancelled run once nothing is in flight."""
        if not self._machine.in_flight:
            self.finish(now, abandoned=[])

    def finish(self, now: float, abandoned: list[str], killed: list[str] | None = None) -> None:
        """The cancel is final: the calls end `cancelled`, then the run."""
        m = self._machine
        reason = self.reason or "cancelled"
        m.fx.unschedule(TimerKind.GRACE, RUN_KEY)
        self._exec.cancel_all(reason, abandoned, killed, now)
        data: dict[str, Any] = {"reason": reason, "abandoned": abandoned}
        details: dict[str, Any] = {"reason": reason, "abandoned": abandoned}
        if killed:  # only when a call was killed: thread-only runs record what they always did
            data["killed"] = details["killed"] = killed
        m.fx.emit(EventKind.RUN_CANCELLED, None, data)
        m.terminate(
            RunState.CANCELLED,
            AgentError.of(ErrorCode.CANCELLED, f"run cancelled: {reason}", **details),
        )
