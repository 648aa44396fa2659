"""OpenTelemetry metrics of a runtime (docs/observability.md): a `Sink` of the runtime's tracker.

Counted from the runs' intervals: runs by final state, model-call and tool-call durations
(histograms, seconds), token usage, retries, abandoned calls. Observed from the runtime's
`statistics()` at each collection: live and parked runs, inbox depth, abandoned workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .intervals import Interval, IntervalKind, Mark
from .otel import require_otel

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

__all__ = ["GAUGES", "MetricsBridge"]

GAUGES: dict[str, tuple[str, str, str]] = {
    "steerable.runs.live": ("runs_active", "{run}", "Runs with a live supervisor"),
    "steerable.runs.parked": ("runs_passivated", "{run}", "Runs parked waiting for a person"),
    "steerable.inbox.depth": ("inbox_depth_total", "{message}", "Messages queued in inboxes"),
    "steerable.inbox.depth.max": ("inbox_depth_max", "{message}", "The deepest inbox"),
    "steerable.workers.abandoned": (
        "workers_abandoned",
        "{thread}",
        "Worker threads abandoned by calls that did not stop",
    ),
}
"""Observable gauges: metric name -> (statistics() key, unit, description)."""


class MetricsBridge:
    """Records a runtime's metrics on the host's `MeterProvider`.

    Args:
        meter_provider: The host's provider (never the global one unless the host passes it).
        statistics: The runtime's `statistics()`, read at each collection.
        version: steerable's version, for the instrumentation scope.
    """

    def __init__(
        self,
        meter_provider: MeterProvider,
        statistics: Callable[[], Mapping[str, int]],
        *,
        version: str = "",
    ) -> None:
        require_otel("meter_provider")
        from opentelemetry.metrics import Observation

        meter = meter_provider.get_meter("steerable", version or None)
        self._runs = meter.create_counter(
            "steerable.runs", unit="{run}", description="Runs ended, by final state"
        )
        self._model = meter.create_histogram(
            "steerable.model_call.duration", unit="s", description="Model (decide) call durations"
        )
        self._tool = meter.create_histogram(
            "steerable.tool_call.duration", unit="s", description="Tool call attempt durations"
        )
        self._tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens per model call"
        )
        self._retries = meter.create_counter(
            "steerable.retries", unit="{retry}", description="Tool and model call retries"
        )
        self._abandoned = meter.create_counter(
            "steerable.calls.abandoned",
            unit="{call}",
            description="Calls given up on while their worker still ran",
        )

        def gauge(key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def observe(options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(statistics().get(key, 0))]

            return observe

        for name, (key, unit, description) in GAUGES.items():
            meter.create_observable_gauge(
                name, callbacks=[gauge(key)], unit=unit, description=description
            )

    def opened(self, interval: Interval) -> None:
        """Nothing to count yet."""

    def marked(self, interval: Interval, mark: Mark) -> None:
        """Count retries, and a model call a cancel abandoned."""
        if mark.name == "retry":
            kind = "model" if interval.kind is IntervalKind.MODEL else "tool"
            self._retries.add(1, {"steerable.call.kind": kind})
        elif mark.name == "cancel" and "model" in (mark.attrs.get("abandoned") or ()):
            # Abandoned tool calls are counted when they close; a model call has no close.
            self._abandoned.add(1, {"steerable.reason": "cancel"})

    def closed(self, interval: Interval) -> None:
        """Record a run's final state or a call's duration."""
        end = interval.end if interval.end is not None else interval.start
        seconds = max(0.0, end - interval.start)
        attrs: dict[str, Any] = {}
        if interval.error is not None:
            attrs["error.type"] = interval.error
        if interval.kind is IntervalKind.RUN:
            state = interval.attrs.get("state") or interval.attrs.get("stopped") or "unknown"
            attrs.update({"steerable.state": str(state), "gen_ai.agent.name": interval.name})
            self._runs.add(1, attrs)
        elif interval.kind is IntervalKind.MODEL:
            model = interval.attrs.get("model")
            if model:
                attrs["gen_ai.request.model"] = model
            self._model.record(seconds, attrs)
            for token_type in ("input", "output"):
                count = interval.attrs.get(f"{token_type}_tokens")
                if count:
                    self._tokens.record(count, {**attrs, "gen_ai.token.type": token_type})
        elif interval.kind is IntervalKind.TOOL:
            attrs["gen_ai.tool.name"] = interval.name
            self._tool.record(seconds, attrs)
            if interval.attrs.get("abandoned"):
                self._abandoned.add(1, {"steerable.reason": interval.error or "timeout"})
