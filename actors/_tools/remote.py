"""A tool call that runs outside the host's threads: in a worker process or a Ray task.

The host encodes one call with `encode_call` into a `RemoteTask` whose entry point is
`run_call`; the worker resolves the tool by its module and qualified name, runs it with a
`ToolContext` of its own (the same ids and idempotency key, a deadline on the worker's clock, a
cancel scope the host can set), and encodes the result with `encode_result`. docs/isolation.md.

Why pickle one way and msgpack the other: the arguments are already validated, so they are
whatever the tool's annotations make of a plan's JSON (models, paths, datetimes, secrets the tool
must read in clear), which only pickle carries as they are; the host trusts what it sends to its
own worker. What comes back is the tool's result already normalised to JSON-like data (the shape
a checkpoint stores) and an `AgentError`'s JSON dump, in plain msgpack: the host never unpickles
anything a worker sends, so a misbehaving tool can hurt the host only through a typed error.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import TYPE_CHECKING, Any

import msgpack

from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.executor import RemoteTask
from steerable.protocol._errors import AgentError, ErrorCode

from .context import ToolContext
from .convert import error_from_exception, normalize_result

if TYPE_CHECKING:
    from .tool import Tool

__all__ = ["ENTRY", "decode_result", "encode_call", "run_call"]

ENTRY = "steerable.actors._tools.remote:run_call"
"""The entry point every remote tool call runs."""

_tools: dict[tuple[str, str], Any] = {}  # worker side: resolved tools, by (module, qualname)


def encode_call(tool: Tool[Any, Any], arguments: dict[str, Any], ctx: ToolContext) -> RemoteTask:
    """The `RemoteTask` of one call attempt.

    Raises:
        ToolResultError-like `ValueError`: the arguments cannot be pickled for the worker.
    """
    fn = tool.fn
    body = {
        "module": fn.__module__,
        "qualname": fn.__qualname__,
        "tool": tool.name,
        "arguments": arguments,
        "run_id": ctx.run_id,
        "trace_id": ctx.trace_id,
        "call_id": ctx.call_id,
        "idempotency_key": ctx.idempotency_key,
        "attempt": ctx.attempt,
        "max_result_bytes": tool.max_result_bytes,
    }
    try:
        payload = pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise ValueError(
            f"the arguments of tool {tool.name!r} cannot be sent to its worker "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return RemoteTask(
        entry=ENTRY,
        payload=payload,
        remaining=ctx.remaining(),
        options=tool.executor_options,
        label=tool.name,
    )


def decode_result(data: bytes) -> tuple[Any, AgentError | None]:
    """The host's side of `run_call`: `(value, None)` or `(None, error)`.

    A reply that is not what `run_call` sends is an `internal_error`, never an exception.
    """
    try:
        kind, body = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if kind == "ok":
            return body, None
        return None, AgentError.model_validate(body)
    except Exception as exc:  # noqa: BLE001 - a garbled reply becomes a typed error
        return None, AgentError.of(
            ErrorCode.INTERNAL_ERROR, f"a remote tool call sent an unreadable reply: {exc!r}"
        )


def run_call(payload: bytes, scope: CancelScope) -> bytes:
    """Run one encoded call where it was sent (the worker side); never raises."""
    try:
        body = pickle.loads(payload)  # from our own host: see the module docstring
    except Exception as exc:  # noqa: BLE001
        error = AgentError.of(ErrorCode.HANDLER_ERROR, f"cannot decode the call: {exc!r}")
        return _error(error)
    name = body["tool"]
    call_id = body["call_id"]
    ctx = ToolContext(
        run_id=body["run_id"],
        trace_id=body["trace_id"],
        call_id=call_id,
        tool=name,
        idempotency_key=body["idempotency_key"],
        attempt=body["attempt"],
        deadline=scope.deadline,
        scope=scope,
        now=time.monotonic,
    )
    try:
        tool = _resolve(body["module"], body["qualname"], name)
    except Exception as exc:  # noqa: BLE001 - a tool the worker cannot import: typed error
        return _error(
            AgentError.of(
                ErrorCode.HANDLER_ERROR,
                f"tool {name!r} cannot be imported in its worker: {type(exc).__name__}: {exc} "
                "(an isolated tool must be a module-level function of an importable module)",
                tool=name,
                call_id=call_id,
                reason="not_importable",
                module=body["module"],
                qualname=body["qualname"],
            )
        )
    try:
        if tool.is_async:
            value = asyncio.run(tool.invoke_async(body["arguments"], ctx))
        else:
            value = tool.invoke(body["arguments"], ctx)
        data = normalize_result(value, max_bytes=body["max_result_bytes"], tool=name)
        return bytes(msgpack.packb(["ok", data], use_bin_type=True))
    except BaseException as exc:  # noqa: BLE001 - R6: contained and reported as the call's error
        return _error(error_from_exception(exc, tool=name, call_id=call_id))


def _error(error: AgentError) -> bytes:
    return bytes(msgpack.packb(["error", error.model_dump(mode="json")], use_bin_type=True))


def _resolve(module: str, qualname: str, name: str) -> Tool[Any, Any]:
    from .tool import Tool

    key = (module, qualname)
    found = _tools.get(key)
    if found is not None:
        return found  # type: ignore[no-any-return]
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, Tool):
        # The module-level name is the plain function (decorated under another name).
        obj = Tool(obj, name=name)
    _tools[key] = obj
    return obj  # type: ignore[no-any-return]
