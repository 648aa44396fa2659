"""Subagents (docs/requirements.md: run trees, R3, R7): child runs, results up, steering a child.

Covered here: a `SubagentCall` starts a child run with its own run id, its parent's run id and
trace id, and its depth; an unknown agent is a typed `unknown_agent` result, not a crash;
children's results enter the parent's transcript in step order whatever order they finish in
(and are journaled as they arrive); a child that fails, is exhausted or is cancelled gives its
parent a `subagent_failed` result with the child's state and errors while the parent goes on;
`rt.handle(child_run_id)` steers one child (send, approve, deny); children's events appear in
the parent's stream tagged with their run ids, and a child's handle streams only its own.

Budgets: tests/test_subagents_budgets.py. Cancellation and `rt.tree()`:
tests/test_subagents_cancel.py. Checkpoints and resume: tests/test_subagents_durable.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from steerable.actors import Agent, Runtime, ToolContext, tool
from steerable.actors.testing import Gate, ScriptedAgent, wait_event, wait_state
from steerable.protocol import (
    AgentError,
    ErrorCode,
    EventKind,
    Finish,
    Plan,
    RunEvent,
    RunState,
    RunView,
    SubagentCall,
    SubagentResult,
    ToolCall,
    ToolResult,
    Usage,
)

WAIT = 10.0  # generous fail-instead-of-hang bound


@tool(side_effect="none")
def echo(q: str = "") -> str:
    return f"echo {q}"


class Researcher:
    """Calls one tool on its task, then reports what it got. Safe to share between children."""

    def __init__(self, name: str = "researcher", tool_name: str = "echo") -> None:
        self.name = name
        self.tool_name = tool_name
        self._lock = threading.Lock()
        self.views: list[RunView] = []

    def decide(self, view: RunView) -> Plan | Finish:
        with self._lock:
            self.views.append(view)
        if not view.last_results:
            arguments = {"q": view.task} if self.tool_name == "echo" else {}
            return Plan(
                steps=[ToolCall(name=self.tool_name, arguments=arguments)],
                usage=Usage(input_tokens=10),
            )
        result = view.last_results[0]
        said = " ".join(m.content for m in view.transcript if m.kind == "user")
        if isinstance(result, ToolResult) and result.ok:
            return Finish(output=f"{view.task}: {result.value}{' / ' + said if said else ''}")
        error = result.error.code.value if result.error is not None else "?"
        return Finish(output=f"{view.task}: failed {error}")


class Manager:
    """Delegates its task to one researcher, then passes the report up."""

    name = "manager"

    def __init__(self) -> None:
        self.views: list[RunView] = []

    def decide(self, view: RunView) -> Plan | Finish:
        self.views.append(view)
        if not view.last_results:
            return Plan(steps=[SubagentCall(agent="researcher", task=f"{view.task}/sub")])
        result = view.last_results[0]
        assert isinstance(result, SubagentResult)
        return Finish(output=f"managed({result.output})")


def outputs(view: RunView) -> list[Any]:
    """What the latest plan's steps produced, in step order."""
    return [r.output if isinstance(r, SubagentResult) else r.value for r in view.last_results]


def started_children(events: list[RunEvent], parent: str) -> dict[str, str]:
    """call id -> child run id, from the SUBAGENT_STARTED events `parent` emitted."""
    return {
        e.data["call_id"]: e.data["child_run_id"]
        for e in events
        if e.kind is EventKind.SUBAGENT_STARTED and e.run_id == parent
    }


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.release()


# --------------------------------------------------------------------------- identity (R3)


def test_a_subagent_call_starts_a_child_run_with_its_own_id_parent_trace_and_depth() -> None:
    researcher = Researcher()
    manager = Manager()
    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="manager", task="topic")])],
        then=lambda view: Finish(output=outputs(view)),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": researcher, "manager": manager}) as rt:
        root = rt.start("big task", agent=lead)
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        assert outcome.state is RunState.FINISHED
        assert outcome.output == ["managed(topic/sub: echo topic/sub)"]

        # Every run of the tree announces itself on the root's stream, with its depth.
        starts = [e for e in events if e.kind is EventKind.RUN_STARTED]
        assert [e.data["depth"] for e in starts] == [0, 1, 2]
        root_id, child_id, grandchild_id = (e.run_id for e in starts)
        assert root_id == root.run_id
        assert len({root_id, child_id, grandchild_id}) == 3  # R3: a run id of its own
        assert [e.parent_run_id for e in starts] == [None, root_id, child_id]
        assert {e.trace_id for e in events} == {root.trace_id}  # one trace spans the tree
        assert started_children(events, root_id) == {"c1.0": child_id}
        assert started_children(events, child_id) == {"c1.0": grandchild_id}
        started = [e for e in events if e.kind is EventKind.SUBAGENT_STARTED]
        assert [(e.run_id, e.data["agent"]) for e in started] == [
            (root_id, "manager"),
            (child_id, "researcher"),
        ]

        # The store records each child with its parent, trace and depth.
        child = rt.store.load(child_id).snapshot
        grandchild = rt.store.load(grandchild_id).snapshot
        assert (child.parent_run_id, child.trace_id, child.depth) == (root_id, root.trace_id, 1)
        assert (grandchild.parent_run_id, grandchild.trace_id, grandchild.depth) == (
            child_id,
            root.trace_id,
            2,
        )
        assert (child.agent, child.task, child.state) == ("manager", "topic", RunState.FINISHED)
        assert (grandchild.agent, grandchild.task) == ("researcher", "topic/sub")
        assert rt.store.load(root_id).snapshot.parent_run_id is None

    # What each agent saw: its own run id, its depth and its parent.
    assert [(v.run_id, v.depth, v.parent_run_id) for v in lead.views] == [(root_id, 0, None)] * 2
    assert {(v.run_id, v.depth, v.parent_run_id) for v in manager.views} == {(child_id, 1, root_id)}
    assert {(v.run_id, v.depth, v.parent_run_id) for v in researcher.views} == {
        (grandchild_id, 2, child_id)
    }
    # The parent sees the child's result with the child's run id.
    (result,) = lead.views[1].last_results
    assert isinstance(result, SubagentResult)
    assert (result.call_id, result.agent, result.child_run_id) == ("c1.0", "manager", child_id)
    assert (result.state, result.ok, result.error) == (RunState.FINISHED, True, None)


def test_a_tree_stream_keeps_cause_before_effect_across_its_runs() -> None:
    # A run's events are appended when its step ends, except what another run may see first:
    # a child's first event follows its parent's subagent_started, its run_ended precedes the
    # parent's subagent_finished, and seqs follow that order.
    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="manager", task="topic")])],
        then=lambda view: Finish(output=outputs(view)),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": Researcher(), "manager": Manager()}) as rt:
        root = rt.start("big task", agent=lead)
        assert root.result(timeout=WAIT).state is RunState.FINISHED
        events = list(root.events())
    assert [e.seq for e in events] == list(range(len(events)))
    for parent in {e.run_id for e in events}:
        for started in (e for e in events if e.kind is EventKind.SUBAGENT_STARTED):
            if started.run_id != parent:
                continue
            child = started.data["child_run_id"]
            child_events = [e for e in events if e.run_id == child]
            assert child_events
            assert started.seq < child_events[0].seq
            (finished,) = (
                e
                for e in events
                if e.kind is EventKind.SUBAGENT_FINISHED and e.data["child_run_id"] == child
            )
            assert child_events[-1].kind is EventKind.RUN_ENDED
            assert child_events[-1].seq < finished.seq


def test_an_unknown_agent_is_a_typed_error_result_and_the_parent_goes_on() -> None:
    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="nobody", task="t"),
                    ToolCall(name="echo", arguments={"q": "own"}),
                ]
            )
        ],
        then=lambda view: Finish(output="went on"),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": Researcher()}) as rt:
        root = rt.start("t", agent=lead)
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
        runs = [s.run_id for s in rt.store.runs()]
    assert outcome.state is RunState.FINISHED
    assert outcome.output == "went on"
    assert outcome.metrics.steps == 1  # the parent's own tool ran
    unknown, own = lead.views[1].last_results
    assert isinstance(unknown, SubagentResult)
    assert (unknown.agent, unknown.ok, unknown.child_run_id) == ("nobody", False, "")
    assert unknown.error is not None
    assert unknown.error.code is ErrorCode.UNKNOWN_AGENT
    assert unknown.error.details["available"] == ["researcher"]
    assert "nobody" in unknown.error.message
    assert isinstance(own, ToolResult)
    assert own.value == "echo own"
    assert not [e for e in events if e.kind is EventKind.SUBAGENT_STARTED]
    assert runs == [root.run_id]  # no child run was created


# --------------------------------------------------------------------------- results up the tree


def test_results_enter_the_parent_in_step_order_though_children_finish_out_of_order(
    gate: Gate,
) -> None:
    slow = Researcher("slow", tool_name="wait")
    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="slow", task="a"),
                    ToolCall(name="echo", arguments={"q": "b"}),
                    SubagentCall(agent="researcher", task="c"),
                ]
            )
        ],
        then=lambda view: Finish(output=outputs(view)),
        name="lead",
    )
    with Runtime(
        tools=[echo, gate.tool("wait")], agents={"slow": slow, "researcher": Researcher()}
    ) as rt:
        root = rt.start("t", agent=lead)
        fast = wait_event(root, EventKind.SUBAGENT_FINISHED, lambda e: e.data["call_id"] == "c1.2")
        wait_event(root, EventKind.TOOL_FINISHED, lambda e: e.data["call_id"] == "c1.1")
        gate.wait_started(1)
        # Results enter the parent's (durable) inbox as they arrive, before the plan is done.
        journal = rt.store.load(root.run_id).journal
        assert sorted(journal) == ["c1.1", "c1.2"]
        assert isinstance(journal["c1.2"], SubagentResult)
        assert journal["c1.2"].child_run_id == fast.data["child_run_id"]
        assert lead.calls == 1  # the agent waits for the whole plan
        gate.release()
        outcome = root.result(timeout=WAIT)
        events = list(root.events())
    assert outcome.state is RunState.FINISHED
    assert outcome.output == ["a: released", "echo b", "c: echo c"]
    assert [r.call_id for r in lead.views[1].last_results] == ["c1.0", "c1.1", "c1.2"]
    finished = [e.data["call_id"] for e in events if e.kind is EventKind.SUBAGENT_FINISHED]
    assert finished == ["c1.2", "c1.0"]  # they really finished out of order
    # The transcript holds them in step order right after the decision that asked for them.
    kinds = [(e.kind, getattr(e, "call_id", None)) for e in lead.views[1].transcript]
    assert kinds == [
        ("decision", None),
        ("subagent_result", "c1.0"),
        ("tool_result", "c1.1"),
        ("subagent_result", "c1.2"),
    ]


def test_a_failed_an_exhausted_and_a_cancelled_child_give_subagent_failed_and_the_parent_goes_on(
    gate: Gate,
) -> None:
    class Crasher:
        name = "crasher"

        def decide(self, view: RunView) -> Plan:
            raise RuntimeError("model blew up")

    class Spender:
        name = "spender"

        def decide(self, view: RunView) -> Plan:
            return Plan(steps=[ToolCall(name="echo", arguments={"q": str(i)}) for i in range(3)])

    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="crasher", task="crash"),
                    SubagentCall(agent="spender", task="spend", max_steps=2),
                    SubagentCall(agent="victim", task="be cancelled"),
                    SubagentCall(agent="researcher", task="fine"),
                    ToolCall(name="echo", arguments={"q": "own"}),
                ]
            )
        ],
        then=lambda view: Finish(output=[r.ok for r in view.last_results]),
        name="lead",
    )
    agents: dict[str, Agent] = {
        "crasher": Crasher(),
        "spender": Spender(),
        "victim": Researcher("victim", tool_name="wait"),
        "researcher": Researcher(),
    }
    with Runtime(tools=[echo, gate.tool("wait")], agents=agents) as rt:
        root = rt.start("t", agent=lead)
        started = wait_event(
            root, EventKind.SUBAGENT_STARTED, lambda e: e.data["agent"] == "victim"
        )
        gate.wait_started(1)
        victim = rt.handle(started.data["child_run_id"])
        assert victim.parent_run_id == root.run_id
        assert victim.cancel("the host changed its mind") is True
        assert victim.result(timeout=WAIT).state is RunState.CANCELLED
        outcome = root.result(timeout=WAIT)
    # R7: the parent goes on and finishes; only the healthy child and its own tool succeeded.
    assert outcome.state is RunState.FINISHED
    assert outcome.output == [False, False, False, True, True]
    crash, spend, cancel, fine, own = lead.views[1].last_results
    assert isinstance(crash, SubagentResult)
    assert isinstance(spend, SubagentResult)
    assert isinstance(cancel, SubagentResult)
    assert isinstance(fine, SubagentResult)
    assert fine.output == "fine: echo fine"
    assert isinstance(own, ToolResult)
    assert own.ok

    def child_errors(error: AgentError | None) -> list[str]:
        assert error is not None
        return [e["code"] for e in error.details["errors"]]

    for result, state, codes in [
        (crash, RunState.ERROR, ["handler_error"]),
        (spend, RunState.EXHAUSTED, ["budget_exhausted"]),
        (cancel, RunState.CANCELLED, ["cancelled", "cancelled"]),  # its call's, then its own
    ]:
        assert (result.ok, result.state, result.output) == (False, state, None)
        assert result.error is not None
        assert result.error.code is ErrorCode.SUBAGENT_FAILED, result
        assert result.error.details["state"] == state.value
        assert result.error.details["child_run_id"] == result.child_run_id != ""
        assert child_errors(result.error) == codes
    assert spend.error is not None
    assert spend.error.details["errors"][0]["details"]["budget"] == "max_steps"
    # The spender's three steps would overshoot its reservation of two: none ran. The steps
    # are the parent's own, the healthy child's and the victim's (a cancelled call counts).
    assert outcome.metrics.steps == 3


# --------------------------------------------------------------------------- steering a child


def test_a_child_handle_sends_to_the_child_and_streams_only_its_own_events(gate: Gate) -> None:
    researcher = Researcher(tool_name="wait")
    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="researcher", task="topic")])],
        then=lambda view: Finish(output=outputs(view)),
        name="lead",
    )
    with Runtime(tools=[gate.tool("wait")], agents={"researcher": researcher}) as rt:
        root = rt.start("t", agent=lead)
        started = wait_event(root, EventKind.SUBAGENT_STARTED)
        child = rt.handle(started.data["child_run_id"])
        assert (child.parent_run_id, child.trace_id) == (root.run_id, root.trace_id)
        assert child.run_id != root.run_id
        gate.wait_started(1)
        assert child.state is RunState.RUNNING
        assert child.send("focus on the CLI") == 0  # the child's own inbox, from seq 0
        wait_event(child, EventKind.MESSAGE_ACCEPTED)
        gate.release()
        child_outcome = child.result(timeout=WAIT)
        outcome = root.result(timeout=WAIT)
        child_events = list(child.events())
        root_events = list(root.events())
    assert child_outcome.state is RunState.FINISHED
    assert outcome.output == ["topic: released / focus on the CLI"]
    assert [m.content for m in researcher.views[1].delivered] == ["focus on the CLI"]
    assert not lead.views[1].delivered  # the parent's inbox was not touched

    # The child's handle streams only the child's events, ending with its run_ended.
    assert {e.run_id for e in child_events} == {child.run_id}
    assert child_events[0].kind is EventKind.STATE_CHANGED
    assert child_events[-1].kind is EventKind.RUN_ENDED
    assert {e.parent_run_id for e in child_events} == {root.run_id}
    # The root's stream has both, each tagged with its run id, in one seq order.
    assert {e.run_id for e in root_events} == {root.run_id, child.run_id}
    assert [e.seq for e in root_events] == sorted(e.seq for e in root_events)
    from_child = [e for e in root_events if e.run_id == child.run_id]
    assert [(e.seq, e.kind) for e in from_child] == [(e.seq, e.kind) for e in child_events]
    kinds = [e.kind for e in from_child]
    assert EventKind.MESSAGE_DELIVERED in kinds
    assert EventKind.TOOL_FINISHED in kinds
    assert root_events[-1].run_id == root.run_id
    assert root_events[-1].kind is EventKind.RUN_ENDED


@pytest.mark.parametrize("approved", [True, False])
def test_an_approval_requested_inside_a_child_reaches_the_host(approved: bool) -> None:
    published: list[tuple[str, str]] = []

    @tool(side_effect="write", requires_approval=True)
    def publish(text: str, ctx: ToolContext) -> str:
        published.append((ctx.run_id, text))
        return f"published {text}"

    class Writer:
        name = "writer"

        def decide(self, view: RunView) -> Plan | Finish:
            if not view.last_results:
                return Plan(steps=[ToolCall(name="publish", arguments={"text": view.task})])
            result = view.last_results[0]
            assert isinstance(result, ToolResult)
            return Finish(
                output=result.value if result.ok else str(result.error and result.error.code)
            )

    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="writer", task="post")])],
        then=lambda view: Finish(output=outputs(view)),
        name="lead",
    )
    with Runtime(tools=[publish], agents={"writer": Writer()}) as rt:
        root = rt.start("t", agent=lead)
        # The host holding the root's handle sees the child's request on the root's stream...
        requested = wait_event(root, EventKind.APPROVAL_REQUESTED)
        child_id = requested.run_id
        assert requested.parent_run_id == root.run_id
        assert requested.data["tool"] == "publish"
        assert requested.data["arguments"] == {"text": "post"}
        # ... and settles it through the child's handle.
        child = rt.handle(child_id)
        wait_state(child, RunState.WAITING)
        (request,) = child.pending_approvals()
        assert (request.call_id, request.tool, request.run_id) == (
            requested.data["call_id"],
            "publish",
            child_id,
        )
        assert root.state is RunState.RUNNING  # the parent waits for its child, not for a person
        if approved:
            assert child.approve(request.call_id) is True
        else:
            assert child.deny(request.call_id, reason="not today") is True
        assert child.approve(request.call_id) is False  # settled once
        outcome = root.result(timeout=WAIT)
    assert outcome.state is RunState.FINISHED
    if approved:
        assert published == [(child_id, "post")]
        assert outcome.output == ["published post"]
    else:
        assert published == []
        assert outcome.output == [ErrorCode.APPROVAL_DENIED.value]


def test_the_parent_records_each_childs_run_id_and_final_revision() -> None:
    # Issue: "the parent's checkpoint records its children and their revisions".
    lead = ScriptedAgent(
        [
            Plan(
                steps=[
                    SubagentCall(agent="researcher", task="a"),
                    SubagentCall(agent="researcher", task="b"),
                ]
            )
        ],
        then=Finish(output="done"),
        name="lead",
    )
    with Runtime(tools=[echo], agents={"researcher": Researcher()}) as rt:
        handle = rt.start("t", agent=lead)
        assert handle.result(timeout=WAIT).state is RunState.FINISHED
        planned = rt.store.load(handle.run_id, 1).snapshot.plan  # the plan's checkpoint
        assert [c.child_run_id for c in planned] == [
            f"{handle.run_id}-c1.0",
            f"{handle.run_id}-c1.1",
        ]
        results = [e for e in rt.replay(handle.run_id).transcript if isinstance(e, SubagentResult)]
        assert len(results) == 2
        for result in results:
            final = rt.store.revisions(result.child_run_id)[-1]
            assert final.state is RunState.FINISHED
            assert result.child_revision == final.revision
            # The pair pins the child at the parent's revision: replay it read-only.
            assert rt.replay(result.child_run_id, result.child_revision).outcome is not None


@tool(side_effect="none")
def extra(q: str = "") -> str:
    return f"extra {q}"


def test_a_childs_capabilities_are_the_tools_it_really_has() -> None:
    # Issue 10, defect 2: a parent started with per-run tools passes them to its children; the
    # child's checkpoint must list those tools (a resume of the child checks that set), not
    # only the runtime's.
    lead = ScriptedAgent(
        [Plan(steps=[SubagentCall(agent="researcher", task="a")])],
        then=lambda view: Finish(output=outputs(view)),
        name="lead",
    )
    researcher = Researcher(tool_name="extra")
    with Runtime(tools=[echo], agents={"researcher": researcher}) as rt:
        handle = rt.start("t", agent=lead, tools=[extra])
        outcome = handle.result(timeout=WAIT)
        assert outcome.state is RunState.FINISHED
        assert outcome.output == ["a: extra "]  # the child called the parent's per-run tool
        child_id = f"{handle.run_id}-c1.0"
        parent_tools = rt.store.load(handle.run_id).snapshot.capabilities.tools
        child_tools = rt.store.load(child_id).snapshot.capabilities.tools
        assert sorted(child_tools) == ["echo", "extra"]
        assert child_tools == parent_tools
