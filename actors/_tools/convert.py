"""Conversions at a tool call's edges: exceptions to `AgentError` (R5, R6), results to
storable JSON-like data (R21, R26)."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Mapping
from typing import Any, cast

import msgpack
from pydantic_core import to_jsonable_python

from steerable.actors._engine.cancel import Cancelled
from steerable.protocol._errors import AgentError, ErrorCode, SteerableError
from steerable.protocol.codec import check_storable

# Bounds that keep an error small enough for a checkpoint and an agent's context window.
_TRACEBACK_FRAMES = 5
_MAX_TRACEBACK_CHARS = 4_000
_MAX_TEXT_CHARS = 1_000


__all__ = ["RetryableToolError", "ToolResultError", "error_from_exception", "normalize_result"]


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


class ToolResultError(SteerableError):
    """A tool's result cannot be stored (not serializable, or too large); code `handler_error`."""


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
    `SecretBytes` stay masked. An iterator or generator is refused, never consumed (it may not
    end): a tool returns a list. Before anything is converted, a walk bounded by `max_bytes`
    checks the value (`steerable.protocol.codec.check_storable`: 64-bit ints, valid text,
    nesting), so a huge or hostile result costs bounded time and memory.

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
    # Checked before converting: an iterator is refused, not consumed, and a huge value costs a
    # walk bounded by `bound`; within it, the exact size is measured below.
    bound = 4 * max_bytes + 1024
    try:
        check_storable(value, what="the value", bytes_ok=True, max_bytes=bound)
    except (TypeError, ValueError) as exc:
        if "larger than" in str(exc):
            raise ToolResultError(
                AgentError.of(
                    ErrorCode.HANDLER_ERROR,
                    f"result of {label} is too large: more than {bound} bytes, limit {max_bytes}",
                    limit=max_bytes,
                    **named,
                )
            ) from None
        raise ToolResultError(
            AgentError.of(
                ErrorCode.HANDLER_ERROR,
                f"result of {label} is not serializable: {exc}",
                result_type=_type_name(value),
                **named,
            )
        ) from None
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
