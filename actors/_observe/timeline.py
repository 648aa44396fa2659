"""A run timeline as one self-contained HTML file: inline SVG and a little JavaScript.

Lanes for the model and for each concurrent call, bars coloured by outcome (one group per
call, one bar per attempt), markers for steering messages, approvals, cancels, checkpoints and
retries, child runs as nested lanes under their parent, and details on hover. No network, no
build step, stdlib only. docs/observability.md shows how to make one.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

from steerable.protocol import RunEvent
from steerable.protocol.codec import redact

from .intervals import Interval, IntervalKind, Mark
from .layout import Call, RunLane, Timeline, build, outcome

__all__ = ["timeline_html"]

_LABEL_W = 240
_PLOT_W = 960
_ROW_H = 22
_RUN_H = 28
_AXIS_H = 30
_INDENT = 14

_STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:16px;margin:0 0 4px}
.sub{color:#666;margin-bottom:10px}
svg text{font-size:11px;fill:#333}
.axis line{stroke:#ddd}.axis text{fill:#888}
.lane-label{fill:#555}.run-label{font-weight:600}
.run-bar{fill:#cfd8e3}.bar{stroke:#0003;stroke-width:.5}
.outcome-ok{fill:#4caf50}.outcome-error{fill:#e53935}.outcome-cancelled{fill:#fb8c00}
.outcome-abandoned{fill:#6a1b9a}.outcome-discarded{fill:#9e9e9e}.outcome-unfinished{fill:#90a4ae}
.run-bar.outcome-ok{fill:#c8e6c9}.run-bar.outcome-error{fill:#ffcdd2}
.run-bar.outcome-cancelled{fill:#ffe0b2}.run-bar.outcome-unfinished{fill:#eceff1}
.kind-model.outcome-ok{fill:#1e88e5}.kind-subagent.outcome-ok{fill:#00897b}
.marker path{stroke:#0006;stroke-width:.5}
.mk-steering{fill:#1565c0}.mk-message_delivered{fill:#64b5f6}.mk-cancel{fill:#d84315}
.mk-approval_requested{fill:#f9a825}.mk-approval_settled{fill:#fdd835}
.mk-checkpoint{fill:#757575}.mk-retry{fill:#ad1457}.mk-error{fill:#b71c1c}
.mk-other{fill:#455a64}
#tip{position:absolute;display:none;background:#263238;color:#fff;padding:6px 8px;
border-radius:4px;white-space:pre;font:12px ui-monospace,monospace;pointer-events:none;
max-width:640px;overflow:hidden}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
"""

_LEGEND = {
    "ok": "#4caf50",
    "error": "#e53935",
    "cancelled": "#fb8c00",
    "abandoned": "#6a1b9a",
    "discarded": "#9e9e9e",
    "unfinished": "#90a4ae",
    "model call": "#1e88e5",
    "subagent": "#00897b",
}

_SCRIPT = """
(function(){var tip=document.getElementById('tip');
document.querySelectorAll('[data-tip]').forEach(function(el){
el.addEventListener('mousemove',function(e){tip.textContent=el.getAttribute('data-tip');
tip.style.display='block';tip.style.left=(e.pageX+14)+'px';tip.style.top=(e.pageY+14)+'px';});
el.addEventListener('mouseleave',function(){tip.style.display='none';});});})();
"""

_MARKERS = {
    "steering",
    "message_delivered",
    "approval_requested",
    "approval_settled",
    "cancel",
    "checkpoint",
    "retry",
    "error",
}


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(redact(value), default=str)


def _details(title: str, at: float, t0: float, attrs: Mapping[str, Any], end: float | None) -> str:
    lines = [title, f"at +{(at - t0) * 1e3:.3f} ms"]
    if end is not None:
        lines.append(f"took {(end - at) * 1e3:.3f} ms")
    lines.extend(f"{k}: {_value(v)}" for k, v in attrs.items() if v is not None)
    return "\n".join(lines)


class _Canvas:
    def __init__(self, timeline: Timeline) -> None:
        self.t0 = timeline.start
        self.span = max(timeline.end - timeline.start, 1e-6)
        self.parts: list[str] = []
        self.y = _AXIS_H

    def x(self, at: float) -> float:
        return round(_LABEL_W + (at - self.t0) / self.span * _PLOT_W, 2)

    def add(self, text: str) -> None:
        self.parts.append(text)

    def axis(self, height: int) -> None:
        self.add('<g class="axis">')
        for i in range(11):
            x = _LABEL_W + _PLOT_W * i / 10
            label = f"{self.span * i / 10 * 1e3:.1f} ms"
            self.add(f'<line x1="{x}" y1="{_AXIS_H - 6}" x2="{x}" y2="{height}"/>')
            self.add(f'<text x="{x + 2}" y="{_AXIS_H - 10}">{label}</text>')
        self.add("</g>")

    def bar(self, interval: Interval, y: float, h: float, cls: str, title: str) -> None:
        end = interval.end if interval.end is not None else interval.start
        x1, x2 = self.x(interval.start), self.x(end)
        attrs = {"error": interval.error, **interval.attrs}
        tip = html.escape(_details(title, interval.start, self.t0, attrs, end), quote=True)
        self.add(
            f'<rect class="{cls} outcome-{outcome(interval)}" x="{x1}" y="{y}" '
            f'width="{max(x2 - x1, 1.5):.2f}" height="{h}" data-tip="{tip}">'
            f"<title>{html.escape(title)}</title></rect>"
        )

    def marker(self, mark: Mark, y: float, run_id: str) -> None:
        kind = mark.name if mark.name in _MARKERS else "other"
        x = self.x(mark.at)
        tip = html.escape(_details(mark.name, mark.at, self.t0, mark.attrs, None), quote=True)
        self.add(
            f'<g class="marker" data-kind="{html.escape(mark.name)}" data-run="{run_id}" '
            f'data-tip="{tip}"><path class="mk-{kind}" '
            f'd="M{x},{y + 12} l5,-9 l-10,0 z"/><title>{html.escape(mark.name)}</title></g>'
        )


def _call_title(call: Call) -> str:
    first = call.attempts[0]
    if call.kind is IntervalKind.MODEL:
        return f"model call {first.attrs.get('model_call')} ({first.name})"
    if call.kind is IntervalKind.SUBAGENT:
        return f"subagent {first.name} ({first.attrs.get('call_id')})"
    return f"{first.name} {first.attrs.get('call_id')}"


def _draw_run(canvas: _Canvas, lane: RunLane) -> None:
    run = lane.run
    indent = 8 + _INDENT * lane.depth
    label = f"{run.name or 'run'} ..{run.run_id[-6:]}"
    y = canvas.y
    canvas.add(
        f'<g class="run" data-run="{run.run_id}" data-depth="{lane.depth}">'
        f'<text class="run-label" x="{indent}" y="{y + 17}">{html.escape(label)}</text>'
    )
    canvas.bar(run, y + 4, _RUN_H - 8, "run-bar", f"run {run.name} {run.run_id}")
    for mark in run.marks:
        canvas.marker(mark, y + 2, run.run_id)
    canvas.y += _RUN_H
    for index, calls in enumerate(lane.lanes):
        if index == 0 and not calls:
            continue
        y = canvas.y
        name = "model" if index == 0 else f"calls {index}"
        canvas.add(f'<text class="lane-label" x="{indent + _INDENT}" y="{y + 15}">{name}</text>')
        for call in calls:
            canvas.add(
                f'<g class="call" data-kind="{call.kind.value}" data-run="{run.run_id}" '
                f'data-call="{html.escape(str(call.attempts[0].attrs.get("call_id", "")))}" '
                f'data-name="{html.escape(call.attempts[0].name)}">'
            )
            title = _call_title(call)
            for attempt in call.attempts:
                n = attempt.attrs.get("attempt")
                canvas.bar(
                    attempt,
                    y + 3,
                    _ROW_H - 6,
                    f"bar kind-{call.kind.value}",
                    title if n is None else f"{title}, attempt {n}",
                )
            canvas.add("</g>")
            for attempt in call.attempts:
                for mark in attempt.marks:
                    canvas.marker(mark, y, run.run_id)
        canvas.y += _ROW_H
    canvas.add("</g>")
    for child in lane.children:
        _draw_run(canvas, child)


def timeline_html(
    events: Iterable[RunEvent], *, title: str | None = None, content: bool = False
) -> str:
    """The self-contained HTML timeline of `events` (any runs; each run's in seq order).

    Args:
        events: The events, e.g. `list(handle.events())` or a feed subscriber's.
        title: The page title (default: the first run's agent and id).
        content: Include message and tool content (task, arguments, results) in the details.
    """
    timeline = build(events, content=content)
    canvas = _Canvas(timeline)
    for root in timeline.roots:
        _draw_run(canvas, root)
    height = canvas.y + 10
    body = canvas.parts
    canvas.parts = []
    canvas.axis(height)
    axis = canvas.parts
    runs = timeline.runs()
    first = runs[0].run if runs else None
    heading = title or (f"{first.name} {first.run_id}" if first is not None else "no runs")
    sub = (
        f"{len(runs)} run(s), {(timeline.end - timeline.start) * 1e3:.1f} ms, "
        f"trace {first.trace_id if first is not None else '-'}"
    )
    legend = "".join(
        f'<span><i style="background:{colour}"></i>{name}</span>'
        for name, colour in _LEGEND.items()
    )
    width = _LABEL_W + _PLOT_W + 60
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>steerable timeline: {html.escape(heading)}</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>steerable timeline: {html.escape(heading)}</h1>"
        f'<div class="sub">{html.escape(sub)}</div>'
        f'<div class="legend">{legend}</div>'
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">'
        + "".join(axis)
        + "".join(body)
        + '</svg><div id="tip"></div>'
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
