"""Durable run trees (docs/requirements.md: run trees, R3, R21): children in checkpoints; resume.

Covered: the parent's checkpoints record its children's run ids; a parent resumed in a new
process (the tree was SIGKILLed with a child and a grandchild inside a tool, via
tests/crash_drivers/subagents_driver.py) resumes the same child runs, not second ones, re-runs
their unfinished calls with their original idempotency keys, keeps a finished child's result
without running it again, and the tree finishes with exact usage; the same in process after a
shutdown that keeps runs; a resumed parent whose subagent is no longer registered gets a
typed `unknown_agent` result instead of waiting forever.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from steerable.actors import Agent, Runtime, SqliteStore, Tool, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, wait_event
from steerable.protocol import (
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunState,
    RunView,
    SubagentCall,
    SubagentResult,
    ToolCall,
)

if TYPE_CHECKING:  # mypy resolves the kit as tests.driver_kit (explicit package bases)
    from tests.driver_kit import run_driver
else:
    from driver_kit import run_driver

DRIVER = Path(__file__).parent / "crash_drivers" / "subagents_driver.py"
WAIT = 10.0  # generous fail-instead-of-hang bound


# --------------------------------------------------------------------------- the driver's world


class Worker:
    """One tool call on its task, then a report (the driver's class)."""

    def __init__(self, name: str, tool_name: str) -> None:
        self.name = name
        self.tool_name = tool_name
        self.calls = 0

    def decide(self, view: RunView) -> Plan | Finish:
        self.calls += 1
        if not view.last_results:
            return Plan(steps=[ToolCall(name=self.tool_name, arguments={"q": view.task})])
        (result,) = view.last_results
        return Finish(output=f"{view.task}: {getattr(result, 'value', None)}")


class Manager:
    name = "manager"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(steps=[SubagentCall(agent="researcher", task=f"{view.task}/deep")])
        (result,) = view.last_results
        return Finish(output=f"managed({getattr(result, 'output', None)})")


class Lead:
    name = "lead"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(
                steps=[
                    SubagentCall(agent="quick", task="q"),
                    SubagentCall(agent="researcher", task="a"),
                    SubagentCall(agent="manager", task="m"),
                ]
            )
        return Finish(output=[getattr(r, "output", None) for r in view.last_results])


class World:
    """The driver's tools and agents (same names, side effects and signatures), recording."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.looks: list[tuple[str, str, str]] = []
        world = self

        @tool(side_effect="none")
        def look(ctx: ToolContext, q: str = "") -> str:
            with world.lock:
                world.looks.append((ctx.run_id, ctx.call_id, ctx.idempotency_key))
            return f"look {q}"

        @tool(side_effect="none")
        def echo(q: str = "") -> str:
            return f"echo {q}"

        self.tools: list[Tool[Any, Any]] = [look, echo]
        self.quick = Worker("quick", "echo")
        self.agents: dict[str, Agent] = {
            "quick": self.quick,
            "researcher": Worker("researcher", "look"),
            "manager": Manager(),
        }


@dataclass
class Driven:
    """What the killed driver reported."""

    root: str = ""
    children: dict[str, tuple[str, str]] = field(default_factory=dict)
    """child run id -> (parent run id, call id)."""
    started: set[tuple[str, str, str]] = field(default_factory=set)
    """(run id, call id, idempotency key) of each tool call in flight."""


def drive(db: Path) -> Driven:
    """Run the driver until it is ready, SIGKILL it, return its report."""
    driven = Driven()

    def on_line(line: str) -> None:
        word, *rest = line.split()
        if word == "started":
            run_id, call_id, key = rest
            driven.started.add((run_id, call_id, key))
        elif word == "child":
            parent, call_id, child = rest
            driven.children[child] = (parent, call_id)
        elif word == "run":
            driven.root = rest[0]

    stderr = run_driver([str(DRIVER), str(db)], on_line)
    assert driven.root, stderr
    return driven


# --------------------------------------------------------------------------- checkpoints


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


class Researcher:
    name = "researcher"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(steps=[ToolCall(name="wait", arguments={})])
        return Finish(output=view.task)


def report(view: RunView) -> Finish:
    return Finish(output=[getattr(r, "output", None) for r in view.last_results])


def finisher() -> ScriptedAgent:
    """The lead after a restart: its plan is in the checkpoint; it only reads the results."""
    return ScriptedAgent([], then=report, name="lead")


def two_children() -> ScriptedAgent:
    return ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="researcher", task="a"),
                    SubagentCall(agent="researcher", task="b"),
                ]
            )
        ],
        then=report,
        name="lead",
    )


def test_the_parents_final_checkpoint_records_its_children(gate: Gate) -> None:
    gate.release()
    with Runtime(tools=[gate.tool("wait")], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=two_children())
        outcome = root.result(timeout=WAIT)
        stored = rt.store.load(root.run_id)
        children = {s.run_id: s for s in rt.store.runs() if s.parent_run_id == root.run_id}
    assert outcome.state is RunState.FINISHED
    results = [e for e in stored.transcript if isinstance(e, SubagentResult)]
    assert [r.call_id for r in results] == ["c1.0", "c1.1"]
    assert {r.child_run_id for r in results} == set(children)
    assert {s.state for s in children.values()} == {RunState.FINISHED}


def test_while_children_run_the_parents_checkpoint_records_their_run_ids(gate: Gate) -> None:
    with Runtime(tools=[gate.tool("wait")], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=two_children())
        running = {ctx.run_id for ctx in gate.wait_started(2)}
        snapshot = rt.store.load(root.run_id).snapshot
        gate.release()
        assert root.result(timeout=WAIT).state is RunState.FINISHED
    assert snapshot.state is RunState.RUNNING
    planned = [pc.child_run_id for pc in snapshot.plan if pc.kind == "subagent"]
    assert len(planned) == 2
    assert set(planned) == running  # a host reading the checkpoint can find the children


# --------------------------------------------------------------------------- resume


def test_a_parent_resumed_in_a_new_process_resumes_the_same_children_and_the_tree_finishes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    driven = drive(db)
    root_id = driven.root
    by_call = {where: child for child, where in driven.children.items()}
    assert len(by_call) == len(driven.children) == 4
    quick_id, researcher_id, manager_id = (by_call[root_id, f"c1.{i}"] for i in range(3))
    deep_id = by_call[manager_id, "c1.0"]
    assert {run_id for run_id, _, _ in driven.started} == {researcher_id, deep_id}
    world = World()
    with Runtime(store=SqliteStore(db), tools=world.tools, agents=world.agents) as rt:
        before = {s.run_id: s for s in rt.store.runs()}
        assert set(before) == {root_id, *driven.children}
        assert before[quick_id].state is RunState.FINISHED
        revisions = {rid: s.revision for rid, s in before.items()}
        assert set(rt.unfinished()) == {root_id, researcher_id, manager_id, deep_id}

        root = rt.resume(root_id, agent=Lead())
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        after = {s.run_id: s for s in rt.store.runs()}
        tree = rt.tree(root_id)
        metrics = {rid: rt.store.load(rid).snapshot.metrics for rid in after}
        assert rt.unfinished() == []

    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["q: echo q", "a: look a", "managed(m/deep: look m/deep)"]
    # The same runs, no second child: every run of the tree is one the driver started.
    assert set(after) == set(before)
    assert {n.run_id for n in tree.walk()} == set(before)
    assert {n.state for n in tree.walk()} == {RunState.FINISHED}
    # Each unfinished run continued from its own last revision (R3: same id, revision + 1).
    resumed = {e.run_id: e.data["resumed_from"] for e in events if e.kind is EventKind.RUN_STARTED}
    assert resumed == {rid: revisions[rid] for rid in (root_id, researcher_id, manager_id, deep_id)}
    assert after[quick_id].revision == revisions[quick_id]
    assert world.quick.calls == 0  # a finished child is not run again
    # The calls in flight at the crash ran again with their original keys, once each.
    assert sorted(world.looks) == sorted(driven.started)
    # Each resumed run counted its re-run call once, and the manager rolled up its child's.
    assert (metrics[researcher_id].steps, metrics[researcher_id].model_calls) == (1, 2)
    assert (metrics[deep_id].steps, metrics[deep_id].model_calls) == (1, 2)
    assert (metrics[manager_id].steps, metrics[manager_id].model_calls) == (1, 4)


def test_a_parent_resumed_in_process_resumes_the_same_children(tmp_path: Path, gate: Gate) -> None:
    db = tmp_path / "runs.db"
    rt = Runtime(
        store=SqliteStore(db), tools=[gate.tool("wait")], agents={"researcher": Researcher()}
    )
    try:
        root = rt.start("t", agent=two_children())
        children = {ctx.run_id: ctx.idempotency_key for ctx in gate.wait_started(2)}
        rt.store.flush()
    finally:
        rt.shutdown(timeout=0.5, cancel_runs=False)
    gate.release()
    keys: list[tuple[str, str]] = []

    @tool(side_effect="none")
    def wait(ctx: ToolContext, value: str = "") -> str:  # the gate tool's signature
        keys.append((ctx.run_id, ctx.idempotency_key))
        return "again"

    with Runtime(store=SqliteStore(db), tools=[wait], agents={"researcher": Researcher()}) as rt2:
        resumed = rt2.resume(root.run_id, agent=finisher())
        outcome = resumed.result(timeout=WAIT)
        runs = {s.run_id for s in rt2.store.runs()}
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["a", "b"]
    assert runs == {root.run_id, *children}
    assert sorted(keys) == sorted(children.items())
    assert outcome.metrics.steps == 2
    assert outcome.metrics.model_calls == 2 + 2 * 2


def test_a_resumed_parent_whose_subagent_is_gone_gets_unknown_agent_not_a_hang(
    tmp_path: Path, gate: Gate
) -> None:
    db = tmp_path / "runs.db"
    rt = Runtime(
        store=SqliteStore(db), tools=[gate.tool("wait")], agents={"researcher": Researcher()}
    )
    try:
        root = rt.start("t", agent=two_children())
        gate.wait_started(2)
        rt.store.flush()
    finally:
        rt.shutdown(timeout=0.5, cancel_runs=False)
    gate.release()
    lead = finisher()
    with Runtime(store=SqliteStore(db), tools=[gate.tool("wait")]) as rt2:
        resumed = rt2.resume(root.run_id, agent=lead, override=True)  # R22: explicitly
        try:
            outcome = resumed.result(timeout=5.0)
        except TimeoutError:
            pytest.fail(f"the resumed parent hangs: {rt2.tree(root.run_id)}")
    assert outcome.state is RunState.FINISHED
    results = lead.views[-1].last_results
    assert [r.kind for r in results] == ["subagent_result", "subagent_result"]
    for result in results:
        assert isinstance(result, SubagentResult)
        assert result.error is not None
        assert result.error.code is ErrorCode.UNKNOWN_AGENT


def interrupted_tree(db: Path, gate: Gate, **config: int) -> str:
    """A lead with a finished "quick" child and a "researcher" child inside a tool, stopped
    where it stands (a shutdown that keeps runs); returns the lead's run id."""
    quick = ScriptedAgent([], then=Finish(output="quick done"), name="quick")
    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="quick", task="q"),
                    SubagentCall(agent="researcher", task="r"),
                ]
            )
        ],
        name="lead",
    )
    agents: dict[str, Agent] = {"quick": quick, "researcher": Researcher()}
    rt = Runtime(store=SqliteStore(db), tools=[gate.tool("wait")], agents=agents)
    try:
        root = rt.start("t", agent=lead, config=RunConfig(**config))
        gate.wait_started(1)
        wait_event(root, EventKind.SUBAGENT_FINISHED, lambda e: e.data["agent"] == "quick")
        rt.store.flush()
    finally:
        rt.shutdown(timeout=0.5, cancel_runs=False)
    gate.release()
    return root.run_id


def test_a_child_that_finished_before_a_restart_still_counts_toward_the_parents_usage(
    tmp_path: Path, gate: Gate
) -> None:
    db = tmp_path / "runs.db"
    root_id = interrupted_tree(db, gate)
    agents: dict[str, Agent] = {
        "quick": ScriptedAgent([], name="quick"),
        "researcher": Researcher(),
    }
    with Runtime(store=SqliteStore(db), tools=[gate.tool("wait")], agents=agents) as rt:
        outcome = rt.resume(root_id, agent=finisher()).result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["quick done", "r"]
    # lead: 2 model calls; quick: 1; researcher: 2 and 1 step (re-run once after the restart).
    assert (outcome.metrics.steps, outcome.metrics.model_calls) == (1, 2 + 1 + 2)


def test_a_child_that_finished_before_a_restart_still_counts_toward_max_children(
    tmp_path: Path, gate: Gate
) -> None:
    db = tmp_path / "runs.db"
    root_id = interrupted_tree(db, gate, max_children=2)
    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="quick", task="one more")])], then=report, name="lead"
    )
    agents: dict[str, Agent] = {
        "quick": ScriptedAgent([], name="quick"),
        "researcher": Researcher(),
    }
    with Runtime(store=SqliteStore(db), tools=[gate.tool("wait")], agents=agents) as rt:
        outcome = rt.resume(root_id, agent=lead).result(timeout=WAIT)
        children = [s.run_id for s in rt.store.runs() if s.parent_run_id == root_id]
    assert outcome.state is RunState.FINISHED
    assert len(children) == 2  # the third child was refused
    (refused,) = lead.views[-1].last_results
    assert isinstance(refused, SubagentResult)
    assert refused.error is not None
    assert refused.error.details == {"budget": "max_children", "limit": 2}
