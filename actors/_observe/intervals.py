"""A run's events turned into intervals and marks: what a trace or a timeline draws.

Intervals are the run itself, each model call, each attempt of a tool call, and each subagent
step (under which the child run nests). Marks are moments on an interval: steering messages,
approvals, cancels, checkpoints, retries, errors. One incremental `Tracker` serves both the
OpenTelemetry bridge (fed live, one event at a time, on the feed thread) and the timeline
renderers (fed a list of stored or collected events), so both tell the same story.

Times are the events' own `at` (wall-clock seconds). A retry attempt has no event of its own:
it starts when its retry timer was due (`tool_retry.at + delay`), and ends at the next
`tool_retry` or at `tool_finished`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from steerable.protocol import EventKind, Phase, RunEvent

__all__ = ["Interval", "IntervalKind", "Mark", "Sink", "Tracker", "collect"]

# Event data that is message or tool content: copied only when the host turns capture on.
CONTENT_KEYS = (
    "task",
    "arguments",
    "value",
    "result",
    "content",
    "output",
    "question",
    "thought",
    "steps",
)


class IntervalKind(StrEnum):
    """What an interval is."""

    RUN = "run"
    MODEL = "model"
    TOOL = "tool"
    SUBAGENT = "subagent"


@dataclass(slots=True, eq=False)
class Mark:
    """A moment on an interval (a steering message, an approval, a cancel, a checkpoint...)."""

    name: str
    at: float
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Interval:
    """One span of time: a run, a model call, a tool-call attempt or a subagent step.

    Attributes:
        key: Unique within a trace, e.g. `run_x/model/2` or `run_x/call/c1.0/1`.
        kind: What it is.
        name: The agent (run, subagent step) or tool name, or the model name if known.
        run_id: The run it belongs to.
        trace_id: The run's trace.
        parent: The interval it nests under (a child run nests under its subagent step).
        start: Wall-clock seconds.
        end: Wall-clock seconds, once closed.
        error: The error code it ended with, if any.
        attrs: Details (call id, attempt, tokens, state...), content only with capture on.
        marks: Moments on it, in order.
        handle: What the sink made of it (an OpenTelemetry span, say).
    """

    key: str
    kind: IntervalKind
    name: str
    run_id: str
    trace_id: str
    parent: Interval | None
    start: float
    end: float | None = None
    error: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    marks: list[Mark] = field(default_factory=list)
    handle: Any = None


class Sink(Protocol):
    """What a `Tracker` reports to."""

    def opened(self, interval: Interval) -> None:
        """An interval began (its parent, if any, is open or was)."""

    def marked(self, interval: Interval, mark: Mark) -> None:
        """A moment on an open interval."""

    def closed(self, interval: Interval) -> None:
        """An interval ended (`end`, `error` and final `attrs` are set)."""


@dataclass(slots=True, eq=False)
class _Call:
    tool: str
    attempt: int
    open: Interval | None
    retry_at: float | None = None


@dataclass(slots=True, eq=False)
class _Run:
    interval: Interval
    model: Interval | None = None
    calls: dict[str, _Call] = field(default_factory=dict)
    steps: dict[str, Interval] = field(default_factory=dict)
    children: dict[str, Interval] = field(default_factory=dict)
    accepted: dict[int, float] = field(default_factory=dict)


class Tracker:
    """Turns a stream of `RunEvent`s (of any number of runs) into intervals and marks.

    Args:
        sink: Told of every interval opened and closed and every mark.
        content: Copy message and tool content (task, arguments, results) into attributes.
        models: The model name of a run by run id, when the host knows it (an entry is
            dropped when its run ends).
    """

    def __init__(
        self, sink: Sink, *, content: bool = False, models: dict[str, str] | None = None
    ) -> None:
        self._sink = sink
        self._content = content
        self._models: dict[str, str] = models if models is not None else {}
        self._runs: dict[str, _Run] = {}
        self._ended: dict[str, Interval] = {}  # closed runs whose children may still report

    def feed(self, event: RunEvent) -> None:
        """Take one event."""
        run = self._runs.get(event.run_id)
        if run is None:
            run = self._open_run(event)
            if event.kind is EventKind.RUN_STARTED:
                return
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, run, event)

    def feed_all(self, events: Iterable[RunEvent]) -> None:
        """Take every event, in order."""
        for event in events:
            self.feed(event)

    def open_runs(self) -> list[str]:
        """Runs seen and not ended."""
        return list(self._runs)

    def close_all(self, at: float, reason: str) -> None:
        """End every open interval at `at` (the runtime stops with runs still live)."""
        for run in list(self._runs.values()):
            self._end_run(run, at, None, {"stopped": reason})

    # ------------------------------------------------------------------ runs

    def _open_run(self, event: RunEvent) -> _Run:
        parent: Interval | None = None
        if event.parent_run_id is not None:
            owner = self._runs.get(event.parent_run_id)
            if owner is not None:
                parent = owner.children.get(event.run_id, owner.interval)
            else:
                parent = self._ended.get(event.parent_run_id)
        data = event.data
        name = str(data.get("agent", "")) if event.kind is EventKind.RUN_STARTED else ""
        interval = Interval(
            key=event.run_id,
            kind=IntervalKind.RUN,
            name=name,
            run_id=event.run_id,
            trace_id=event.trace_id,
            parent=parent,
            start=event.at,
            attrs={"depth": data.get("depth", 0)} if event.kind is EventKind.RUN_STARTED else {},
        )
        if event.kind is EventKind.RUN_STARTED:
            self._run_attrs(interval, data)
        run = _Run(interval)
        self._runs[event.run_id] = run
        self._sink.opened(interval)
        return run

    def _run_attrs(self, interval: Interval, data: Mapping[str, Any]) -> None:
        for key in ("resumed_from", "forked_from", "model"):
            if data.get(key) is not None:
                interval.attrs[key] = data[key]
        self._copy_content(interval.attrs, data)

    def _copy_content(self, attrs: dict[str, Any], data: Mapping[str, Any]) -> None:
        if self._content:
            for key in CONTENT_KEYS:
                if key in data:
                    attrs[key] = data[key]

    def _on_run_started(self, run: _Run, event: RunEvent) -> None:
        # The run was opened by an earlier event (its first state change, say).
        interval = run.interval
        if not interval.name:
            interval.name = str(event.data.get("agent", ""))
            interval.attrs.setdefault("depth", event.data.get("depth", 0))
            self._run_attrs(interval, event.data)
        else:
            self._mark(interval, "run_started", event.at, _plain(event.data))

    def _on_run_ended(self, run: _Run, event: RunEvent) -> None:
        data = event.data
        self._end_run(run, event.at, data.get("error"), {"state": data.get("state")})

    def _end_run(self, run: _Run, at: float, error: str | None, attrs: dict[str, Any]) -> None:
        why = error or attrs.get("stopped") or "unfinished"
        if run.model is not None:
            self._close(run.model, at, str(why))
            run.model = None
        for call in run.calls.values():
            if call.open is not None:
                self._close(call.open, at, str(why))
                call.open = None
        for step in run.steps.values():
            self._close(step, at, str(why))
        run.steps.clear()
        interval = run.interval
        interval.attrs.update(attrs)
        self._close(interval, at, error)
        del self._runs[interval.run_id]
        self._models.pop(interval.run_id, None)
        self._ended[interval.run_id] = interval
        if len(self._ended) > 4096:  # a bound: children report within their parent's life
            self._ended.pop(next(iter(self._ended)))

    # ------------------------------------------------------------------ model calls

    def _model_name(self, run: _Run) -> str:
        return str(run.interval.attrs.get("model") or self._models.get(run.interval.run_id, ""))

    def _on_reasoning_started(self, run: _Run, event: RunEvent) -> None:
        if run.model is not None:  # its answer was discarded (an interrupting message)
            run.model.attrs["discarded"] = True
            self._close(run.model, event.at, None)
        n = event.data.get("model_call", 0)
        model = self._model_name(run)
        attrs: dict[str, Any] = {"model_call": n, "model": model} if model else {"model_call": n}
        run.model = self._open(
            run,
            f"{run.interval.run_id}/model/{n}",
            IntervalKind.MODEL,
            model or run.interval.name,
            event,
            attrs,
        )

    def _on_reasoning_finished(self, run: _Run, event: RunEvent) -> None:
        model = run.model
        if model is None or model.attrs.get("model_call") != event.data.get("model_call"):
            return
        data = event.data
        for key in ("decision", "input_tokens", "output_tokens", "model"):
            if data.get(key) is not None:
                model.attrs[key] = data[key]
        self._copy_content(model.attrs, data)
        run.model = None
        self._close(model, event.at, data.get("error"))

    def _on_error(self, run: _Run, event: RunEvent) -> None:
        data = event.data
        if event.phase is Phase.REASON and run.model is not None:
            model = run.model
            run.model = None
            self._mark(model, "retry", event.at, _plain(data))
            model.attrs["retry"] = data.get("retry")
            self._close(model, event.at, data.get("code"))
            return
        self._mark(run.interval, "error", event.at, _plain(data))

    # ------------------------------------------------------------------ tool calls

    def _on_tool_started(self, run: _Run, event: RunEvent) -> None:
        cid = str(event.data.get("call_id"))
        tool = str(event.data.get("tool"))
        call = _Call(tool, 1, None)
        run.calls[cid] = call
        call.open = self._open_attempt(run, cid, call, event.at, event.data)

    def _open_attempt(
        self, run: _Run, cid: str, call: _Call, at: float, data: Mapping[str, Any]
    ) -> Interval:
        attrs: dict[str, Any] = {"call_id": cid, "tool": call.tool, "attempt": call.attempt}
        self._copy_content(attrs, data)
        return self._open_at(
            run,
            f"{run.interval.run_id}/call/{cid}/{call.attempt}",
            IntervalKind.TOOL,
            call.tool,
            at,
            attrs,
        )

    def _on_tool_retry(self, run: _Run, event: RunEvent) -> None:
        data = event.data
        call = run.calls.get(str(data.get("call_id")))
        if call is None:
            return
        if call.open is None:
            self._start_retry(run, str(data.get("call_id")), call, event.at)
        attempt = call.open
        call.open = None
        call.retry_at = event.at + float(data.get("delay") or 0.0)
        if attempt is not None:
            self._mark(attempt, "retry", event.at, _plain(data))
            self._close(attempt, event.at, data.get("error"))

    def _start_retry(self, run: _Run, cid: str, call: _Call, at: float) -> None:
        begin = call.retry_at if call.retry_at is not None else at
        call.attempt += 1
        call.retry_at = None
        call.open = self._open_attempt(run, cid, call, min(begin, at), {})

    def _on_tool_finished(self, run: _Run, event: RunEvent) -> None:
        data = event.data
        cid = str(data.get("call_id"))
        call = run.calls.get(cid)
        if call is None:  # never dispatched (denied, or cancelled before it started)
            self._mark(run.interval, "call_not_started", event.at, _plain(data))
            return
        attempts = int(data.get("attempts") or 0)
        if call.open is None and attempts > call.attempt:
            self._start_retry(run, cid, call, event.at)
        del run.calls[cid]
        attempt = call.open
        if attempt is None:  # cancelled while waiting to retry: the last attempt has ended
            self._mark(run.interval, "call_finished", event.at, _plain(data))
            return
        attempt.attrs["attempts"] = attempts
        attempt.attrs["abandoned"] = bool(data.get("abandoned"))
        self._copy_content(attempt.attrs, data)
        self._close(attempt, event.at, data.get("error"))

    # ------------------------------------------------------------------ subagents

    def _on_subagent_started(self, run: _Run, event: RunEvent) -> None:
        data = event.data
        cid = str(data.get("call_id"))
        child = str(data.get("child_run_id"))
        step = self._open(
            run,
            f"{run.interval.run_id}/call/{cid}",
            IntervalKind.SUBAGENT,
            str(data.get("agent")),
            event,
            {"call_id": cid, "child_run_id": child, "agent": data.get("agent")},
        )
        run.steps[cid] = step
        run.children[child] = step

    def _on_subagent_finished(self, run: _Run, event: RunEvent) -> None:
        data = event.data
        step = run.steps.pop(str(data.get("call_id")), None)
        if step is None:
            self._mark(run.interval, "call_not_started", event.at, _plain(data))
            return
        step.attrs["state"] = data.get("state")
        self._close(step, event.at, None if data.get("ok") else str(data.get("state")))

    # ------------------------------------------------------------------ marks

    def _on_message_accepted(self, run: _Run, event: RunEvent) -> None:
        seq = event.data.get("seq")
        if isinstance(seq, int):
            run.accepted[seq] = event.at
        self._mark_run(run, "steering", event)

    def _on_message_delivered(self, run: _Run, event: RunEvent) -> None:
        seq = event.data.get("seq")
        attrs = _plain(event.data)
        accepted = run.accepted.pop(seq, None) if isinstance(seq, int) else None
        if accepted is not None:
            attrs["waited"] = event.at - accepted
        self._content_mark(run.interval, "message_delivered", event.at, attrs, event.data)

    def _on_execute_finished(self, run: _Run, event: RunEvent) -> None:
        if event.data.get("interrupted"):
            self._mark_run(run, "plan_interrupted", event)

    def _mark_run(self, run: _Run, name: str, event: RunEvent) -> None:
        self._content_mark(run.interval, name, event.at, _plain(event.data), event.data)

    def _content_mark(
        self,
        interval: Interval,
        name: str,
        at: float,
        attrs: dict[str, Any],
        data: Mapping[str, Any],
    ) -> None:
        self._copy_content(attrs, data)
        self._mark(interval, name, at, attrs)

    # ------------------------------------------------------------------ plumbing

    def _open(
        self,
        run: _Run,
        key: str,
        kind: IntervalKind,
        name: str,
        event: RunEvent,
        attrs: dict[str, Any],
    ) -> Interval:
        return self._open_at(run, key, kind, name, event.at, attrs)

    def _open_at(
        self, run: _Run, key: str, kind: IntervalKind, name: str, at: float, attrs: dict[str, Any]
    ) -> Interval:
        interval = Interval(
            key=key,
            kind=kind,
            name=name,
            run_id=run.interval.run_id,
            trace_id=run.interval.trace_id,
            parent=run.interval,
            start=at,
            attrs=attrs,
        )
        self._sink.opened(interval)
        return interval

    def _mark(self, interval: Interval, name: str, at: float, attrs: dict[str, Any]) -> None:
        mark = Mark(name, at, attrs)
        interval.marks.append(mark)
        self._sink.marked(interval, mark)

    def _close(self, interval: Interval, at: float, error: Any) -> None:
        interval.end = max(at, interval.start)
        interval.error = None if error is None else str(error)
        self._sink.closed(interval)


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    """Event data without content (what is always safe to record)."""
    return {k: v for k, v in data.items() if k not in CONTENT_KEYS}


def _simple_mark(name: str) -> Callable[[Tracker, _Run, RunEvent], None]:
    def handle(tracker: Tracker, run: _Run, event: RunEvent) -> None:
        tracker._mark_run(run, name, event)

    return handle


_HANDLERS: dict[EventKind, Callable[[Tracker, _Run, RunEvent], None]] = {
    EventKind.RUN_STARTED: Tracker._on_run_started,
    EventKind.RUN_ENDED: Tracker._on_run_ended,
    EventKind.REASONING_STARTED: Tracker._on_reasoning_started,
    EventKind.REASONING_FINISHED: Tracker._on_reasoning_finished,
    EventKind.ERROR: Tracker._on_error,
    EventKind.TOOL_STARTED: Tracker._on_tool_started,
    EventKind.TOOL_RETRY: Tracker._on_tool_retry,
    EventKind.TOOL_FINISHED: Tracker._on_tool_finished,
    EventKind.SUBAGENT_STARTED: Tracker._on_subagent_started,
    EventKind.SUBAGENT_FINISHED: Tracker._on_subagent_finished,
    EventKind.MESSAGE_ACCEPTED: Tracker._on_message_accepted,
    EventKind.MESSAGE_DELIVERED: Tracker._on_message_delivered,
    EventKind.EXECUTE_FINISHED: Tracker._on_execute_finished,
    EventKind.APPROVAL_REQUESTED: _simple_mark("approval_requested"),
    EventKind.APPROVAL_SETTLED: _simple_mark("approval_settled"),
    EventKind.RUN_CANCELLED: _simple_mark("cancel"),
    EventKind.CHECKPOINT: _simple_mark("checkpoint"),
    EventKind.FINISH_REJECTED: _simple_mark("finish_rejected"),
}


class _Collector:
    """A sink that keeps every interval (for the timeline renderers)."""

    def __init__(self) -> None:
        self.intervals: list[Interval] = []

    def opened(self, interval: Interval) -> None:
        self.intervals.append(interval)

    def marked(self, interval: Interval, mark: Mark) -> None:
        return None

    def closed(self, interval: Interval) -> None:
        return None


def collect(events: Iterable[RunEvent], *, content: bool = False) -> list[Interval]:
    """Every interval of `events`, in the order they opened; open ones end at the last event."""
    sink = _Collector()
    tracker = Tracker(sink, content=content)
    last = 0.0
    for event in events:
        tracker.feed(event)
        last = max(last, event.at)
    tracker.close_all(last, "unfinished")
    return sink.intervals
