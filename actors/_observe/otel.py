"""OpenTelemetry traces of runs, by the GenAI semantic conventions (docs/observability.md).

`SpanBridge` is a `Sink` of the runtime's `Tracker`: it turns a run's intervals into spans with
the events' own start and end times, on the feed thread (never on a supervisor): one
`invoke_agent {agent}` span per run, `chat {model}` per model call (`reason {agent}` for an
agent that names no model), `execute_tool {tool}` per call attempt, `execute_tool {agent}` per
subagent step with the child run's `invoke_agent` span under it. Marks become span events.

Only the OpenTelemetry API is imported (the `steerable[otel]` extra), and only when a host
passes a provider: without one, nothing here runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from steerable.actors._engine.log import get_logger
from steerable.protocol.codec import redact

from .context import TraceParent
from .intervals import Interval, IntervalKind, Mark

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["SpanBridge", "require_otel"]

_log = get_logger("steerable.otel")
_SCOPE = "steerable"

# Interval attributes that map to a GenAI semantic-convention name; others get "steerable.".
_SEMCONV = {
    "tool": "gen_ai.tool.name",
    "call_id": "gen_ai.tool.call.id",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "model": "gen_ai.request.model",
    "arguments": "gen_ai.tool.call.arguments",
    "value": "gen_ai.tool.call.result",
    "result": "gen_ai.tool.call.result",
}


def require_otel(what: str) -> None:
    """Raise a clear error when the OpenTelemetry API is not installed.

    Raises:
        ImportError: `opentelemetry-api` is missing (install `steerable[otel]`).
    """
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"{what} needs the OpenTelemetry API: pip install 'steerable[otel]'"
        ) from exc


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def attribute_value(value: Any) -> str | bool | int | float:
    """An attribute value: scalars as they are, the rest as JSON (secrets redacted)."""
    if isinstance(value, str | bool | int | float):
        return value
    return json.dumps(redact(value), default=str, sort_keys=True)


def _attributes(attrs: Mapping[str, Any]) -> dict[str, str | bool | int | float]:
    out: dict[str, str | bool | int | float] = {}
    for key, value in attrs.items():
        if value is None:
            continue
        out[_SEMCONV.get(key, f"steerable.{key}")] = attribute_value(value)
    return out


def virtual_parent_span_id(trace_id: str) -> int:
    """The span id a run joins a bare trace id under (the same for every run of that trace)."""
    value = int(hashlib.sha256(trace_id.encode()).hexdigest()[:16], 16)
    return value or 1


class SpanBridge:
    """Turns every run's events (from the runtime's feed) into OpenTelemetry spans.

    Args:
        tracer_provider: The host's provider (never the global one unless the host passes it).
        version: steerable's version, for the instrumentation scope.
    """

    def __init__(self, tracer_provider: TracerProvider, *, version: str = "") -> None:
        require_otel("tracer_provider")
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer_provider.get_tracer(_SCOPE, version or None)
        self._roots: dict[str, Span] = {}  # spans the host thread began, for the feed thread

    # ------------------------------------------------------------------ host thread

    def begin_root(
        self,
        *,
        agent: str,
        at: float,
        parent: TraceParent | None,
        trace_id: str | None,
        attributes: Mapping[str, Any],
    ) -> tuple[str, Span]:
        """Start a top-level run's span now (so its trace id is the run's); returns both.

        The parent is the host's `traceparent`, else a bare `trace_id` (under a span id
        derived from it), else the host's current OpenTelemetry context.
        """
        span = self._tracer.start_span(
            f"invoke_agent {agent}",
            context=self._context(parent, trace_id),
            kind=self._trace.SpanKind.INTERNAL,
            start_time=_ns(at),
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                **_attributes(attributes),
            },
        )
        return f"{span.get_span_context().trace_id:032x}", span

    def _context(self, parent: TraceParent | None, trace_id: str | None) -> Context | None:
        trace = self._trace
        if parent is not None:
            span_context = trace.SpanContext(
                trace_id=int(parent.trace_id, 16),
                span_id=int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(parent.flags),
            )
        elif trace_id is not None:
            span_context = trace.SpanContext(
                trace_id=int(trace_id, 16),
                span_id=virtual_parent_span_id(trace_id),
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
        else:
            return None  # the host's current context
        context: Context = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
        return context

    # ------------------------------------------------------------------ feed thread

    def adopt(self, run_id: str, span: Span) -> None:
        """The span `begin_root` made is run `run_id`'s (called on the feed thread)."""
        self._roots[run_id] = span

    def close(self, at: float) -> None:
        """End the spans begun for runs that never emitted an event."""
        for span in self._roots.values():
            span.end(end_time=_ns(at))
        self._roots.clear()

    def opened(self, interval: Interval) -> None:
        """Start the interval's span."""
        if interval.kind is IntervalKind.RUN:
            root = self._roots.pop(interval.run_id, None)
            if root is not None:
                interval.handle = root
                return
        trace = self._trace
        parent = interval.parent
        if parent is not None and parent.handle is not None:
            context = trace.set_span_in_context(parent.handle)
        else:
            context = self._context(None, interval.trace_id)
        name, kind, base = self._shape(interval)
        interval.handle = self._tracer.start_span(
            name,
            context=context,
            kind=kind,
            start_time=_ns(interval.start),
            attributes={**base, "steerable.run_id": interval.run_id, **_attributes(interval.attrs)},
        )

    def marked(self, interval: Interval, mark: Mark) -> None:
        """Add the mark as a span event."""
        span = interval.handle
        if span is None:
            return
        if mark.name == "checkpoint":
            # An attribute, not an event: a long run checkpoints at every boundary, and span
            # events are bounded (the SDK keeps 128), so they are kept for what is rare.
            if "revision" in mark.attrs:
                span.set_attribute("steerable.revision", mark.attrs["revision"])
            return
        span.add_event(f"steerable.{mark.name}", _attributes(mark.attrs), _ns(mark.at))

    def closed(self, interval: Interval) -> None:
        """Set the final attributes and status, and end the span at the interval's end."""
        span = interval.handle
        if span is None:
            return
        trace = self._trace
        if interval.kind is IntervalKind.RUN and interval.name:
            span.update_name(f"invoke_agent {interval.name}")
            span.set_attribute("gen_ai.agent.name", interval.name)
        span.set_attribute("steerable.run_id", interval.run_id)
        for key, value in _attributes(interval.attrs).items():
            span.set_attribute(key, value)
        if interval.error is not None:
            span.set_attribute("error.type", interval.error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, interval.error))
        span.end(end_time=_ns(interval.end if interval.end is not None else interval.start))

    def _shape(self, interval: Interval) -> tuple[str, Any, dict[str, Any]]:
        kinds = self._trace.SpanKind
        kind = interval.kind
        if kind is IntervalKind.MODEL:
            model = interval.attrs.get("model")
            if model:
                return f"chat {model}", kinds.CLIENT, {"gen_ai.operation.name": "chat"}
            agent = interval.parent.name if interval.parent is not None else interval.name
            return f"reason {agent}", kinds.INTERNAL, {"gen_ai.agent.name": agent}
        if kind is IntervalKind.TOOL:
            return (
                f"execute_tool {interval.name}",
                kinds.INTERNAL,
                {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.type": "function"},
            )
        if kind is IntervalKind.SUBAGENT:
            return (
                f"execute_tool {interval.name}",
                kinds.INTERNAL,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.type": "agent",
                    "gen_ai.tool.name": interval.name,
                },
            )
        name = f"invoke_agent {interval.name}" if interval.name else "invoke_agent"
        base = {"gen_ai.operation.name": "invoke_agent"}
        if interval.name:
            base["gen_ai.agent.name"] = interval.name
        return name, kinds.INTERNAL, base
