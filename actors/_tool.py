"""Tools: the `@tool` decorator, the per-call `ToolContext`, and the conversions around a call.

A tool is a plain function (or `async def`). Decoration inspects its signature once and builds
a pydantic validator and JSON schema from the annotations, so the hot path (validate, invoke)
does no reflection and creates no classes. Conversions at the edges keep the runtime honest:
arguments become a dict or `ToolArgumentsError` (R5), exceptions become an `AgentError`
(R6: contained, never lost), results become msgpack-able JSON-like data for checkpoints.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
import sys
import threading
import traceback
import types
import typing
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

import msgpack
import pydantic
import structlog
from pydantic_core import PydanticUndefined, to_jsonable_python

from steerable.protocol._capabilities import SideEffect, ToolSpec
from steerable.protocol._errors import AgentError, ErrorCode, SteerableError

from ._cancel import Cancelled, CancelScope

__all__ = [
    "RetryableToolError",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolResultError",
    "error_from_exception",
    "normalize_result",
    "tool",
]

P = ParamSpec("P")
R = TypeVar("R")

_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
# Bounds that keep an error small enough for a checkpoint and an agent's context window.
_MAX_REPORTED_ERRORS = 20
_MAX_MESSAGE_ERRORS = 5
_TRACEBACK_FRAMES = 5
_MAX_TRACEBACK_CHARS = 4_000
_MAX_TEXT_CHARS = 1_000


class RetryableToolError(Exception):
    """Raise from a tool to mark its failure retryable.

    The runtime retries a retryable failure of a `none` or `idempotent` tool under the run's
    retry policy; a `write` tool's failure is reported, never retried.

    Args:
        message: What went wrong, for the agent and the host.
        details: Structured context merged into the error's details; keep it JSON-like.
    """

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})


class ToolArgumentsError(SteerableError):
    """A tool call's arguments did not validate; carries code `invalid_arguments`.

    `error.details` holds `tool` and `errors`, a list of `{"loc", "msg", "type"}` dicts.
    """


class ToolResultError(SteerableError):
    """A tool's result cannot be stored (not serializable, or too large); code `handler_error`."""


class ToolContext:
    """What a running tool may know about its call; one per call attempt, immutable.

    A tool receives it by declaring a parameter annotated `ToolContext` (any name).

    Args:
        run_id: The run the call belongs to.
        trace_id: The trace shared by the run and its subruns.
        call_id: The call's id, stable across attempts and re-dispatch.
        tool: The tool's name.
        idempotency_key: Stable per call, reused if the call is re-dispatched after a crash
            (R4); a tool that writes should deduplicate by it.
        attempt: 1 for the first try, 2 for the first retry, and so on.
        deadline: Monotonic deadline in seconds on the runtime's clock, or None.
        scope: The call's cancel scope.
        now: The runtime's monotonic clock reading (`Clock.now`), used by `remaining()`.
    """

    __slots__ = (
        "_log",
        "_now",
        "attempt",
        "call_id",
        "deadline",
        "idempotency_key",
        "run_id",
        "scope",
        "tool",
        "trace_id",
    )

    run_id: str
    trace_id: str
    call_id: str
    tool: str
    idempotency_key: str
    attempt: int
    deadline: float | None
    scope: CancelScope
    _now: Callable[[], float]
    _log: Any

    def __init__(
        self,
        *,
        run_id: str,
        trace_id: str,
        call_id: str,
        tool: str,
        idempotency_key: str,
        attempt: int,
        deadline: float | None,
        scope: CancelScope,
        now: Callable[[], float],
    ) -> None:
        if attempt < 1:
            raise ValueError(f"attempt counts from 1, got {attempt}")
        init = object.__setattr__  # the class refuses assignment once built
        init(self, "run_id", run_id)
        init(self, "trace_id", trace_id)
        init(self, "call_id", call_id)
        init(self, "tool", tool)
        init(self, "idempotency_key", idempotency_key)
        init(self, "attempt", attempt)
        init(self, "deadline", deadline)
        init(self, "scope", scope)
        init(self, "_now", now)
        init(self, "_log", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ToolContext is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ToolContext is immutable; cannot delete {name!r}")

    @property
    def cancelled(self) -> bool:
        """Whether the call has been cancelled (timeout, host cancel, interrupt, parent run)."""
        return self.scope.cancelled

    @property
    def cancel_event(self) -> threading.Event:
        """The `threading.Event` set on cancellation, for `select`-style waits."""
        return self.scope.event

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """A structlog logger bound with run_id, trace_id, call_id and tool."""
        # Built on first use: most calls never log, and binding is not free on the hot path.
        logger = self._log
        if logger is None:
            logger = structlog.get_logger("steerable.tool").bind(
                run_id=self.run_id, trace_id=self.trace_id, call_id=self.call_id, tool=self.tool
            )
            object.__setattr__(self, "_log", logger)
        return cast("structlog.typing.FilteringBoundLogger", logger)

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - self._now())

    def wait(self, timeout: float | None) -> bool:
        """Sleep up to `timeout` seconds, waking at once on cancellation.

        Use it instead of `time.sleep`, so that a cancel stops the tool within microseconds.

        Returns:
            True if the call was cancelled, False if the time ran out.
        """
        return self.scope.wait(timeout)

    def raise_if_cancelled(self) -> None:
        """Raise `Cancelled` if the call has been cancelled."""
        self.scope.raise_if_cancelled()

    def on_cancel(self, cb: Callable[[str], None]) -> Callable[[], None]:
        """Call `cb(reason)` once on cancellation (at once if already); returns unregister.

        Use it to abort blocking I/O: close a socket, kill a subprocess, end a stream. `cb`
        runs on the cancelling thread, so it must be quick and thread-safe.
        """
        return self.scope.on_cancel(cb)

    def __repr__(self) -> str:
        return (
            f"<ToolContext tool={self.tool!r} call_id={self.call_id!r} attempt={self.attempt} "
            f"cancelled={self.cancelled}>"
        )


class Tool(Generic[P, R]):
    """A function the runtime can call from a plan: what `@tool` returns.

    Calling the `Tool` calls the function directly (a `ToolContext` parameter must then be
    passed explicitly). The runtime instead uses `validate()` then `invoke()` or
    `invoke_async()`.

    Args:
        fn: The function; its parameters must be nameable (no `*args`, `**kwargs` or
            positional-only parameters).
        name: The tool's name in plans; defaults to `fn.__name__`.
        side_effect: "none", "idempotent" or "write" (see `SideEffect`).
        timeout: Seconds one call may take (> 0); None uses the run's `step_timeout`.
        requires_approval: Whether each call waits for a person's approval.
        honors_idempotency_key: Whether the tool deduplicates by `ctx.idempotency_key`.
        version: The author's version string, compared on resume.
        description: Shown to models; defaults to the docstring's first paragraph.
        namespace: Extra names for resolving string annotations (locals of the defining
            function when decorated with `@tool`).

    Attributes:
        spec: The tool's `ToolSpec`, with the JSON schema of its arguments.
        fn: The original function.
        is_async: Whether `fn` is an `async def`.
        wants_context: Whether `fn` has a `ToolContext` parameter.
    """

    spec: ToolSpec
    fn: Callable[P, R]
    is_async: bool
    wants_context: bool

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str | None = None,
        side_effect: str | SideEffect = SideEffect.NONE,
        timeout: float | None = None,
        requires_approval: bool = False,
        honors_idempotency_key: bool = False,
        version: str = "1",
        description: str | None = None,
        namespace: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {fn!r}")
        if isinstance(fn, Tool):
            raise TypeError(f"{fn!r} is already a tool; decorate the function once")
        name = _check_name(fn, name)
        # __name__, __doc__, __wrapped__... for introspection; not fn.__dict__, which could
        # hold names that clash with ours.
        functools.update_wrapper(self, fn, updated=())
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"tool {name!r}: generators are not supported; return a value")
        self.fn = fn
        self.is_async = _is_async(fn)
        parameters = _tool_parameters(fn, name, namespace)
        context_params = [p.name for p in parameters if _is_context_param(p)]
        if len(context_params) > 1:
            raise TypeError(
                f"tool {name!r} has more than one ToolContext parameter: {context_params}"
            )
        self._context_param = context_params[0] if context_params else None
        self.wants_context = self._context_param is not None
        model, self._fields = _arguments_model(
            name, [p for p in parameters if not _is_context_param(p)]
        )
        # The compiled core validator, kept so that validate() skips BaseModel's Python layer.
        self._validator = model.__pydantic_validator__
        self.spec = ToolSpec(
            name=name,
            description=_description(fn) if description is None else description,
            side_effect=_check_side_effect(side_effect),
            timeout=_check_timeout(timeout),
            requires_approval=requires_approval,
            honors_idempotency_key=honors_idempotency_key,
            version=_check_version(version),
            json_schema=_json_schema(model, name),
        )

    @property
    def name(self) -> str:
        """The tool's name (`spec.name`)."""
        return self.spec.name

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a call's arguments against the signature (pydantic lax mode).

        Args:
            arguments: Argument name -> value, as a plan gives them (JSON-like).

        Returns:
            A new dict of parameter name -> validated value, defaults filled in; the input to
            `invoke()` / `invoke_async()`.

        Raises:
            ToolArgumentsError: Missing, unknown or invalid arguments (code
                `invalid_arguments`, with the errors in `details`).
        """
        try:
            validated = self._validator.validate_python(arguments)
        except pydantic.ValidationError as exc:
            raise _arguments_error(self.spec.name, exc) from None
        values = validated.__dict__
        return {param: values[field] for field, param in self._fields}

    def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Run a sync tool with arguments already returned by `validate()`.

        The arguments are not validated again: validation may not be idempotent (a validator
        that transforms its input), and the runtime validates before approval anyway.

        Raises:
            Cancelled: The call was cancelled before the tool started.
            TypeError: The tool is `async def` (use `invoke_async`).
        """
        if self.is_async:
            raise TypeError(f"tool {self.spec.name!r} is async; use invoke_async()")
        ctx.raise_if_cancelled()
        fn: Callable[..., Any] = self.fn
        return fn(**self._call_arguments(arguments, ctx))

    async def invoke_async(self, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        """Run an async tool with arguments already returned by `validate()`.

        Cancelling `ctx.scope` (from any thread) cancels the tool's coroutine through asyncio
        as well; the call then raises `Cancelled`, not `asyncio.CancelledError`. A cancel of
        the calling task by someone else still propagates as `asyncio.CancelledError`.

        Raises:
            Cancelled: The call was cancelled (before it started, or while it ran).
            TypeError: The tool is not `async def` (use `invoke`).
        """
        if not self.is_async:
            raise TypeError(f"tool {self.spec.name!r} is not async; use invoke()")
        ctx.raise_if_cancelled()
        fn: Callable[..., Coroutine[Any, Any, Any]] = cast("Any", self.fn)
        coroutine = fn(**self._call_arguments(arguments, ctx))
        task = asyncio.current_task()
        if task is None:  # not inside a task (a bare coroutine driven by hand): no bridge
            return await coroutine
        bridge = _CancelBridge(task, asyncio.get_running_loop())
        unregister = ctx.on_cancel(bridge.request)
        try:
            return await coroutine
        except asyncio.CancelledError:
            if bridge.take_own_cancel():
                raise Cancelled(ctx.scope.reason or "cancelled") from None
            raise
        finally:
            unregister()
            bridge.close()

    def _call_arguments(self, arguments: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if self._context_param is None:
            return arguments
        kwargs = dict(arguments)  # never mutate the caller's (possibly recorded) dict
        kwargs[self._context_param] = ctx
        return kwargs

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function directly, bypassing validation and the runtime."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.spec.name!r} side_effect={self.spec.side_effect.value}>"


class _CancelBridge:
    """Turns a scope cancel (any thread) into a cancel of one asyncio task, exactly once.

    Everything but `request` runs on the loop's thread, so the flags need no lock.
    """

    __slots__ = ("_closed", "_fired", "_loop", "_task")

    def __init__(self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> None:
        self._task = task
        self._loop = loop
        self._fired = False
        self._closed = False

    def request(self, reason: str) -> None:
        # Runs on the cancelling thread: hop onto the loop's thread.
        try:
            self._loop.call_soon_threadsafe(self._fire, reason)
        except RuntimeError:  # the loop is closed: the call is over, nothing to cancel
            return

    def _fire(self, reason: str) -> None:
        # A request that lands after the call ended must not cancel the caller's next await.
        if not self._closed:
            self._fired = True
            self._task.cancel(msg=reason)

    def take_own_cancel(self) -> bool:
        """Undo our cancel; True if it was the only one (no one else cancelled the task)."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() == 0

    def close(self) -> None:
        self._closed = True
        if self._fired:  # the tool swallowed our CancelledError: leave the task as it was
            self._fired = False
            self._task.uncancel()


@overload
def tool(fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    side_effect: str | SideEffect = SideEffect.NONE,
    timeout: float | None = None,
    requires_approval: bool = False,
    honors_idempotency_key: bool = False,
    version: str = "1",
    description: str | None = None,
) -> Callable[[Callable[P, R]], Tool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    side_effect: str | SideEffect = SideEffect.NONE,
    timeout: float | None = None,
    requires_approval: bool = False,
    honors_idempotency_key: bool = False,
    version: str = "1",
    description: str | None = None,
) -> Tool[P, R] | Callable[[Callable[P, R]], Tool[P, R]]:
    """Make a function a tool; usable as `@tool` and `@tool(...)`.

    Args:
        fn: The function (when used as bare `@tool`).
        name: The tool's name in plans; defaults to the function's name. Must match
            `[A-Za-z_][A-Za-z0-9_.-]{0,63}`.
        side_effect: "none" (reads only), "idempotent" or "write"; default "none".
        timeout: Seconds one call may take (> 0); default None (the run's `step_timeout`).
        requires_approval: Whether each call waits for a person's approval; default False.
        honors_idempotency_key: Whether the tool deduplicates by `ctx.idempotency_key`, so
            a write may be re-dispatched after a crash; default False.
        version: The author's version string, compared on resume; default "1".
        description: Shown to models; default the docstring's first paragraph.

    Returns:
        A `Tool`, or a decorator that makes one.

    Raises:
        ValueError: A bad name, side effect, timeout or version.
        TypeError: A signature the runtime cannot call by name, or an annotation pydantic
            cannot validate.
    """
    options: dict[str, Any] = {
        "name": name,
        "side_effect": side_effect,
        "timeout": timeout,
        "requires_approval": requires_approval,
        "honors_idempotency_key": honors_idempotency_key,
        "version": version,
        "description": description,
    }
    if fn is not None:
        return Tool(fn, namespace=_caller_locals(), **options)
    # Fail at the decorator line, not at the function below it, when the options are wrong.
    _check_side_effect(side_effect)
    _check_timeout(timeout)
    _check_version(version)
    if name is not None:
        _check_name(None, name)

    def decorate(fn: Callable[P, R]) -> Tool[P, R]:
        return Tool(fn, namespace=_caller_locals(), **options)

    return decorate


def error_from_exception(exc: BaseException, *, tool: str, call_id: str) -> AgentError:
    """Convert what a tool raised into the error result the agent sees (R5, R6).

    `RetryableToolError` gives a retryable `handler_error`; `Cancelled` and
    `asyncio.CancelledError` give `cancelled`; a `SteerableError` keeps its own error; any
    other exception, including `SystemExit` and `KeyboardInterrupt` (contained, not obeyed),
    gives `handler_error`. The details are msgpack-able: tool, call_id, the exception's type
    name and a short traceback string, never the traceback object.

    Args:
        exc: The exception the tool raised.
        tool: The tool's name.
        call_id: The call's id.
    """
    kind = _type_name(exc)
    base: dict[str, Any] = {"tool": tool, "call_id": call_id, "exception": kind}
    if isinstance(exc, Cancelled | asyncio.CancelledError):
        reason = exc.reason if isinstance(exc, Cancelled) else (_text(exc) or "cancelled")
        return AgentError.of(
            ErrorCode.CANCELLED, f"tool {tool!r} was cancelled: {reason}", reason=reason, **base
        )
    if isinstance(exc, SteerableError):
        return exc.error.model_copy(update={"details": {**exc.error.details, **base}})
    trace = _short_traceback(exc)
    if trace:
        base["traceback"] = trace
    text = _text(exc)
    if isinstance(exc, RetryableToolError):
        # Built directly: the author's details may use any key, even "code" or "message".
        return AgentError(
            code=ErrorCode.HANDLER_ERROR,
            message=f"tool {tool!r} failed (retryable): {text}",
            retryable=True,
            details={**_jsonable_details(exc.details), **base},
        )
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if not isinstance(exc, Exception):
        # R6: SystemExit, KeyboardInterrupt, GeneratorExit from a tool must not stop the
        # runtime's thread; it is reported like any other failure.
        message = f"tool {tool!r} raised {said} (contained; the runtime did not exit)"
    else:
        message = f"tool {tool!r} raised {said}"
    return AgentError.of(ErrorCode.HANDLER_ERROR, message, retryable=False, **base)


def normalize_result(value: Any, *, max_bytes: int = 1_000_000, tool: str | None = None) -> Any:
    """Convert a tool's result to JSON-like data fit for a checkpoint and an agent.

    Pydantic models, dataclasses, tuples, sets, datetimes, enums, UUIDs and the like are
    converted with pydantic's `to_jsonable_python`; bytes become base64 text; `SecretStr` and
    `SecretBytes` stay masked.

    Args:
        value: What the tool returned.
        max_bytes: The largest result accepted, measured as msgpack bytes; default 1,000,000.
        tool: The tool's name, for the error message and details; default None.

    Raises:
        ToolResultError: The value cannot be converted, or is larger than `max_bytes`
            (code `handler_error`).
    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    label = "tool" if tool is None else f"tool {tool!r}"
    named: dict[str, Any] = {} if tool is None else {"tool": tool}
    try:
        data = to_jsonable_python(value, bytes_mode="base64")
        # The size check doubles as the proof that the checkpoint codec can store it.
        size = len(msgpack.packb(data))
    except Exception as exc:  # whatever fails, the result cannot be stored
        raise ToolResultError(
            AgentError.of(
                ErrorCode.HANDLER_ERROR,
                f"result of {label} is not serializable: {_type_name(exc)}: {_text(exc)}",
                result_type=_type_name(value),
                **named,
            )
        ) from exc
    if size > max_bytes:
        raise ToolResultError(
            AgentError.of(
                ErrorCode.HANDLER_ERROR,
                f"result of {label} is too large: {size} bytes, limit {max_bytes}",
                size=size,
                limit=max_bytes,
                **named,
            )
        )
    return data


# --- decoration helpers -------------------------------------------------------------------


def _check_name(fn: Callable[..., Any] | None, name: str | None) -> str:
    if name is None:
        name = getattr(fn, "__name__", None)
        if not isinstance(name, str):
            raise TypeError(f"{fn!r} has no __name__; give the tool a name=")
    if not isinstance(name, str) or not _NAME_PATTERN.match(name):
        raise ValueError(
            f"invalid tool name {name!r}: must match {_NAME_PATTERN.pattern} "
            "(a letter or _, then up to 63 letters, digits, _ . -)"
        )
    return name


def _check_side_effect(side_effect: str | SideEffect) -> SideEffect:
    try:
        return SideEffect(side_effect)
    except ValueError:
        allowed = ", ".join(repr(s.value) for s in SideEffect)
        raise ValueError(f"unknown side_effect {side_effect!r}: use one of {allowed}") from None


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be seconds as a number, got {timeout!r}")
    if not timeout > 0:  # also rejects NaN
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    return float(timeout)


def _check_version(version: str) -> str:
    if not isinstance(version, str) or not version:
        raise ValueError(f"version must be a non-empty string, got {version!r}")
    return version


def _caller_locals() -> dict[str, Any] | None:
    # Two frames up is the code that wrote `@tool`: its locals resolve string annotations of
    # a tool defined inside a function (as pydantic does for models).
    frame = sys._getframe(2)
    if frame.f_locals is frame.f_globals:
        return None
    return dict(frame.f_locals)


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - a callable object's method
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(call)


def _annotation_target(fn: Callable[..., Any]) -> Any:
    # get_type_hints reads functions, not partials or callable objects.
    if isinstance(fn, functools.partial):
        return _annotation_target(fn.func)
    if inspect.isroutine(fn) or inspect.isclass(fn):
        return fn
    return type(fn).__call__


def _type_hints(
    fn: Callable[..., Any], name: str, namespace: Mapping[str, Any] | None
) -> dict[str, Any]:
    target = _annotation_target(fn)
    try:
        try:
            return typing.get_type_hints(target, include_extras=True)
        except NameError:
            if not namespace:
                raise
            # The defining function's locals only as a fallback, so they never shadow globals.
            return typing.get_type_hints(target, localns=dict(namespace), include_extras=True)
    except Exception as exc:  # a bad annotation fails in many ways; report them all alike
        raise TypeError(f"tool {name!r}: cannot resolve its annotations: {exc}") from exc


def _tool_parameters(
    fn: Callable[..., Any], name: str, namespace: Mapping[str, Any] | None
) -> list[inspect.Parameter]:
    """The parameters of `fn`, each with its resolved annotation (Any when unannotated)."""
    signature = inspect.signature(fn)
    hints = _type_hints(fn, name, namespace)
    out: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise TypeError(
                f"tool {name!r}: {star}{param.name} is not supported; plans pass arguments "
                "by name, so every parameter must be named"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(
                f"tool {name!r}: positional-only parameter {param.name!r} is not supported; "
                "plans pass arguments by name"
            )
        out.append(param.replace(annotation=hints.get(param.name, Any)))
    return out


def _is_context_param(param: inspect.Parameter) -> bool:
    hint = param.annotation
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `ToolContext | None`
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(members) == 1:
            hint = members[0]
    return isinstance(hint, type) and issubclass(hint, ToolContext)


def _arguments_model(
    name: str, parameters: list[inspect.Parameter]
) -> tuple[type[pydantic.BaseModel], tuple[tuple[str, str], ...]]:
    # Fields get neutral names (p0, p1, ...) and the parameter's name as alias, so that a
    # parameter called `json`, `schema` or `model_name` neither shadows BaseModel attributes
    # nor trips pydantic's protected namespaces; errors and schema use the aliases.
    fields: dict[str, Any] = {}
    names: list[tuple[str, str]] = []
    for index, param in enumerate(parameters):
        field = f"p{index}"
        default = PydanticUndefined if param.default is param.empty else param.default
        fields[field] = (param.annotation, pydantic.Field(default, alias=param.name))
        names.append((field, param.name))
    config = pydantic.ConfigDict(extra="forbid", title=name)
    try:
        model = pydantic.create_model(f"{name} arguments", __config__=config, **fields)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
        raise TypeError(f"tool {name!r}: an argument's type cannot be validated: {exc}") from exc
    return model, tuple(names)


def _json_schema(model: type[pydantic.BaseModel], name: str) -> dict[str, Any]:
    try:
        schema = model.model_json_schema()
        # A round trip through json proves the schema is plain data (a spec is checkpointed).
        plain: dict[str, Any] = json.loads(json.dumps(schema))
    except (pydantic.PydanticUserError, TypeError, ValueError) as exc:
        raise TypeError(f"tool {name!r}: no JSON schema for its arguments: {exc}") from exc
    return plain


def _description(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn)
    if not doc or isinstance(fn, functools.partial):
        return ""
    paragraph = doc.strip().split("\n\n", 1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


# --- conversion helpers -------------------------------------------------------------------


def _arguments_error(tool: str, exc: pydantic.ValidationError) -> ToolArgumentsError:
    # Only loc, msg and type: `input` and `ctx` may hold arbitrary, unserializable objects.
    raw = exc.errors(include_url=False, include_context=False, include_input=False)
    errors = [
        {"loc": [p if isinstance(p, int) else str(p) for p in e["loc"]], "msg": e["msg"],
         "type": e["type"]}
        for e in raw[:_MAX_REPORTED_ERRORS]
    ]  # fmt: skip
    shown = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
        for e in errors[:_MAX_MESSAGE_ERRORS]
    )
    if len(raw) > _MAX_MESSAGE_ERRORS:
        shown += f"; and {len(raw) - _MAX_MESSAGE_ERRORS} more"
    return ToolArgumentsError(
        AgentError.of(
            ErrorCode.INVALID_ARGUMENTS,
            f"invalid arguments for tool {tool!r}: {shown}",
            tool=tool,
            errors=errors,
            error_count=len(raw),
        )
    )


def _type_name(obj: object) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the original error
        return "<unprintable>"
    return text if len(text) <= _MAX_TEXT_CHARS else text[:_MAX_TEXT_CHARS] + "..."


def _short_traceback(exc: BaseException) -> str:
    if exc.__traceback__ is None:
        return ""
    lines = traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES, chain=False)
    text = "".join(lines)
    return text if len(text) <= _MAX_TRACEBACK_CHARS else "..." + text[-_MAX_TRACEBACK_CHARS:]


def _jsonable_details(details: Mapping[str, Any]) -> dict[str, Any]:
    try:
        data = to_jsonable_python(dict(details), fallback=repr, bytes_mode="base64")
        msgpack.packb(data)
    except Exception:  # noqa: BLE001 - details are a courtesy; never lose the error for them
        return {"details": repr(details)[:_MAX_TEXT_CHARS]}
    return cast("dict[str, Any]", data)
