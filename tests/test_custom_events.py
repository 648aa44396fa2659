"""Events of the tool's or agent's own: `ctx.emit(name, data)` and `view.call.event(...)`.

They arrive in order with the run's events (between the call's tool_started and its
tool_finished), marked live or stored, and never after their call is over.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from steerable.actors import Runtime, ToolContext, tool
from steerable.actors.testing import ScriptedAgent, call, plan, wait_state
from steerable.protocol import (
    AskUser,
    EventKind,
    Finish,
    Phase,
    RetryPolicy,
    RunConfig,
    RunState,
    RunView,
)

WAIT = 10.0


@tool(side_effect="none")
def crunch(n: int, ctx: ToolContext) -> str:
    for i in range(n):
        ctx.emit("progress", {"done": i + 1, "of": n})
    ctx.emit("summary", "all done", live=False)
    return "ok"


def test_a_tools_events_arrive_in_order_inside_its_call() -> None:
    with Runtime(tools=[crunch]) as rt:
        handle = rt.start("t", agent=ScriptedAgent([plan(call("crunch", n=3)), Finish(output=1)]))
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        events = list(handle.events())
    kinds = [e.kind for e in events]
    started, finished = kinds.index(EventKind.TOOL_STARTED), kinds.index(EventKind.TOOL_FINISHED)
    custom = [e for e in events if e.kind is EventKind.CUSTOM]
    assert [events.index(e) for e in custom] == list(range(started + 1, started + 5))
    assert finished == started + 5
    assert [e.data["name"] for e in custom] == ["progress"] * 3 + ["summary"]
    assert [e.data["data"] for e in custom[:3]] == [{"done": i, "of": 3} for i in (1, 2, 3)]
    assert [e.data["live"] for e in custom] == [True, True, True, False]
    call_id = events[started].data["call_id"]
    assert {e.data["call_id"] for e in custom} == {call_id}
    assert {e.data["tool"] for e in custom} == {"crunch"}
    assert {e.phase for e in custom} == {Phase.EXECUTE}


def test_an_agents_events_carry_its_model_call() -> None:
    class Chatty:
        def decide(self, view: RunView) -> Any:
            assert view.call is not None
            view.call.event("thinking", {"about": view.task})
            return Finish(output="done")

    with Runtime() as rt:
        handle = rt.start("plans", agent=Chatty())
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        (event,) = [e for e in handle.events() if e.kind is EventKind.CUSTOM]
    assert event.data == {"name": "thinking", "data": {"about": "plans"}, "model_call": 1,
                          "live": True}  # fmt: skip
    assert event.phase is Phase.REASON


def test_an_abandoned_tools_events_are_dropped() -> None:
    release = threading.Event()
    emitted = threading.Event()

    @tool(side_effect="none")
    def stuck(ctx: ToolContext) -> str:
        ctx.emit("before")
        release.wait(WAIT)
        ctx.emit("after")  # the call timed out long ago: nobody may see this
        emitted.set()
        return "late"

    agent = ScriptedAgent([plan(call("stuck")), AskUser(question="?"), Finish(output=1)])
    with Runtime(tools=[stuck]) as rt:
        handle = rt.start(
            "t", agent=agent, config=RunConfig(step_timeout=0.05, retry=RetryPolicy(max_retries=0))
        )
        wait_state(handle, RunState.WAITING, timeout=WAIT)
        release.set()
        assert emitted.wait(WAIT)
        handle.send("go on")  # told after the late event: it is handled first
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        names = [e.data["name"] for e in handle.events() if e.kind is EventKind.CUSTOM]
    assert names == ["before"]


@pytest.mark.parametrize("name", ["", None, 3])
def test_an_event_needs_a_name(name: Any) -> None:
    seen: list[BaseException] = []

    @tool(side_effect="none")
    def bad(ctx: ToolContext) -> str:
        try:
            ctx.emit(name)
        except TypeError as exc:
            seen.append(exc)
        return "ok"

    with Runtime(tools=[bad]) as rt:
        rt.start("t", agent=ScriptedAgent([plan(call("bad")), Finish(output=1)])).result(WAIT)
    assert len(seen) == 1
