"""Live events from user code, and the model call context every `decide` gets.

User code (a streaming model adapter, later a tool's `ctx.emit`) runs off the supervisor; its
events must still land in order with the run's own. So it does not append to the event log
itself: it tells the supervisor a `LiveEvent`, which appends it between the events of the
messages before and after it. Live events are never stored and fire no hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from steerable.actors._engine.cancel import CancelScope
from steerable.actors._engine.inline import tell_now
from steerable.protocol import EventKind

__all__ = ["LiveEvent", "ModelCallContext"]


@dataclass(slots=True)
class LiveEvent:
    """Message: publish an event from user code, in order with the run's own.

    `data["live"]` says whether it is for live readers only (the default; `model_delta`
    always is) or to be kept with the run's stored events.

    `model_call` ties it to one model call: it is dropped once that call is over (a late
    delta of a cancelled stream must not follow the events of the call after it).
    """

    kind: EventKind
    data: dict[str, Any]
    model_call: int | None = None
    call_id: str | None = None
    """A tool's event: dropped once that call is no longer running (abandoned or done)."""


class ModelCallContext:
    """One model call as `decide` sees it (`view.call`): the `ModelCall` protocol.

    Args:
        number: The model call number.
        scope: The call's cancel scope (cancelled by `cancel()`, an interrupt, a timeout).
        ref: The run's supervisor, told the live events.
    """

    __slots__ = ("_ref", "number", "scope")

    def __init__(self, number: int, scope: CancelScope, ref: pykka.ActorRef[Any]) -> None:
        self.number = number
        self.scope = scope
        self._ref = ref

    @property
    def cancelled(self) -> bool:
        """Whether the call was cancelled."""
        return self.scope.cancelled

    @property
    def reason(self) -> str | None:
        """Why it was cancelled, or None."""
        return self.scope.reason

    def on_cancel(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call `callback(reason)` once on cancellation; returns unregister."""
        return self.scope.on_cancel(callback)

    def wait(self, timeout: float | None = None) -> bool:
        """Block up to `timeout` seconds, waking at once on cancellation; True if cancelled."""
        return self.scope.wait(timeout)

    def emit(self, data: dict[str, Any]) -> None:
        """Publish a live-only `model_delta` event with `data` and this call's number.

        Thread-safe and non-blocking; a no-op once the call is cancelled or the run ended.
        """
        if self.scope.cancelled:
            return
        payload = {"model_call": self.number, **data}
        with contextlib.suppress(pykka.ActorDeadError):
            tell_now(self._ref, LiveEvent(EventKind.MODEL_DELTA, payload, self.number))

    def event(self, name: str, data: Any = None, *, live: bool = True) -> None:
        """Publish an event of the agent's own (kind `custom`), as `ToolContext.emit` does for
        tools: in order with the run's events, a no-op once the call is cancelled or over.

        Raises:
            TypeError: `name` is not a non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"an event name is a non-empty string, not {name!r}")
        if self.scope.cancelled:
            return
        payload = {"name": name, "data": data, "model_call": self.number, "live": live}
        with contextlib.suppress(pykka.ActorDeadError):
            tell_now(self._ref, LiveEvent(EventKind.CUSTOM, payload, self.number))

    def __repr__(self) -> str:
        return f"<ModelCall {self.number} cancelled={self.cancelled}>"
