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
import types
import typing
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

import pydantic
from pydantic_core import PydanticUndefined

from steerable.actors._engine.cancel import Cancelled
from steerable.protocol._capabilities import SideEffect, ToolSpec
from steerable.protocol._errors import AgentError, ErrorCode, SteerableError

from .context import ToolContext
from .convert import (
    RetryableToolError,
    ToolResultError,
    error_from_exception,
    normalize_result,
)
from .placement import check_importable, check_placement
from .schema import docstring_arguments

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


class ToolArgumentsError(SteerableError):
    """A tool call's arguments did not validate; carries code `invalid_arguments`.

    `error.details` holds `tool` and `errors`, a list of `{"loc", "msg", "type"}` dicts.
    """


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
        isolation: "thread" (the default: a worker thread of the host) or "process" (a warm
            worker process that is killed on cancel, interrupt and timeout; docs/isolation.md).
        executor: The name of a runtime executor to run the call on instead (e.g. "ray").
        memory_limit: Bytes of address space a process-isolated call may use (RLIMIT_AS).
        cpu_seconds: CPU seconds a process-isolated call may use (RLIMIT_CPU).
        max_result_bytes: The largest result accepted, as msgpack bytes. Default 1,000,000.
        num_cpus: CPUs a Ray task reserves (Ray executor only).
        resources: Custom Ray resources a Ray task reserves (Ray executor only).

    Attributes:
        spec: The tool's `ToolSpec`, with the JSON schema of its arguments.
        fn: The original function.
        is_async: Whether `fn` is an `async def`.
        wants_context: Whether `fn` has a `ToolContext` parameter.
        executor: None for a call in the host ("thread", or the event loop for `async def`),
            "process" for process isolation, else the name of a runtime executor.
        executor_options: The executor's per-call options (limits, Ray resources).
        max_result_bytes: The largest result accepted, as msgpack bytes.
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
        isolation: str = "thread",
        executor: str | None = None,
        memory_limit: int | None = None,
        cpu_seconds: float | None = None,
        max_result_bytes: int | None = None,
        num_cpus: float | None = None,
        resources: Mapping[str, float] | None = None,
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
        placement = check_placement(
            isolation, executor, memory_limit, cpu_seconds, max_result_bytes, num_cpus, resources
        )
        self.executor, self.executor_options, self.max_result_bytes = placement
        if self.executor is not None:
            check_importable(fn, name)
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
            argument_descriptions={
                p: text
                for p, text in docstring_arguments(fn).items()
                if p != self._context_param and any(p == param for _, param in self._fields)
            },
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
        if not arguments and not self._fields and isinstance(arguments, dict):
            # Nothing to validate (a tool without parameters, called without arguments): the
            # validator would only build and take apart an empty model, on every call.
            return {}
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
        where = "" if self.executor is None else f" executor={self.executor}"
        return f"<Tool {self.spec.name!r} side_effect={self.spec.side_effect.value}{where}>"


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
    isolation: str = "thread",
    executor: str | None = None,
    memory_limit: int | None = None,
    cpu_seconds: float | None = None,
    max_result_bytes: int | None = None,
    num_cpus: float | None = None,
    resources: Mapping[str, float] | None = None,
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
    isolation: str = "thread",
    executor: str | None = None,
    memory_limit: int | None = None,
    cpu_seconds: float | None = None,
    max_result_bytes: int | None = None,
    num_cpus: float | None = None,
    resources: Mapping[str, float] | None = None,
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
        isolation: "thread" (default) or "process": the call runs in a warm worker process
            that is killed (SIGKILL of its process group) on cancel, interrupt and timeout; the
            function must be module-level in an importable module (docs/isolation.md).
        executor: Run calls on the runtime's executor of this name instead, e.g. "ray"
            (`Runtime(executors=...)`; "ray" gets a default `RayExecutor`).
        memory_limit: Process isolation: bytes of address space (RLIMIT_AS) a call may use.
        cpu_seconds: Process isolation: CPU seconds (RLIMIT_CPU) a call may use.
        max_result_bytes: The largest result accepted, as msgpack bytes; default 1,000,000.
        num_cpus: Ray: CPUs each call's task reserves.
        resources: Ray: custom resources each call's task reserves.

    Returns:
        A `Tool`, or a decorator that makes one.

    Raises:
        ValueError: A bad name, side effect, timeout, version, isolation or limit.
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
        "isolation": isolation,
        "executor": executor,
        "memory_limit": memory_limit,
        "cpu_seconds": cpu_seconds,
        "max_result_bytes": max_result_bytes,
        "num_cpus": num_cpus,
        "resources": resources,
    }
    if fn is not None:
        return Tool(fn, namespace=_caller_locals(), **options)
    # Fail at the decorator line, not at the function below it, when the options are wrong.
    _check_side_effect(side_effect)
    _check_timeout(timeout)
    _check_version(version)
    check_placement(
        isolation, executor, memory_limit, cpu_seconds, max_result_bytes, num_cpus, resources
    )
    if name is not None:
        _check_name(None, name)

    def decorate(fn: Callable[P, R]) -> Tool[P, R]:
        return Tool(fn, namespace=_caller_locals(), **options)

    return decorate


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
