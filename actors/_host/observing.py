"""A runtime's observability wiring: its feed, its OpenTelemetry bridges, trace context in.

Split from `runtime.py`: `Runtime` gets `subscribe`, `feed` and `flush_observers` from
`ObservingFace`, and delegates trace context and event logs to `Observability`. Without a
provider no OpenTelemetry code is imported or run; without a subscriber the feed has no thread
and event logs push nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from steerable.actors._observe.context import check_trace_id, parse_traceparent
from steerable.actors._observe.feed import Feed, FeedStream, Subscriber
from steerable.protocol import new_trace_id

from .agent import agent_name
from .events import EventLog

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from steerable.actors._observe.observer import Observer

    from .cell import RunCell

__all__ = ["Observability", "ObservingFace", "model_of"]

_VERSION = "0.1.0"


def model_of(agent: Any) -> str | None:
    """The model an agent calls, if it says so (a string `model` attribute)."""
    model = getattr(agent, "model", None)
    return model if isinstance(model, str) and model else None


class Observability:
    """The runtime's event feed and, when the host passes providers, its bridges.

    Args:
        statistics: The runtime's `statistics()` (metrics' observable gauges).
        tracer_provider: An OpenTelemetry `TracerProvider`: spans of every run.
        meter_provider: An OpenTelemetry `MeterProvider`: the runtime's metrics.
        capture_content: Record message and tool content on spans (default off).
    """

    def __init__(
        self,
        statistics: Callable[[], Mapping[str, int]],
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        capture_content: bool = False,
    ) -> None:
        self.feed = Feed()
        self.observer: Observer | None = None
        if tracer_provider is not None or meter_provider is not None:
            from steerable.actors._observe.observer import Observer

            self.observer = Observer(
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                statistics=statistics,
                content=capture_content,
                version=_VERSION,
            )
            self.feed.subscribe(self.observer, internal=True)

    def begin(
        self,
        run_id: str,
        agent: Any,
        at: float,
        *,
        trace_id: str | None,
        traceparent: str | None,
    ) -> tuple[str, bool, Callable[[], None]]:
        """A new top-level run's trace id, whether the bridges observe it, and what to call
        if it does not start after all.

        With tracing on, the run's span begins here (the host's thread), so its trace id is
        the run's: the host's `traceparent`, else `trace_id`, else the host's current
        OpenTelemetry context, else a new trace. A run whose span does not record (the API's
        no-op provider, a trace sampled out) is not observed by the span bridge: its events
        are not even queued for it.

        Raises:
            ValueError: A malformed `trace_id` or `traceparent`, or both given and different.
        """
        parent = parse_traceparent(traceparent) if traceparent is not None else None
        wanted = check_trace_id(trace_id) if trace_id is not None else None
        if parent is not None and wanted is not None and parent.trace_id != wanted:
            raise ValueError(
                f"trace_id {wanted} differs from the traceparent's trace {parent.trace_id}"
            )
        observer = self.observer
        spans = observer.spans if observer is not None else None
        if observer is None or spans is None:
            if observer is not None:
                self.feed.call(lambda: observer.register(run_id, model_of(agent)))
            chosen = parent.trace_id if parent is not None else wanted
            return chosen or new_trace_id(), observer is not None, _nothing
        model = model_of(agent)
        attributes: dict[str, Any] = {"run_id": run_id, "depth": 0}
        if model:
            attributes["model"] = model
        run_trace, span = spans.begin_root(
            agent=agent_name(agent), at=at, parent=parent, trace_id=wanted, attributes=attributes
        )
        if not span.is_recording() and observer.metrics is None:
            span.end()
            return run_trace, False, _nothing
        self.feed.call(lambda: observer.register(run_id, model, span))

        def abandon() -> None:
            span.end()

        return run_trace, True, abandon

    @property
    def observing(self) -> bool:
        """Whether the runtime's bridges exist (resumed and forked runs are observed then)."""
        return self.observer is not None

    def entry_made(self, cell: RunCell, agent: Any) -> None:
        """A run (started, resumed, forked, a child) is about to start: tell the bridges its
        model, if they observe it. Called by the run factory for every entry it builds."""
        observer = self.observer
        model = model_of(agent)
        if observer is not None and model and cell.events.observed:
            run_id = cell.run_id
            self.feed.call(lambda: observer.register(run_id, model))

    def event_log(self, trace_id: str, observed: bool | None = None) -> EventLog:
        """A new run tree's event log, pushing to the feed (`observed`: default, if the
        bridges exist)."""
        seen = self.observing if observed is None else observed
        return EventLog(trace_id, feed=self.feed, observed=seen)

    def close(self, at: float, timeout: float) -> list[str]:
        """Deliver what is queued, end open spans, stop the feed thread."""
        observer = self.observer
        if observer is not None:
            self.feed.call(lambda: observer.close(at))
        return self.feed.close(timeout)


def _nothing() -> None:
    return None


class ObservingFace:
    """The `Runtime`'s observability methods (docs/observability.md)."""

    _observing: Observability

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(event)` for every event of every run from now on; returns an
        unsubscribe.

        One consumer for all runs (a bridge, a host's metrics): callbacks run on one feed
        thread, never on a run's, in the order events happened (a run tree's in seq order).
        One that raises is logged and stays subscribed.

        Raises:
            RuntimeError: The runtime is shut down.
        """
        return self._observing.feed.subscribe(callback)

    def feed(self, timeout: float | None = None) -> FeedStream:
        """Every event of every run from now on, for `async for` (or `for`, where `timeout`
        bounds one wait). Ends when closed (`close()`, its `with` block) or at shutdown."""
        return self._observing.feed.stream(timeout)

    def flush_observers(self, timeout: float | None = 5.0) -> bool:
        """Wait until every event so far reached the subscribers and bridges; True if so."""
        return self._observing.feed.flush(timeout)
