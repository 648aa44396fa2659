"""EventLog: records cheap for the collector, readers that sleep and wake, enums restored."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from pydantic import ValidationError

from steerable.actors._host.events import EventLog
from steerable.actors._observe.feed import Feed
from steerable.protocol import EventKind, Phase, RunEvent

GUARD = 10.0  # seconds: fail instead of hanging, never a synchronisation


def test_flat_events_add_nothing_the_collector_tracks() -> None:
    # A long run keeps thousands of events: each object the collector still tracks is walked
    # by every full collection (W1 flatness, W5). A flat event's history is untracked from the
    # start; an event whose data holds a container keeps only that data tracked.
    log = EventLog("t" * 32)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(1000):
        log.append("run_a", EventKind.CHECKPOINT, None, 1.0, {"revision": i})
        log.append("run_a", EventKind.TOOL_FINISHED, Phase.EXECUTE, 2.0, {"call_id": "c1.0"})
    flat = len(gc.get_objects()) - before
    nested = {"nested": [1, 2]}
    log.append("run_a", EventKind.CUSTOM, Phase.EXECUTE, 3.0, nested)
    gc.collect()
    assert flat < 100  # 2,000 events; allow for the interpreter's own objects
    assert gc.is_tracked(nested)  # holds a list: the collector must still see it
    log.close()
    assert [e.seq for e in log.stream(start=1998)] == [1998, 1999, 2000]


def test_a_bounded_history_keeps_the_newest_events_and_their_seqs() -> None:
    log = EventLog("t" * 32, max_history=3)
    for i in range(5):
        log.append("run_a", EventKind.CHECKPOINT, None, float(i), {"revision": i})
    log.close()
    assert log.first_seq == 2
    events = list(log.stream())
    assert [(e.seq, e.at, e.data) for e in events] == [
        (2, 2.0, {"revision": 2}),
        (3, 3.0, {"revision": 3}),
        (4, 4.0, {"revision": 4}),
    ]
    assert [e.seq for e in log.stream(start=3)] == [3, 4]
    assert len(log) == 5


def test_readers_get_the_enums_back() -> None:
    log = EventLog("t" * 32)
    log.append("run_a", EventKind.REASONING_STARTED, Phase.REASON, 1.0, {})
    log.append("run_a", EventKind.RUN_ENDED, None, 2.0, {"state": "finished"}, "run_p")
    log.close()
    events = list(log.stream())
    assert [(e.kind, e.phase) for e in events] == [
        (EventKind.REASONING_STARTED, Phase.REASON),
        (EventKind.RUN_ENDED, None),
    ]
    assert all(type(e.kind) is EventKind for e in events)
    assert events[1].parent_run_id == "run_p"
    assert events[1].seq == 1


def test_a_filtered_stream_ends_at_its_runs_run_ended() -> None:
    log = EventLog("t" * 32)
    log.append("run_c", EventKind.REASONING_STARTED, Phase.REASON, 1.0, {}, "run_p")
    log.append("run_c", EventKind.RUN_ENDED, None, 2.0, {}, "run_p")
    log.append("run_p", EventKind.REASONING_STARTED, Phase.REASON, 3.0, {})
    # Not closed: the child's stream must end at its own run_ended, not wait for more.
    kinds = [e.kind for e in log.stream(only="run_c", timeout=GUARD)]
    assert kinds == [EventKind.REASONING_STARTED, EventKind.RUN_ENDED]


def test_a_sleeping_reader_wakes_on_append_and_on_close() -> None:
    log = EventLog("t" * 32)
    seen: list[EventKind] = []
    sleeping = threading.Event()

    def read() -> None:
        for event in log.stream(timeout=GUARD):
            seen.append(event.kind)
            sleeping.set()

    reader = threading.Thread(target=read, name="event-log-reader")
    reader.start()
    log.append("run_a", EventKind.STATE_CHANGED, None, 1.0, {})
    assert sleeping.wait(GUARD)
    log.append("run_a", EventKind.CHECKPOINT, None, 2.0, {"revision": 0})
    log.close()
    reader.join(GUARD)
    assert not reader.is_alive()
    assert seen == [EventKind.STATE_CHANGED, EventKind.CHECKPOINT]


def test_the_feed_builds_events_with_the_enums() -> None:
    feed = Feed(name="event-log-feed")
    got: list[RunEvent] = []
    done = threading.Event()

    def subscriber(event: RunEvent) -> None:
        got.append(event)
        done.set()

    unsubscribe = feed.subscribe(subscriber)
    try:
        log = EventLog("t" * 32, feed=feed)
        log.append("run_a", EventKind.TOOL_STARTED, Phase.EXECUTE, 1.0, {"call_id": "c1.0"})
        assert done.wait(GUARD)
    finally:
        unsubscribe()
        feed.close()
    (event,) = got
    assert event.kind is EventKind.TOOL_STARTED
    assert event.phase is Phase.EXECUTE


def test_a_built_event_is_the_model_validation_would_make() -> None:
    # `to_event` skips validation (it runs on an async reader's loop): the event must still
    # be indistinguishable from a validated one, and as frozen.
    log = EventLog("t1")
    data = {"call_id": "c1", "steps": [{"tool": "noop", "arguments": {}}]}
    log.append("child", EventKind.TOOL_FINISHED, Phase.EXECUTE, 1.5, data, "parent")
    log.append("r1", EventKind.RUN_STARTED, None, 2.0, {})
    built = [log.to_event(raw) for raw in log._records(0)]
    validated = [
        RunEvent(
            run_id="child",
            trace_id="t1",
            seq=0,
            kind=EventKind.TOOL_FINISHED,
            phase=Phase.EXECUTE,
            at=1.5,
            data=data,
            parent_run_id="parent",
        ),
        RunEvent(run_id="r1", trace_id="t1", seq=1, kind=EventKind.RUN_STARTED, at=2.0),
    ]
    for event, want in zip(built, validated, strict=True):
        assert event == want
        assert repr(event) == repr(want)
        assert event.model_dump_json() == want.model_dump_json()
        assert event.model_dump() == want.model_dump()
        assert event.model_copy(update={"seq": 9}).seq == 9
    assert built[1].model_fields_set >= validated[1].model_fields_set
    with pytest.raises(ValidationError):
        built[0].seq = 5  # type: ignore[misc]


def _recorded(log: EventLog) -> list[tuple[int, EventKind, Phase | None, float, object, str]]:
    log.close()
    return [(e.seq, e.kind, e.phase, e.at, e.data, e.run_id) for e in log.stream()]


def test_a_step_appended_at_once_is_the_same_as_one_append_per_event() -> None:
    step: list[tuple[EventKind, Phase | None, dict[str, Any]]] = [
        (EventKind.PLANNING_FINISHED, Phase.PLAN, {"calls": ["c1.0"], "approvals": 0}),
        (EventKind.CHECKPOINT, None, {"revision": 3}),
        (EventKind.TOOL_STARTED, Phase.EXECUTE, {"call_id": "c1.0"}),
    ]
    one_by_one, at_once = EventLog("t" * 32, max_history=4), EventLog("t" * 32, max_history=4)
    for log in (one_by_one, at_once):
        log.append("run_a", EventKind.REASONING_FINISHED, Phase.REASON, 1.0, {})
    for kind, phase, data in step:
        one_by_one.append("run_a", kind, phase, 2.0, data, "run_p")
    at_once.append_step("run_a", 2.0, "run_p", list(step))
    at_once.append("run_a", EventKind.EXECUTE_FINISHED, Phase.EXECUTE, 3.0, {})
    one_by_one.append("run_a", EventKind.EXECUTE_FINISHED, Phase.EXECUTE, 3.0, {})
    assert len(at_once) == len(one_by_one) == 5
    assert at_once.first_seq == one_by_one.first_seq == 1  # the bound drops the oldest
    assert _recorded(at_once) == _recorded(one_by_one)


def test_a_step_wakes_a_sleeping_reader_and_the_feed_sees_each_event() -> None:
    feed = Feed(name="event-log-step-feed")
    fed: list[int] = []
    all_fed = threading.Event()

    def subscriber(event: RunEvent) -> None:
        fed.append(event.seq)
        if len(fed) == 2:
            all_fed.set()

    unsubscribe = feed.subscribe(subscriber)
    try:
        log = EventLog("t" * 32, feed=feed)
        seen: list[int] = []
        reader = threading.Thread(
            target=lambda: seen.extend(e.seq for e in log.stream(timeout=GUARD)),
            name="event-log-step-reader",
        )
        reader.start()
        log.append_step(
            "run_a",
            1.0,
            None,
            [(EventKind.CHECKPOINT, None, {"revision": 0}), (EventKind.STATE_CHANGED, None, {})],
        )
        assert all_fed.wait(GUARD)
        log.close()
        reader.join(GUARD)
        assert not reader.is_alive()
    finally:
        unsubscribe()
        feed.close()
    assert seen == [0, 1]
    assert fed == [0, 1]
