"""A run timeline as Chrome Trace Event JSON, which Perfetto and `chrome://tracing` open.

One process per run (child runs after their parent, indented by depth), threads for the run
itself, its model calls and each concurrent call lane; complete (`X`) events for intervals,
instant (`i`) events for marks. Stdlib only. Format: the Trace Event Format document
(docs/observability.md names the fields used).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from steerable.protocol import RunEvent
from steerable.protocol.codec import redact

from .intervals import Interval
from .layout import build, outcome

__all__ = ["chrome_trace", "chrome_trace_json"]


def _safe(value: Any) -> Any:
    """A JSON-safe copy of `value` (secrets redacted, anything else as text)."""
    return json.loads(json.dumps(redact(value), default=str))


def chrome_trace(events: Iterable[RunEvent], *, content: bool = False) -> dict[str, Any]:
    """The Trace Event JSON object of `events` (any runs; each run's in seq order).

    Args:
        events: The events, e.g. `list(handle.events())` or a feed subscriber's.
        content: Include message and tool content (task, arguments, results). Default off.
    """
    timeline = build(events, content=content)
    t0 = timeline.start
    out: list[dict[str, Any]] = []

    def us(seconds: float) -> float:
        return round((seconds - t0) * 1e6, 3)

    def complete(interval: Interval, name: str, cat: str, pid: int, tid: int) -> None:
        end = interval.end if interval.end is not None else interval.start
        out.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": us(interval.start),
                "dur": round((end - interval.start) * 1e6, 3),
                "pid": pid,
                "tid": tid,
                "args": _safe(
                    {"outcome": outcome(interval), "error": interval.error, **interval.attrs}
                ),
            }
        )
        for mark in interval.marks:
            out.append(
                {
                    "name": mark.name,
                    "cat": "mark",
                    "ph": "i",
                    "s": "t",
                    "ts": us(mark.at),
                    "pid": pid,
                    "tid": tid,
                    "args": _safe(mark.attrs),
                }
            )

    def meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> None:
        out.append({"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args})

    for pid, lane in enumerate(timeline.runs(), start=1):
        run = lane.run
        label = f"{'  ' * lane.depth}{run.name or 'run'} {run.run_id}"
        meta("process_name", pid, 0, {"name": label})
        meta("process_sort_index", pid, 0, {"sort_index": pid})
        meta("thread_name", pid, 0, {"name": "run"})
        complete(run, f"run {run.name}", "run", pid, 0)
        for index, calls in enumerate(lane.lanes):
            tid = index + 1
            meta("thread_name", pid, tid, {"name": "model" if index == 0 else f"calls {index}"})
            for call in calls:
                for attempt in call.attempts:
                    complete(attempt, attempt.name, call.kind.value, pid, tid)
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "steerable", "start_unix_seconds": t0},
    }


def chrome_trace_json(events: Iterable[RunEvent], *, content: bool = False) -> str:
    """`chrome_trace(events)` as a JSON string."""
    return json.dumps(chrome_trace(events, content=content), indent=1)
