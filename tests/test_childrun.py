"""`ChildRun`: a subagent's run is owned by a `ChildRun` actor linked to its parent.

Covered: a child run's actor is a `ChildRun` (a `RunSupervisor`) and a top-level run's is a
plain `RunSupervisor`; the link outlives a passivation (the woken child is a `ChildRun` again,
its result still goes up to its parent, and the parent finishes with it); cancelling the parent
reaches a running child through the link. Subagent behaviour as a whole: tests/test_subagents*.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

import steerable.actors
from steerable.actors import ChildRun, RunSupervisor, Runtime
from steerable.actors.testing import Gate, ScriptedAgent, wait_event
from steerable.protocol import (
    EventKind,
    Finish,
    Plan,
    RunState,
    RunView,
    SubagentCall,
    SubagentResult,
    ToolCall,
    ToolResult,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Wait until `predicate()` holds (checked every few ms); fail after `timeout` seconds."""
    tick = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        tick.wait(0.005)
    raise AssertionError(f"condition never held within {timeout}s")


class Caller:
    """Calls one tool on its task, then finishes with what it returned."""

    def __init__(self, tool_name: str) -> None:
        self.name = "caller"
        self.tool_name = tool_name

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(steps=[ToolCall(name=self.tool_name, arguments={"value": view.task})])
        result = view.last_results[0]
        assert isinstance(result, ToolResult)
        return Finish(output=result.value if result.ok else f"failed {result.error}")


def lead() -> ScriptedAgent:
    def report(view: RunView) -> Finish:
        (result,) = view.last_results
        assert isinstance(result, SubagentResult)
        return Finish(output=(result.state.value, result.output))

    return ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="caller", task="job")])], then=report, name="lead"
    )


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


def actor_class(rt: Runtime, run_id: str) -> type | None:
    entry = rt.directory.get(run_id)
    ref = None if entry is None else entry.ref
    return None if ref is None else ref.actor_class


def test_a_child_runs_actor_is_a_childrun_and_a_roots_is_not(gate: Gate) -> None:
    assert "ChildRun" in steerable.actors.__all__
    assert issubclass(ChildRun, RunSupervisor)
    with Runtime(tools=[gate.tool("hold")], agents={"caller": Caller("hold")}) as rt:
        root = rt.start("t", agent=lead())
        (ctx,) = gate.wait_started(1)
        child_id = ctx.run_id
        assert child_id == f"{root.run_id}-c1.0"
        assert actor_class(rt, child_id) is ChildRun
        assert actor_class(rt, root.run_id) is RunSupervisor
        gate.release()
        outcome = root.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["finished", "job"]


def test_a_woken_child_is_a_childrun_again_and_its_result_still_goes_up(gate: Gate) -> None:
    pay = gate.tool("pay", side_effect="write", requires_approval=True)
    with Runtime(tools=[pay], agents={"caller": Caller("pay")}) as rt:
        root = rt.start("t", agent=lead())
        requested = wait_event(root, EventKind.APPROVAL_REQUESTED)
        child_id = requested.run_id
        child = rt.handle(child_id)
        # The child waits for a person: it gives up its actor (the parent keeps waiting on it).
        until(lambda: rt.directory.get(child_id) is not None and actor_class(rt, child_id) is None)
        assert child.approve(requested.data["call_id"]) is True  # wakes it
        gate.wait_started(1)
        assert actor_class(rt, child_id) is ChildRun
        gate.release()
        outcome = root.result(timeout=WAIT)
        woken = rt.statistics()["runs_woken"]
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["finished", "job"]
    assert woken >= 1


def test_cancelling_the_parent_cancels_its_running_child(gate: Gate) -> None:
    with Runtime(tools=[gate.tool("hold")], agents={"caller": Caller("hold")}) as rt:
        root = rt.start("t", agent=lead())
        (ctx,) = gate.wait_started(1)
        child = rt.handle(ctx.run_id)
        assert root.cancel("stop") is True
        child_outcome = child.result(timeout=WAIT)
        outcome = root.result(timeout=WAIT)
    assert child_outcome.state is RunState.CANCELLED
    assert outcome.state is RunState.CANCELLED
