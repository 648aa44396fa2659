"""Lanes of a run timeline: one for the model, one per concurrent call, child runs nested.

Shared by the HTML timeline and the Chrome trace: both draw the same lanes from the same
intervals (`intervals.collect`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from steerable.protocol import RunEvent

from .intervals import Interval, IntervalKind, collect

__all__ = ["Call", "RunLane", "Timeline", "build", "outcome"]


def outcome(interval: Interval) -> str:
    """The outcome class of an interval: ok, error, cancelled, abandoned, discarded, unfinished."""
    if interval.attrs.get("abandoned"):
        return "abandoned"
    if interval.attrs.get("discarded"):
        return "discarded"
    error = interval.error
    if error is None:
        return "unfinished" if interval.attrs.get("stopped") else "ok"
    if error == "cancelled":
        return "cancelled"
    if error in ("unfinished", "runtime shutdown"):
        return "unfinished"
    return "error"


@dataclass(slots=True, eq=False)
class Call:
    """One call on a lane: a model call, a tool call (its attempts) or a subagent step."""

    kind: IntervalKind
    key: str
    attempts: list[Interval]

    @property
    def start(self) -> float:
        """When its first attempt began."""
        return self.attempts[0].start

    @property
    def end(self) -> float:
        """When its last attempt ended."""
        last = self.attempts[-1]
        return last.end if last.end is not None else last.start


@dataclass(slots=True, eq=False)
class RunLane:
    """A run: its own interval, its lanes (model first), and its child runs."""

    run: Interval
    depth: int
    lanes: list[list[Call]] = field(default_factory=list)
    children: list[RunLane] = field(default_factory=list)

    def walk(self) -> list[RunLane]:
        """This run and its descendants, depth first."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


@dataclass(slots=True, eq=False)
class Timeline:
    """Every run of some events, laid out; `start`/`end` bound everything drawn."""

    roots: list[RunLane]
    start: float
    end: float

    def runs(self) -> list[RunLane]:
        """Every run, depth first."""
        return [lane for root in self.roots for lane in root.walk()]


def _calls(intervals: list[Interval]) -> list[Call]:
    calls: dict[str, Call] = {}
    for interval in intervals:
        if interval.kind is IntervalKind.TOOL:
            key = f"{interval.run_id}/call/{interval.attrs.get('call_id')}"
        else:
            key = interval.key
        found = calls.get(key)
        if found is None:
            calls[key] = Call(interval.kind, key, [interval])
        else:
            found.attempts.append(interval)
    return list(calls.values())


def _lanes(calls: list[Call]) -> list[list[Call]]:
    model = [c for c in calls if c.kind is IntervalKind.MODEL]
    lanes: list[list[Call]] = [model]
    for call in sorted((c for c in calls if c.kind is not IntervalKind.MODEL), key=_start):
        for lane in lanes[1:]:
            if lane[-1].end <= call.start:
                lane.append(call)
                break
        else:
            lanes.append([call])
    return lanes


def _start(call: Call) -> float:
    return call.start


def build(events: Iterable[RunEvent], *, content: bool = False) -> Timeline:
    """Lay out every run of `events` (any order of runs; each run's own in seq order)."""
    intervals = collect(events, content=content)
    runs: dict[str, RunLane] = {}
    members: dict[str, list[Interval]] = {}
    roots: list[RunLane] = []
    for interval in intervals:
        if interval.kind is IntervalKind.RUN:
            owner = _owner_run(interval)
            parent = runs.get(owner.run_id) if owner is not None else None
            lane = RunLane(interval, 0 if parent is None else parent.depth + 1)
            runs[interval.run_id] = lane
            (roots if parent is None else parent.children).append(lane)
        else:
            members.setdefault(interval.run_id, []).append(interval)
    for run_id, lane in runs.items():
        lane.lanes = _lanes(_calls(members.get(run_id, [])))
    if not intervals:
        return Timeline([], 0.0, 0.0)
    start = min(i.start for i in intervals)
    end = max(i.end if i.end is not None else i.start for i in intervals)
    return Timeline(roots, start, end)


def _owner_run(interval: Interval) -> Interval | None:
    parent = interval.parent
    while parent is not None and parent.kind is not IntervalKind.RUN:
        parent = parent.parent
    return parent
