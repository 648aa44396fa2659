"""`ToolContext`: what one tool call gets from the runtime (cancel signal, deadline, key, ids)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.log import Logger, get_logger
from steerable.protocol._base import slot_twin

__all__ = ["ToolContext", "tool_context"]


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
        "_emit",
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
    _emit: Callable[[str, dict[str, Any], bool], None] | None

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
        emit: Callable[[str, dict[str, Any], bool], None] | None = None,
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
        init(self, "_emit", emit)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ToolContext is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ToolContext is immutable; cannot delete {name!r}")

    @property
    def cancelled(self) -> bool:
        """Whether the call has been cancelled (timeout, host cancel, interrupt, parent run)."""
        return self.scope.cancelled

    def emit(self, name: str, data: Any = None, *, live: bool = True) -> None:
        """Publish an event of the tool's own (kind `custom`) in order with the run's events.

        Thread-safe and non-blocking: progress a UI can show while the call runs. `data` must
        be JSON-like (the codec's values); `live=False` marks it to be kept with the run's
        stored events. A no-op once the call is over (its result recorded, or it was
        abandoned) and when the tool runs outside a runtime.

        Raises:
            TypeError: `name` is not a non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"an event name is a non-empty string, not {name!r}")
        emit = self._emit
        if emit is not None:
            emit(
                name, {"name": name, "data": data, "call_id": self.call_id, "tool": self.tool}, live
            )

    @property
    def cancel_event(self) -> threading.Event:
        """The `threading.Event` set on cancellation, for `select`-style waits."""
        return self.scope.event

    @property
    def log(self) -> Logger:
        """A logger bound with run_id, trace_id, call_id and tool (`steerable.tool`)."""
        # Built on first use: most calls never log, and binding is not free on the hot path.
        logger = self._log
        if logger is None:
            logger = get_logger("steerable.tool").bind(
                run_id=self.run_id, trace_id=self.trace_id, call_id=self.call_id, tool=self.tool
            )
            object.__setattr__(self, "_log", logger)
        return cast("Logger", logger)

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


_ContextTwin = slot_twin(ToolContext)
_new = object.__new__


def tool_context(
    run_id: str,
    trace_id: str,
    call_id: str,
    tool: str,
    idempotency_key: str,
    attempt: int,
    deadline: float | None,
    scope: CancelScope,
    now: Callable[[], float],
    emit: Callable[[str, dict[str, Any], bool], None] | None,
) -> ToolContext:
    """`ToolContext(...)` for the runtime's own calls (`attempt` >= 1), once per attempt:
    filled in through its twin (`slot_twin`), where `__init__` makes eleven
    `object.__setattr__` calls past the class's refusing `__setattr__`."""
    ctx: Any = _new(_ContextTwin)
    ctx.run_id = run_id
    ctx.trace_id = trace_id
    ctx.call_id = call_id
    ctx.tool = tool
    ctx.idempotency_key = idempotency_key
    ctx.attempt = attempt
    ctx.deadline = deadline
    ctx.scope = scope
    ctx._now = now
    ctx._log = None
    ctx._emit = emit
    ctx.__class__ = ToolContext
    return ctx  # type: ignore[no-any-return]
