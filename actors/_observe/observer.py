"""A runtime's observability: one `Tracker` on the feed, fanning out to spans and metrics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from steerable.protocol import RunEvent

from .intervals import Interval, Mark, Sink, Tracker
from .metrics import MetricsBridge
from .otel import SpanBridge

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["Observer"]


class _Fanout:
    def __init__(self, sinks: list[Sink]) -> None:
        self._sinks = sinks

    def opened(self, interval: Interval) -> None:
        for sink in self._sinks:
            sink.opened(interval)

    def marked(self, interval: Interval, mark: Mark) -> None:
        for sink in self._sinks:
            sink.marked(interval, mark)

    def closed(self, interval: Interval) -> None:
        for sink in self._sinks:
            sink.closed(interval)


class Observer:
    """Spans and metrics of every run, fed from the runtime's feed (on the feed thread).

    Args:
        tracer_provider: For spans, if given.
        meter_provider: For metrics, if given.
        statistics: The runtime's `statistics()` (observable gauges).
        content: Record message and tool content on spans.
        version: steerable's version.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        statistics: Callable[[], Mapping[str, int]],
        content: bool = False,
        version: str = "",
    ) -> None:
        self.spans = (
            SpanBridge(tracer_provider, version=version) if tracer_provider is not None else None
        )
        self.metrics = (
            MetricsBridge(meter_provider, statistics, version=version)
            if meter_provider is not None
            else None
        )
        sinks: list[Sink] = [s for s in (self.spans, self.metrics) if s is not None]
        self.models: dict[str, str] = {}
        self.tracker = Tracker(_Fanout(sinks), content=content, models=self.models)

    def __call__(self, event: RunEvent) -> None:
        """The feed subscriber."""
        self.tracker.feed(event)

    def register(self, run_id: str, model: str | None, span: Any = None) -> None:
        """A run is about to start: its model name and, for a top-level run, its span.

        Called on the feed thread (through `Feed.call`), before any event of the run.
        """
        if model:
            self.models[run_id] = model
        if span is not None and self.spans is not None:
            self.spans.adopt(run_id, span)

    def close(self, at: float) -> None:
        """End every open span (the runtime stops with runs still live)."""
        self.tracker.close_all(at, "runtime shutdown")
        if self.spans is not None:
            self.spans.close(at)
