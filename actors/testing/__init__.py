"""steerable's test kit: a scripted agent, controllable fake tools, hook recorders and waits.

Everything here synchronises on events, never on sleeps, so tests that use it are
deterministic. Users of steerable use the same kit to test their own hosts and tools.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from steerable.actors import RunHandle, Tool, ToolContext, tool
from steerable.protocol import (
    AskUser,
    EventKind,
    Finish,
    HookName,
    Plan,
    RunEvent,
    RunState,
    RunView,
    ToolCall,
)

if TYPE_CHECKING:
    from .fake_models import FakeAnthropicServer, FakeOpenAIServer, RecordedRequest, Reply

_FAKE_MODELS = frozenset({"FakeAnthropicServer", "FakeOpenAIServer", "RecordedRequest", "Reply"})


def __getattr__(name: str) -> Any:
    # The fake model servers load http.server: only for the tests that use them.
    if name in _FAKE_MODELS:
        from . import fake_models

        return getattr(fake_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "Gate",
    "HookRecorder",
    "RecordedRequest",
    "Reply",
    "ScriptedAgent",
    "call",
    "plan",
    "wait_event",
    "wait_state",
]

Step = Plan | Finish | AskUser | dict[str, Any] | BaseException | Callable[[RunView], Any]


def call(name: str, **arguments: Any) -> ToolCall:
    """Shorthand for `ToolCall(name=name, arguments=arguments)`."""
    return ToolCall(name=name, arguments=arguments)


def plan(*steps: ToolCall) -> Plan:
    """Shorthand for `Plan(steps=steps)`."""
    return Plan(steps=steps)


class ScriptedAgent:
    """An agent that answers from a script, instantly: no model, no network.

    Each `decide` takes the next step: a decision (returned), an exception instance (raised),
    or a callable (called with the view; its return value is returned). When the script runs
    out, `then` is used for every further call (default: `Finish(output=None)`).

    Attributes:
        views: Every `RunView` the agent was given, in order.
    """

    def __init__(
        self, steps: Iterable[Step] = (), *, then: Step | None = None, name: str = "scripted"
    ) -> None:
        self.name = name
        self._steps = list(steps)
        self._then: Step = then if then is not None else Finish(output=None)
        self._lock = threading.Lock()
        self.views: list[RunView] = []

    @property
    def calls(self) -> int:
        """How many times `decide` was called."""
        with self._lock:
            return len(self.views)

    def decide(self, view: RunView) -> Any:
        """Answer with the next scripted step."""
        with self._lock:
            self.views.append(view)
            step = self._steps.pop(0) if self._steps else self._then
        if isinstance(step, BaseException):
            raise step
        if callable(step) and not isinstance(step, Plan | Finish | AskUser | dict):
            return step(view)
        return step


class Gate:
    """A controllable tool body: tests see when calls start and decide when they end.

    `gate.tool(...)` returns a `@tool` whose calls block until `release()` (or, when
    `cooperative`, until their call is cancelled: they then raise `Cancelled`). A
    non-cooperative gate ignores cancellation, like a tool that never checks (T3); release
    it before the test ends so its thread can exit.

    Args:
        cooperative: Whether calls wake up on cancellation.
        value: What released calls return by default.
    """

    def __init__(self, *, cooperative: bool = True, value: Any = "released") -> None:
        self.cooperative = cooperative
        self.value = value
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._started = threading.Condition(self._lock)
        self.contexts: list[ToolContext] = []
        self._wakes: list[threading.Event] = []
        self.finished: list[str] = []
        self.stopped = threading.Event()
        """Set when any call returned or raised (it really stopped)."""

    def tool(self, name: str = "gate", **options: Any) -> Tool[Any, Any]:
        """A tool named `name` whose calls wait on this gate; options go to `@tool`."""
        gate = self

        def body(ctx: ToolContext, value: str = "") -> Any:
            return gate.enter(ctx, value)

        body.__name__ = name
        return tool(name=name, **options)(body)

    def enter(self, ctx: ToolContext, value: Any = "") -> Any:
        """The body of a gated call (usable from custom tools too)."""
        wake = threading.Event()
        with self._started:
            self.contexts.append(ctx)
            self._wakes.append(wake)
            if self._release.is_set():
                wake.set()
            self._started.notify_all()
        unregister = ctx.on_cancel(lambda _reason: wake.set()) if self.cooperative else None
        try:
            wake.wait()
            if unregister is not None:
                unregister()
            if not self._release.is_set():
                ctx.raise_if_cancelled()
            return value or self.value
        finally:
            with self._lock:
                self.finished.append(ctx.call_id)
            self.stopped.set()

    def wait_started(self, count: int = 1, timeout: float = 10.0) -> list[ToolContext]:
        """Block until at least `count` calls have entered; returns their contexts."""
        with self._started:
            if not self._started.wait_for(lambda: len(self.contexts) >= count, timeout):
                raise TimeoutError(f"{len(self.contexts)} of {count} calls started")
            return list(self.contexts)

    def release(self) -> None:
        """Let every waiting (and future) call return."""
        with self._lock:
            self._release.set()
            wakes = list(self._wakes)
        for wake in wakes:
            wake.set()


def wait_event(
    handle: RunHandle,
    kind: EventKind | str,
    predicate: Callable[[RunEvent], bool] | None = None,
    timeout: float = 10.0,
    start: int = 0,
) -> RunEvent:
    """Block until the run emits an event of `kind` (matching `predicate`); return it.

    Raises:
        TimeoutError: No such event within `timeout` seconds, or the run ended without one.
    """
    wanted = EventKind(kind)
    for event in handle.events(start=start, timeout=timeout):
        if event.kind is wanted and (predicate is None or predicate(event)):
            return event
    raise TimeoutError(f"run {handle.run_id} ended without a {wanted.value} event")


def wait_state(handle: RunHandle, state: RunState | str, timeout: float = 10.0) -> RunState:
    """Block until the run is in `state` (read from its event stream, no polling)."""
    wanted = RunState(state)
    if handle.state is wanted:
        return wanted
    for event in handle.events(timeout=timeout):
        if event.kind is EventKind.STATE_CHANGED and event.data.get("to") == wanted.value:
            return wanted
    if handle.state is wanted:
        return wanted
    raise TimeoutError(f"run {handle.run_id} ended in {handle.state.value}, never {wanted.value}")


class HookRecorder:
    """Records the events every hook fired with; use as `hooks=recorder.hooks()`.

    Attributes:
        events: (hook name, event) pairs, in the order the hooks ran.
    """

    def __init__(self, *, raise_on: Iterable[HookName | str] = ()) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[HookName, RunEvent]] = []
        self._raise_on = {HookName(h) for h in raise_on}

    def hooks(self) -> dict[HookName | str, Callable[[RunEvent], object]]:
        """A callback per hook name, for `Runtime.start(hooks=...)`."""
        return {name: self._callback(name) for name in HookName}

    def _callback(self, name: HookName) -> Callable[[RunEvent], None]:
        def record(event: RunEvent) -> None:
            with self._lock:
                self.events.append((name, event))
            if name in self._raise_on:
                raise RuntimeError(f"hook {name.value} failed on purpose")

        record.__qualname__ = f"HookRecorder.{name.value}"
        return record

    def names(self) -> list[HookName]:
        """The hook names in the order they fired."""
        with self._lock:
            return [name for name, _ in self.events]
