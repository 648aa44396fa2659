"""Work that runs off the supervisor: the agent's `decide`, tool calls, hooks.

Each job runs on a worker thread (or as a task on the runtime's event loop, for `async def`
code), contains everything its user code raises (docs/pykka.md T7), and reports back to its run's
supervisor with a `tell`. A job whose run has moved on (timed out, cancelled, ended) is simply
ignored when it reports: the supervisor correlates by call id and attempt.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import pykka
from pydantic import TypeAdapter, ValidationError

from steerable.actors._engine.cancel import Cancelled
from steerable.actors._engine.clock import Clock
from steerable.actors._engine.executor import Executor, OutcomeKind, RemoteHandle, RemoteOutcome
from steerable.actors._engine.inline import tell_collected
from steerable.actors._engine.log import get_logger
from steerable.actors._tools.remote import decode_result, encode_call
from steerable.actors._tools.tool import (
    RetryableToolError,
    Tool,
    ToolContext,
    error_from_exception,
    normalize_result,
)
from steerable.protocol import (
    AgentError,
    AskUser,
    Decision,
    ErrorCode,
    Finish,
    Plan,
    RunEvent,
    RunView,
    SteerableError,
    ToolCall,
)
from steerable.protocol.codec import MAX_VALUE_BYTES, check_storable

__all__ = [
    "Accept",
    "DecideJob",
    "Decided",
    "HookDone",
    "HookDrain",
    "HookJob",
    "ToolDone",
    "ToolJob",
    "coerce_decision",
]

_log = get_logger("steerable.jobs")
_DECISION = TypeAdapter(Decision)

Accept = Callable[[Any, RunView], "str | None"]
"""The run's delivery check (R9): None accepts the output, a string says what is missing."""


@dataclass(slots=True)
class Decided:
    """Message: the agent's decide returned for model call `model_call`."""

    model_call: int
    decision: Plan | Finish | AskUser | None
    verdict: str | None
    error: AgentError | None
    accept_error: AgentError | None
    elapsed: float


@dataclass(slots=True)
class ToolDone:
    """Message: attempt `attempt` of call `call_id` finished with a value or an error."""

    call_id: str
    attempt: int
    value: Any
    error: AgentError | None


@dataclass(slots=True)
class HookDone:
    """Message: one batch of hook callbacks ran; `errors` lists those that raised."""

    errors: list[AgentError]


def _tell(ref: pykka.ActorRef[Any], message: object) -> None:
    try:
        tell_collected(ref, message)  # on a worker: handled by it after the job (decision 0002)
    except pykka.ActorDeadError:
        # The run ended (or was passivated) before this late result: nothing waits for it.
        _log.debug("late_message_dropped", message=type(message).__name__)


def coerce_decision(value: object) -> Plan | Finish | AskUser:
    """Accept a decision model, or a dict in its JSON shape; anything else is invalid.

    Raises:
        ValueError: `value` is not a decision; the message says what it was.
    """
    if isinstance(value, Plan | Finish | AskUser):
        return value
    if isinstance(value, dict):
        try:
            return _DECISION.validate_python(value)
        except ValidationError as exc:
            raise ValueError(
                f"not a valid decision: {exc.error_count()} errors: "
                f"{exc.errors(include_url=False)[:3]}"
            ) from None
    raise ValueError(f"decide returned {type(value).__name__}, not Plan, Finish or AskUser")


def check_decision(decision: Plan | Finish | AskUser) -> None:
    """Refuse a decision a store could not keep (text that is not valid Unicode, a task larger
    than a value may be). A call's arguments are checked by the run machine, per call
    (`invalid_arguments` for that call alone); a Finish's output when it is normalized.

    Raises:
        ValueError: What cannot be stored; the run ends `invalid_decision`.
    """
    if isinstance(decision, Plan):
        what = "the plan (its thought, tool names or subagent tasks)"
        size = check_storable(decision.thought, what=what)
        for step in decision.steps:
            if isinstance(step, ToolCall):
                size += check_storable(step.name, what=what)
            else:
                size += check_storable(step.agent, what=what)
                size += check_storable(step.task, what=what)
        if size > MAX_VALUE_BYTES:
            raise ValueError(f"{what} is larger than the {MAX_VALUE_BYTES} bytes a value may take")
    elif isinstance(decision, AskUser):
        check_storable(decision.question, what="the question")


class DecideJob:
    """One model call: `agent.decide(view)`, then `accept(output, view)` on a Finish."""

    __slots__ = ("accept", "agent", "clock", "model_call", "ref", "view")

    def __init__(
        self,
        agent: Any,
        view: RunView,
        accept: Accept | None,
        ref: pykka.ActorRef[Any],
        model_call: int,
        clock: Clock,
    ) -> None:
        self.agent = agent
        self.view = view
        self.accept = accept
        self.ref = ref
        self.model_call = model_call
        self.clock = clock

    def run(self) -> None:
        """Run a sync `decide` on this (worker) thread."""
        started = self.clock.now()
        try:
            raw = self.agent.decide(self.view)
        except BaseException as exc:  # noqa: BLE001 - R7: contained and reported, never lost
            self.report(started, None, exc)
            return
        self.report(started, raw, None)

    def coroutine(self) -> Coroutine[Any, Any, Any]:
        """The `async def decide` coroutine, for the runtime's event loop."""
        result = self.agent.decide(self.view)
        if not inspect.isawaitable(result):
            raise TypeError("decide was declared async but returned no awaitable")
        return _await(result)

    def start_failed(self, exc: BaseException) -> None:
        """Called by the pool when no worker thread could be started for this call (T1)."""
        error = _no_thread(exc, model_call=self.model_call)
        _tell(self.ref, Decided(self.model_call, None, None, error, None, 0.0))

    def report(self, started: float, raw: object, exc: BaseException | None) -> None:
        """Turn decide's outcome into a `Decided` message (runs accept on a Finish)."""
        decision: Plan | Finish | AskUser | None = None
        error = accept_error = None
        verdict: str | None = None
        if exc is not None:
            error = _decide_error(exc)
        else:
            try:
                decision = coerce_decision(raw)
                check_decision(decision)
            except (TypeError, ValueError) as bad:
                decision = None
                error = AgentError.of(
                    ErrorCode.INVALID_DECISION, str(bad), returned=type(raw).__name__
                )
        if isinstance(decision, Finish):
            decision, verdict, accept_error, error = self._check_finish(decision)
        _tell(
            self.ref,
            Decided(
                self.model_call, decision, verdict, error, accept_error, self.clock.now() - started
            ),
        )

    def _check_finish(
        self, decision: Finish
    ) -> tuple[Finish | None, str | None, AgentError | None, AgentError | None]:
        try:
            output = normalize_result(decision.output)
        except Exception as exc:  # noqa: BLE001 - an unstorable output is an invalid decision
            return (
                None,
                None,
                None,
                AgentError.of(ErrorCode.INVALID_DECISION, f"Finish.output cannot be stored: {exc}"),
            )
        if output is not decision.output:
            decision = Finish(output=output, usage=decision.usage)
        check = getattr(self.agent, "check_finish", None)
        if check is not None:
            # The agent's own check (a model adapter validating structured output) comes
            # first: its verdict goes back to the model as a correction (R9), like accept's.
            try:
                own = check(output, self.view)
            except Exception as exc:  # noqa: BLE001 - a broken check is the agent's defect
                err = AgentError.of(
                    ErrorCode.HANDLER_ERROR, f"check_finish raised {exc!r}", where="check_finish"
                )
                return decision, f"the agent's output check failed: {exc!r}", err, None
            if own is not None:
                return decision, str(own), None, None
        if self.accept is None:
            return decision, None, None, None
        try:
            verdict = self.accept(output, self.view)
        except Exception as exc:  # noqa: BLE001 - R9: an unverifiable claim is not accepted
            err = AgentError.of(ErrorCode.HANDLER_ERROR, f"accept raised {exc!r}", where="accept")
            return decision, f"the acceptance check failed: {exc!r}", err, None
        return decision, None if verdict is None else str(verdict), None, None


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _decide_error(exc: BaseException) -> AgentError:
    """What the machine is told when decide raised (docs/models.md "Errors and retries").

    A `SteerableError` (a model adapter's `ProviderError`) keeps its own error and
    retryability; `RetryableToolError` gives a retryable `handler_error`; a cancellation
    gives `cancelled`; anything else a final `handler_error`.
    """
    if isinstance(exc, SteerableError):
        return exc.error
    if isinstance(exc, Cancelled | asyncio.CancelledError):
        return AgentError.of(ErrorCode.CANCELLED, "the model call was cancelled")
    retryable = isinstance(exc, RetryableToolError)
    details: dict[str, Any] = {"exception": type(exc).__qualname__}
    if isinstance(exc, RetryableToolError):
        retry_after = exc.details.get("retry_after")
        if isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
            details["retry_after"] = float(retry_after)
    return AgentError.of(
        ErrorCode.HANDLER_ERROR,
        f"the agent's decide raised {type(exc).__name__}: {exc}",
        retryable=retryable,
        **details,
    )


class ToolJob:
    """One attempt of one tool call, with its context (cancel scope, deadline, key)."""

    __slots__ = ("arguments", "ctx", "ref", "tool")

    def __init__(
        self,
        tool: Tool[Any, Any],
        arguments: dict[str, Any],
        ctx: ToolContext,
        ref: pykka.ActorRef[Any],
    ) -> None:
        self.tool = tool
        self.arguments = arguments
        self.ctx = ctx
        self.ref = ref

    def run(self) -> None:
        """Run a sync tool on this (worker) thread."""
        try:
            value = self.tool.invoke(self.arguments, self.ctx)
        except BaseException as exc:  # noqa: BLE001 - R7: one failing call never fails the run
            self.report(None, exc)
            return
        self.report(value, None)

    def coroutine(self) -> Coroutine[Any, Any, Any]:
        """The `async def` tool's coroutine, for the runtime's event loop."""
        return self.tool.invoke_async(self.arguments, self.ctx)

    def report(self, value: object, exc: BaseException | None) -> None:
        """Normalise the result (or error) and tell the supervisor."""
        ctx = self.ctx
        error = None
        if exc is None:
            try:
                value = normalize_result(value, max_bytes=self.tool.max_result_bytes, tool=ctx.tool)
            except BaseException as bad:  # noqa: BLE001
                exc = bad
        if exc is not None:
            value = None
            error = error_from_exception(exc, tool=ctx.tool, call_id=ctx.call_id)
        _tell(self.ref, ToolDone(ctx.call_id, ctx.attempt, value, error))

    def cancel_pending(self) -> None:
        """Called by the pool when it drops this job unrun (shutdown)."""
        self.report(None, RuntimeError("the runtime shut down before the call ran"))

    def start_failed(self, exc: BaseException) -> None:
        """Called by the pool when no worker thread could be started for this call (T1)."""
        ctx = self.ctx
        error = _no_thread(exc, tool=ctx.tool, call_id=ctx.call_id)
        _tell(self.ref, ToolDone(ctx.call_id, ctx.attempt, None, error))

    def submit_remote(self, executor: Executor) -> RemoteHandle | None:
        """Run the call on `executor` (a worker process, a Ray task); never blocks.

        The call's cancel scope is forwarded to where it runs (the cooperative signal); the
        supervisor kills it through the returned handle. None: the call could not be sent (the
        error is already reported).
        """
        try:
            task = encode_call(self.tool, self.arguments, self.ctx)
        except ValueError as exc:
            self.report(None, exc)
            return None
        try:
            handle = executor.submit(task, self.remote_done)
        except Exception as exc:  # noqa: BLE001 - an executor that fails (Ray gone): typed error
            self.report(None, RuntimeError(f"the executor refused the call: {exc!r}"))
            return None
        self.ctx.on_cancel(handle.signal)
        return handle

    def remote_done(self, outcome: RemoteOutcome) -> None:
        """The executor's report of the call (on its thread): tell the supervisor."""
        ctx = self.ctx
        kind = outcome.kind
        value: Any = None
        error: AgentError | None = None
        if kind is OutcomeKind.DONE and outcome.payload is not None:
            value, error = decode_result(outcome.payload)
        elif kind is OutcomeKind.CRASHED:
            error = AgentError.of(
                ErrorCode.TOOL_CRASHED,
                f"tool {ctx.tool!r} crashed: {outcome.message}",
                tool=ctx.tool,
                call_id=ctx.call_id,
                **dict(outcome.details),
                **self.tool.executor_options,
            )
        elif kind is OutcomeKind.CANCELLED:
            error = AgentError.of(
                ErrorCode.CANCELLED,
                f"tool {ctx.tool!r} was {outcome.message}",
                tool=ctx.tool,
                call_id=ctx.call_id,
                reason=ctx.scope.reason or "cancelled",
            )
        else:
            error = AgentError.of(
                ErrorCode.HANDLER_ERROR,
                f"tool {ctx.tool!r} could not run: {outcome.message}",
                tool=ctx.tool,
                call_id=ctx.call_id,
                outcome=kind.value,
            )
        _tell(self.ref, ToolDone(ctx.call_id, ctx.attempt, value, error))


def _no_thread(exc: BaseException, **details: Any) -> AgentError:
    """The error of a job the pool accepted but could start no worker thread for (T1)."""
    return AgentError.of(
        ErrorCode.RESOURCE_EXHAUSTED,
        f"no worker thread could be started: {type(exc).__name__}: {exc}",
        **details,
    )


class HookJob:
    """Lifecycle hooks of one event (R13): each callback runs; those that raise are reported."""

    __slots__ = ("callbacks", "event", "ref")

    def __init__(
        self,
        callbacks: Sequence[Callable[[RunEvent], object]],
        event: RunEvent,
        ref: pykka.ActorRef[Any],
    ) -> None:
        self.callbacks = callbacks
        self.event = event
        self.ref = ref

    def run(self) -> None:
        """Run every callback; never raises."""
        errors: list[AgentError] = []
        for callback in self.callbacks:
            try:
                callback(self.event)
            except BaseException as exc:  # noqa: BLE001 - R13: a hook never breaks the run
                hook = self.event.hook
                errors.append(
                    AgentError.of(
                        ErrorCode.HOOK_ERROR,
                        f"hook {getattr(callback, '__qualname__', callback)!r} "
                        f"raised {type(exc).__name__}: {exc}",
                        hook=None if hook is None else hook.value,
                        event=self.event.kind.value,
                        exception=type(exc).__qualname__,
                    )
                )
        _tell(self.ref, HookDone(errors))

    def cancel_pending(self) -> None:
        """Called by the pool when it drops this job unrun (shutdown)."""
        _tell(self.ref, HookDone([]))

    def start_failed(self, exc: BaseException) -> None:
        """Called by the pool when no worker thread could be started for these hooks (T1)."""
        hook = self.event.hook
        error = _no_thread(
            exc, hook=None if hook is None else hook.value, event=self.event.kind.value
        )
        _tell(self.ref, HookDone([error]))


class HookDrain:
    """Counts the runs whose outcome is published while their hooks still run.

    A run's hooks that are pending when it ends (`on_finish` always is) run after its outcome
    is published (docs/states-and-errors.md "Phases and hooks"); `Runtime.shutdown` waits for
    them, within its timeout, before it stops the dispatcher that chains them.
    """

    __slots__ = ("_cond", "_count")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._count = 0

    def enter(self) -> None:
        """A run ended with hooks pending."""
        with self._cond:
            self._count += 1

    def leave(self) -> None:
        """That run's hooks are done (or were given up)."""
        with self._cond:
            self._count -= 1
            if self._count <= 0:
                self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block until no run drains hooks, at most `timeout` seconds; True if none does."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count <= 0, max(0.0, timeout))
