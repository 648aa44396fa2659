"""Events as JSON lines, and timelines written to files (what `steerable trace` uses)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from steerable.protocol import RunEvent

from .chrome import chrome_trace_json
from .timeline import timeline_html

__all__ = ["FORMATS", "read_events", "run_tree_events", "write_timeline"]

FORMATS = ("html", "chrome")
"""What `write_timeline` writes: the HTML timeline, or Chrome Trace Event JSON."""


def read_events(path: Path) -> Iterator[RunEvent]:
    """The events of a JSON-lines file (one `RunEvent.model_dump_json()` per line).

    Raises:
        ValueError: A line is not a `RunEvent` (its line number is in the message).
    """
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield RunEvent.model_validate_json(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a RunEvent: {exc}") from None


def run_tree_events(events: Iterable[RunEvent], run_id: str) -> list[RunEvent]:
    """The events of run `run_id` and of its subagents (recursively), in order."""
    tree = {run_id}
    out: list[RunEvent] = []
    for event in events:
        if event.parent_run_id in tree:
            tree.add(event.run_id)
        if event.run_id in tree:
            out.append(event)
    return out


def write_timeline(
    events: Iterable[RunEvent], path: Path, *, format: str = "html", content: bool = False
) -> Path:
    """Write the timeline of `events` to `path` as `format` ("html" or "chrome"); returns it.

    Raises:
        ValueError: An unknown format.
    """
    if format == "html":
        text = timeline_html(events, content=content)
    elif format == "chrome":
        text = chrome_trace_json(events, content=content)
    else:
        raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
    path.write_text(text, encoding="utf-8")
    return path
