"""A finished run is freed by reference counting: nothing of it waits for the cyclic collector
(docs/performance.md, "A finished run is not a cycle").

Each case runs its scenario once to warm the process's caches, then again with the collector
saving what it finds (`gc.DEBUG_SAVEALL`); the runtime is shut down first, so every run's actor
has stopped, and what a collection then finds of a run's supervisor, machine, parts or
transcript would have waited for a full collection. The cases cover the ways a run ends and
rests: finishing after tool calls, a tool that raises, an agent that returns garbage, a
cancellation while a tool runs, a parked approval on a durable store (the run passivated and
woken), steering, and a subagent.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Runtime, SqliteStore, ToolContext, tool
from steerable.actors._host.cell import RunCell
from steerable.actors._host.supervisor import RunSupervisor
from steerable.actors._machine.execute import Execution
from steerable.actors._machine.machine import RunMachine
from steerable.actors._machine.persist import Persistence
from steerable.actors._machine.reasoning import Reasoning
from steerable.actors._machine.stopping import Stopping
from steerable.actors.testing import ScriptedAgent, wait_event
from steerable.protocol import (
    EventKind,
    Finish,
    Plan,
    RunState,
    RunView,
    SubagentCall,
    ToolCall,
    ToolResult,
)

if TYPE_CHECKING:  # mypy resolves the kits as tests.* (explicit package bases)
    from tests.store_faults_kit import until
else:  # pytest puts tests/ on sys.path (rootdir "prepend" import mode)
    from store_faults_kit import until

WAIT = 10.0  # generous fail-instead-of-hang bound

_A_RUNS_PARTS = (
    RunSupervisor,
    RunCell,
    RunMachine,
    Reasoning,
    Execution,
    Stopping,
    Persistence,
    ToolResult,
)


@tool(side_effect="none")
def echo(text: str = "") -> str:
    return text.upper()


@tool(side_effect="none")
def broken() -> str:
    raise RuntimeError("the tool failed")


@tool(side_effect="none")
def slow(ctx: ToolContext) -> str:
    ctx.wait(WAIT)
    return "slept"


@tool(side_effect="write", requires_approval=True)
def pay(amount: int) -> str:
    return f"paid {amount}"


def _call(name: str, **arguments: object) -> Plan:
    return Plan(steps=(ToolCall(name=name, arguments=arguments),))


def finishing(rt: Runtime) -> None:
    agent = ScriptedAgent([_call("echo", text="a"), _call("echo", text="b"), Finish(output="ok")])
    assert rt.start("t", agent=agent).result(WAIT).state is RunState.FINISHED


def a_tool_raises(rt: Runtime) -> None:
    agent = ScriptedAgent([_call("broken"), Finish(output="ok")])
    assert rt.start("t", agent=agent).result(WAIT).state is RunState.FINISHED


class _Garbage:
    def decide(self, view: RunView) -> Any:
        return 42


def the_agent_returns_garbage(rt: Runtime) -> None:
    assert rt.start("t", agent=_Garbage()).result(WAIT).state is RunState.ERROR


def cancelled_while_a_tool_runs(rt: Runtime) -> None:
    handle = rt.start("t", agent=ScriptedAgent([_call("slow"), Finish(output="no")]))
    wait_event(handle, EventKind.TOOL_STARTED, timeout=WAIT)
    assert handle.cancel("stop")
    assert handle.result(WAIT).state is RunState.CANCELLED


def approved_after_a_rest_and_steered(rt: Runtime) -> None:
    agent = ScriptedAgent([_call("pay", amount=3), _call("echo", text="c"), Finish(output="ok")])
    handle = rt.start("t", agent=agent)
    request = wait_event(handle, EventKind.APPROVAL_REQUESTED, timeout=WAIT)
    until(lambda: rt.statistics()["runs_passivated"] == 1, "passivated")  # woken below
    handle.send("and then this")
    assert handle.approve(request.data["call_id"])
    assert handle.result(WAIT).state is RunState.FINISHED


def with_a_subagent(rt: Runtime) -> None:
    parent = ScriptedAgent(
        [Plan(steps=(SubagentCall(agent="helper", task="sub"),)), Finish(output="ok")]
    )
    assert rt.start("t", agent=parent).result(WAIT).state is RunState.FINISHED


@pytest.mark.parametrize(
    "scenario",
    [
        finishing,
        a_tool_raises,
        the_agent_returns_garbage,
        cancelled_while_a_tool_runs,
        approved_after_a_rest_and_steered,
        with_a_subagent,
    ],
)
def test_a_finished_run_leaves_nothing_for_the_collector(
    scenario: Callable[[Runtime], None], tmp_path: Path
) -> None:
    def runtime(db: str) -> Runtime:
        helper = ScriptedAgent([_call("echo", text="s"), Finish(output="done")], name="helper")
        return Runtime(
            tools=[echo, broken, slow, pay],
            store=SqliteStore(tmp_path / db),
            agents={"helper": helper},
        )

    with runtime("warm.db") as warm:
        scenario(warm)
    del warm  # a runtime's own parts are a cycle: collected here, not in the window below
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        with runtime("runs.db") as rt:
            scenario(rt)
        gc.collect()  # `rt` is still held: only what its runs left is garbage
        left = Counter(type(o).__name__ for o in gc.garbage if isinstance(o, _A_RUNS_PARTS))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, f"left for the collector: {dict(left)}"
