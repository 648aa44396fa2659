"""Subagent budgets (docs/requirements.md "Run trees"; docs/contract.md "Budgets at the edge").

Covered: before a child starts, its tool steps, model calls, tokens and deadline are reserved
from what its parent has left (checked exactly, in the SUBAGENT_STARTED event and in the child's
stored `RunConfig`); explicit `SubagentCall` budgets are taken first and the rest is shared;
children spending greedily in parallel never overshoot the parent together; what a child did not
use returns to the parent; usage (steps, model calls, tokens) rolls up exactly, through a
three-level tree with ten parallel children at one level; a plan whose children cannot get a
share is not run at all; `max_depth` and `max_children` give clear `budget_exhausted` results.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from steerable.actors import ManualClock, Runtime, tool
from steerable.actors.testing import Gate, ScriptedAgent
from steerable.protocol import (
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunConfig,
    RunEvent,
    RunState,
    RunView,
    SubagentCall,
    SubagentResult,
    ToolCall,
    Usage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


@tool(side_effect="none")
def echo(q: str = "") -> str:
    return f"echo {q}"


class Researcher:
    """One tool step, then a report: 1 step, 2 model calls, 10 + 5 input tokens."""

    name = "researcher"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(
                steps=[ToolCall(name="echo", arguments={"q": view.task})],
                usage=Usage(input_tokens=10, output_tokens=1),
            )
        return Finish(output=view.task, usage=Usage(input_tokens=5))


class Greedy:
    """Never finishes: one tool step per model call until a budget stops it."""

    name = "greedy"

    def decide(self, view: RunView) -> Plan:
        return Plan(steps=[ToolCall(name="echo", arguments={"q": str(view.steps)})])


def sub(agent: str = "researcher", task: str = "t", **budgets: Any) -> SubagentCall:
    return SubagentCall(agent=agent, task=task, **budgets)


def started(events: list[RunEvent], parent: str | None = None) -> list[dict[str, Any]]:
    """The data of SUBAGENT_STARTED events (of `parent` only, if given)."""
    return [
        e.data
        for e in events
        if e.kind is EventKind.SUBAGENT_STARTED and (parent is None or e.run_id == parent)
    ]


def last_results(agent: ScriptedAgent, call: int) -> list[SubagentResult]:
    return [r for r in agent.views[call].last_results if isinstance(r, SubagentResult)]


# --------------------------------------------------------------------------- reservation


def test_a_childs_budgets_are_reserved_from_what_the_parent_has_left() -> None:
    clock = ManualClock()

    def first(view: RunView) -> Plan:
        clock.advance(15.0)  # the model call took 15 s of the parent's 60
        return Plan(
            steps=[
                ToolCall(name="echo", arguments={"q": "1"}),
                ToolCall(name="echo", arguments={"q": "2"}),
                sub(task="a"),
                sub(task="b"),
            ],
            usage=Usage(input_tokens=100),
        )

    lead = ScriptedAgent(
        [first], then=Finish(output="done", usage=Usage(input_tokens=1)), name="lead"
    )
    config = RunConfig(max_steps=10, max_model_calls=10, token_budget=1000, total_timeout=60.0)
    with Runtime(tools=[echo], agents={"researcher": Researcher()}, clock=clock) as rt:
        root = rt.start("t", agent=lead, config=config)
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        children = {d["child_run_id"]: d for d in started(events)}
        snapshots = {rid: rt.store.load(rid).snapshot for rid in children}
    assert outcome.state is RunState.FINISHED
    # Steps: (10 - 0 used - 2 of this plan) // 2 children. Model calls: the parent keeps one
    # to read the results: (10 - 1 used - 1 kept) // 2. Tokens: (1000 - 100 used) // 2.
    # Deadline: what is left of the parent's 60 s.
    assert [(d["call_id"], d["max_steps"], d["max_model_calls"]) for d in started(events)] == [
        ("c1.2", 4, 4),
        ("c1.3", 4, 4),
    ]
    for snap in snapshots.values():
        assert snap.config.max_steps == 4
        assert snap.config.max_model_calls == 4
        assert snap.config.token_budget == 450
        assert snap.config.total_timeout == 45.0
        assert snap.config.max_depth == config.max_depth  # limits are inherited
        assert snap.state is RunState.FINISHED
        assert (snap.metrics.steps, snap.metrics.model_calls) == (1, 2)
        assert (snap.metrics.input_tokens, snap.metrics.output_tokens) == (15, 1)
    # Usage rolls up exactly: the parent's own plus every child's.
    assert outcome.metrics.steps == 2 + 1 + 1
    assert outcome.metrics.model_calls == 2 + 2 + 2
    assert outcome.metrics.input_tokens == 100 + 1 + 15 + 15
    assert outcome.metrics.output_tokens == 1 + 1
    view = lead.views[1]
    assert (view.steps, view.model_calls) == (4, 5)
    assert view.usage.total == 100 + 2 * 16
    assert view.budgets.steps_left == 6
    assert view.budgets.tokens_left == 1000 - 132


def test_explicit_child_budgets_are_taken_first_and_the_rest_is_shared() -> None:
    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    ToolCall(name="echo", arguments={}),
                    sub(task="explicit", max_steps=3, max_model_calls=2),
                    sub(task="implicit"),
                ]
            )
        ],
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=lead, config=RunConfig(max_steps=10, max_model_calls=10))
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        configs = [rt.store.load(d["child_run_id"]).snapshot.config for d in started(events)]
    assert outcome.state is RunState.FINISHED
    # Steps: 10 - 1 (the tool) - 3 (explicit) = 6. Model calls: 10 - 1 - 1 (kept) - 2 = 6.
    assert [(d["max_steps"], d["max_model_calls"]) for d in started(events)] == [(3, 2), (6, 6)]
    assert [(c.max_steps, c.max_model_calls) for c in configs] == [(3, 2), (6, 6)]


# --------------------------------------------------------------------------- never overshoot


def test_parallel_children_spending_steps_greedily_never_overshoot_the_parent() -> None:
    lead = ScriptedAgent(
        [Plan(steps=[sub("greedy", "a"), sub("greedy", "b")])],
        then=lambda view: Finish(output=view.budgets.steps_left),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"greedy": Greedy()}) as rt:
        root = rt.start("t", agent=lead, config=RunConfig(max_steps=10, max_model_calls=20))
        outcome = root.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == 0
    assert outcome.metrics.steps == 10  # exactly the parent's budget, never more
    # Each child: 5 one-step plans, then a sixth plan it had no step left for.
    assert outcome.metrics.model_calls == 2 + 2 * 6
    for result in last_results(lead, 1):
        assert result.state is RunState.EXHAUSTED
        assert result.error is not None
        assert result.error.code is ErrorCode.SUBAGENT_FAILED
        (cause,) = result.error.details["errors"]
        assert cause["code"] == "budget_exhausted"
        assert cause["details"]["budget"] == "max_steps"
        assert cause["details"]["limit"] == 5


def test_parallel_children_spending_model_calls_greedily_leave_the_parent_its_last_call() -> None:
    lead = ScriptedAgent(
        [Plan(steps=[sub("greedy", "a"), sub("greedy", "b")])],
        then=lambda view: Finish(output=view.budgets.model_calls_left),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"greedy": Greedy()}) as rt:
        root = rt.start("t", agent=lead, config=RunConfig(max_steps=100, max_model_calls=10))
        outcome = root.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    assert outcome.output == 1  # the call the parent kept to read its children's results
    assert outcome.metrics.model_calls == 10  # 2 of its own + 2 children x (10 - 2) // 2
    assert outcome.metrics.steps == 2 * 4
    for result in last_results(lead, 1):
        assert result.state is RunState.EXHAUSTED
        assert result.error is not None
        (cause,) = result.error.details["errors"]
        assert cause["details"]["budget"] == "max_model_calls"
        assert cause["details"]["limit"] == 4


def test_budget_a_child_did_not_use_returns_to_the_parent() -> None:
    lead = ScriptedAgent(
        [
            Plan(steps=[sub(task="a"), sub(task="b")]),
            # 8 steps: more than the parent could run if the children's unused 2 x 4 were lost.
            Plan(steps=[ToolCall(name="echo", arguments={"q": str(i)}) for i in range(8)]),
        ],
        then=Finish(output="done"),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=lead, config=RunConfig(max_steps=10, max_model_calls=10))
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
    assert [d["max_steps"] for d in started(events)] == [5, 5]
    after_children = lead.views[1]
    assert after_children.steps == 2
    assert after_children.budgets.steps_left == 8
    assert after_children.budgets.model_calls_left == 10 - (1 + 2 * 2)  # this one included
    assert outcome.state is RunState.FINISHED
    assert outcome.metrics.steps == 10
    assert outcome.metrics.model_calls == 3 + 2 * 2


@pytest.mark.parametrize(
    ("steps", "config", "budget"),
    [
        # An explicit reservation larger than what is left.
        (
            [sub(task="big", max_steps=10), ToolCall(name="echo", arguments={})],
            RunConfig(max_steps=10),
            "max_steps",
        ),
        # Three children cannot share the one model call the parent can spare.
        (
            [sub(task="a"), sub(task="b"), sub(task="c")],
            RunConfig(max_model_calls=3),
            "max_model_calls",
        ),
    ],
)
def test_a_plan_whose_children_cannot_get_a_share_is_not_run_at_all(
    steps: list[ToolCall | SubagentCall], config: RunConfig, budget: str
) -> None:
    lead = ScriptedAgent([Plan(steps=steps)], name="lead")
    with Runtime(tools=[echo], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=lead, config=config)
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        runs = [s.run_id for s in rt.store.runs()]
    assert outcome.state is RunState.EXHAUSTED
    (error,) = outcome.errors
    assert error.code is ErrorCode.BUDGET_EXHAUSTED
    assert error.details["budget"] == budget
    assert outcome.metrics.steps == 0  # no half-run plans: the tool did not run either
    assert not started(events)
    assert runs == [root.run_id]


# --------------------------------------------------------------------------- depth and count


class Deep:
    """Starts one copy of itself, then reports what happened below."""

    name = "deep"

    def decide(self, view: RunView) -> Plan | Finish:
        if not view.last_results:
            return Plan(steps=[sub("deep", f"level {view.depth + 1}")])
        (result,) = view.last_results
        assert isinstance(result, SubagentResult)
        if result.ok:
            return Finish(output=[view.depth, *result.output])
        assert result.error is not None
        details = result.error.details
        return Finish(
            output=[view.depth, result.error.code.value, details["budget"], details["limit"]]
        )


@pytest.mark.parametrize("max_depth", [0, 1, 2])
def test_max_depth_refuses_a_deeper_child_with_a_clear_error_and_the_run_goes_on(
    max_depth: int,
) -> None:
    with Runtime(agents={"deep": Deep()}) as rt:
        root = rt.start("t", agent=Deep(), config=RunConfig(max_depth=max_depth))
        outcome = root.result(timeout=WAIT)
        runs = rt.store.runs()
    assert outcome.state is RunState.FINISHED
    # Every run down to max_depth finished; the one below was refused.
    assert outcome.output == [*range(max_depth + 1), "budget_exhausted", "max_depth", max_depth]
    assert len(runs) == max_depth + 1
    assert all(r.state is RunState.FINISHED for r in runs)


def test_max_children_counts_every_child_a_run_starts() -> None:
    lead = ScriptedAgent(
        [
            Plan(steps=[sub(task="a"), sub(task="b"), sub(task="c")]),
            Plan(steps=[sub(task="d")]),
        ],
        then=Finish(output="done"),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=lead, config=RunConfig(max_children=2))
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        children = [s.run_id for s in rt.store.runs() if s.parent_run_id == root.run_id]
    assert outcome.state is RunState.FINISHED
    assert [d["call_id"] for d in started(events)] == ["c1.0", "c1.1"]
    assert len(children) == 2
    first = last_results(lead, 1)
    assert [r.ok for r in first] == [True, True, False]
    (second,) = last_results(lead, 2)
    for refused in (first[2], second):
        assert refused.child_run_id == ""
        assert refused.error is not None
        assert refused.error.code is ErrorCode.BUDGET_EXHAUSTED
        assert refused.error.details == {"budget": "max_children", "limit": 2}
        assert "at most 2 subagents" in refused.error.message


# --------------------------------------------------------------------------- a wide tree


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


class Node:
    """Fans out by depth (`fanout[depth]` children), and calls the gated tool at the leaves."""

    name = "node"

    def __init__(self, fanout: list[int]) -> None:
        self.fanout = fanout

    def decide(self, view: RunView) -> Plan | Finish:
        usage = Usage(input_tokens=1, output_tokens=2)
        if view.last_results:
            return Finish(output=len(view.last_results), usage=usage)
        if view.depth < len(self.fanout):
            return Plan(
                steps=[sub("node", f"{view.task}.{i}") for i in range(self.fanout[view.depth])],
                usage=usage,
            )
        return Plan(steps=[ToolCall(name="leaf", arguments={})], usage=usage)


def test_usage_rolls_up_exactly_through_a_three_level_tree_with_ten_parallel_children(
    gate: Gate,
) -> None:
    config = RunConfig(max_steps=40, max_model_calls=200, max_parallel_tools=16)
    with Runtime(tools=[gate.tool("leaf")], agents={"node": Node([2, 10])}) as rt:
        root = rt.start("r", agent=Node([2, 10]), config=config)
        gate.wait_started(20)  # all 20 leaves are inside their tool at once
        gate.release()
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        mids = started(events, root.run_id)
        leaves = [d for d in started(events) if d not in mids]
        summaries = {s.run_id: s for s in rt.store.runs()}
        mid_metrics = [rt.store.load(d["child_run_id"]).snapshot.metrics for d in mids]
    assert outcome.state is RunState.FINISHED
    assert len(summaries) == 1 + 2 + 20
    assert all(s.state is RunState.FINISHED for s in summaries.values())
    # Reservations: mids (40 // 2, (200 - 2) // 2); leaves (20 // 10, (99 - 2) // 10).
    assert {(d["max_steps"], d["max_model_calls"]) for d in mids} == {(20, 99)}
    assert {(d["max_steps"], d["max_model_calls"]) for d in leaves} == {(2, 9)}
    assert len(leaves) == 20
    # Each leaf: 1 step, 2 model calls. Each mid: 2 model calls + 10 leaves.
    assert [(m.steps, m.model_calls) for m in mid_metrics] == [(10, 22), (10, 22)]
    assert outcome.metrics.steps == 20
    assert outcome.metrics.model_calls == 2 + 2 * 2 + 20 * 2
    assert outcome.metrics.input_tokens == 46
    assert outcome.metrics.output_tokens == 2 * 46
