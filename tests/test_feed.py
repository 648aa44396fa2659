"""The runtime-wide event feed (docs/observability.md): one consumer for every run's events.

Covered: `subscribe` sees every run's events (subagents' too) in each run's seq order, the same
events `handle.events()` gives; unsubscribing stops delivery; a subscriber that raises is logged
and neither it nor the others lose their place; `feed()` iterates sync and async and ends at
shutdown or close; no feed thread exists until something subscribes.
"""

from __future__ import annotations

import asyncio
import threading

from structlog.testing import capture_logs

from steerable.actors import Runtime, tool
from steerable.actors.testing import ScriptedAgent, call, plan
from steerable.protocol import EventKind, Plan, RunEvent, RunState, SubagentCall

WAIT = 10.0  # generous fail-instead-of-hang bound


@tool
def ping() -> str:
    """Answer."""
    return "pong"


def _agent(name: str) -> ScriptedAgent:
    return ScriptedAgent([plan(call("ping"), call("ping"))], name=name)


def _feed_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "steerable-feed"]


def test_subscribe_sees_every_runs_events_in_order_as_handles_do() -> None:
    seen: list[RunEvent] = []
    agents = {"child": ScriptedAgent([plan(call("ping"))], name="child")}
    with Runtime(tools=[ping], agents=agents) as rt:
        assert _feed_threads() == []  # nothing subscribed: no thread
        unsubscribe = rt.subscribe(seen.append)
        a = rt.start("a", agent=_agent("a"))
        parent = ScriptedAgent([Plan(steps=(SubagentCall(agent="child", task="c"),))], name="p")
        b = rt.start("b", agent=parent)
        assert a.result(WAIT).state is RunState.FINISHED
        assert b.result(WAIT).state is RunState.FINISHED
        assert rt.flush_observers(WAIT)
        unsubscribe()
        from_handles = list(a.events(timeout=WAIT)) + list(b.events(timeout=WAIT))
    by_trace: dict[str, list[RunEvent]] = {}
    for event in seen:
        by_trace.setdefault(event.trace_id, []).append(event)
    assert set(by_trace) == {a.trace_id, b.trace_id}
    for events in by_trace.values():  # a tree's events in seq order, none missing
        assert [e.seq for e in events] == list(range(len(events)))
    assert sorted(seen, key=lambda e: (e.trace_id, e.seq)) == sorted(
        from_handles, key=lambda e: (e.trace_id, e.seq)
    )
    children = {e.run_id for e in by_trace[b.trace_id] if e.parent_run_id == b.run_id}
    assert len(children) == 1


def test_unsubscribed_callbacks_get_nothing_more() -> None:
    first: list[RunEvent] = []
    with Runtime(tools=[ping]) as rt:
        unsubscribe = rt.subscribe(first.append)
        rt.start("a", agent=_agent("a")).result(WAIT)
        assert rt.flush_observers(WAIT)
        unsubscribe()
        count = len(first)
        later: list[RunEvent] = []
        rt.subscribe(later.append)
        rt.start("b", agent=_agent("b")).result(WAIT)
        assert rt.flush_observers(WAIT)
    assert count > 0
    assert len(first) == count
    assert later
    assert later[0].kind in (EventKind.STATE_CHANGED, EventKind.RUN_STARTED)


def test_a_raising_subscriber_is_logged_and_loses_nothing() -> None:
    calls: list[RunEvent] = []
    good: list[RunEvent] = []

    def bad(event: RunEvent) -> None:
        calls.append(event)
        raise RuntimeError("subscriber bug")

    with capture_logs() as logs, Runtime(tools=[ping]) as rt:
        rt.subscribe(bad)
        rt.subscribe(good.append)
        outcome = rt.start("a", agent=_agent("a")).result(WAIT)
        assert rt.flush_observers(WAIT)
    assert outcome.state is RunState.FINISHED
    assert len(calls) == len(good) > 0
    errors = [e for e in logs if e["event"] == "feed_subscriber_error"]
    assert len(errors) == len(calls)
    assert all(e["log_level"] == "error" for e in errors)


def test_feed_iterates_sync_and_ends_when_closed_or_at_shutdown() -> None:
    rt = Runtime(tools=[ping])
    try:
        stream = rt.feed(timeout=WAIT)
        handle = rt.start("a", agent=_agent("a"))
        kinds = []
        for event in stream:
            kinds.append(event.kind)
            if event.kind is EventKind.RUN_ENDED:
                break
        assert handle.result(WAIT).state is RunState.FINISHED
        assert kinds.count(EventKind.TOOL_FINISHED) == 2
        with rt.feed(timeout=WAIT) as closed:
            pass
        assert list(closed) == []  # closed: iteration ends at once
        open_at_shutdown = rt.feed(timeout=WAIT)
    finally:
        rt.shutdown()
    assert list(open_at_shutdown) == []  # the runtime's shutdown ended it
    assert _feed_threads() == []


def test_feed_iterates_async_over_every_run() -> None:
    async def main(rt: Runtime) -> list[RunEvent]:
        got: list[RunEvent] = []
        ended = 0
        stream = rt.feed()
        handles = [rt.start(name, agent=_agent(name)) for name in ("a", "b")]
        async for event in stream:
            got.append(event)
            ended += event.kind is EventKind.RUN_ENDED
            if ended == 2:
                stream.close()
        for h in handles:
            await h.wait()
        return got

    with Runtime(tools=[ping]) as rt:
        events = asyncio.run(asyncio.wait_for(main(rt), WAIT))
    assert len({e.run_id for e in events}) == 2
    assert sum(e.kind is EventKind.TOOL_STARTED for e in events) == 4
